"""Operator controls applied to the assignment's inputs: pins, step-downs, the leader.

Pure: the controls (as read from the ``controls#<app>`` item), the live members, the shard lists
and a time passed in. Every member applies the same controls to the same inputs and so derives
the same leader and the same shards, without talking to the others.

- **Pins.** ``pins[(stream, shard)] = client``: the shard leaves the automatic assignment and
  goes to ``client`` -- when ``client`` is live and subscribed to the stream. A pin to a member
  that is dead (or does not consume the stream) *falls back*: the shard stays in the automatic
  assignment and :func:`split_pins` names the pin, for the caller to log. A pinned shard that is
  not an active shard (finished, or not listed) is ignored.
- **Step-downs.** ``step_downs[client] = StepDown(until_ms, drain)``: until ``until_ms`` the
  member is not a leader candidate; with ``drain`` it also leaves the automatic assignment (it
  keeps the shards pinned to it: a pin is the operator's explicit word). It keeps heartbeating.
  When every live member stepped down, nobody is excluded from leading; a drained member keeps
  the streams no member that is not drained consumes (someone must read them).
- **The leader** is index 0 of the sorted live ids that did not step down.

Worked example: live ``a, b, c``; stream ``s`` with ``s0..s3``; pins ``s1 -> c``, ``s2 -> z``
(dead); ``a`` stepped down with drain. The leader is ``b``. ``s1`` goes to ``c``; the pin to
``z`` falls back, so ``s0, s2, s3`` are split between ``b`` and ``c`` by the group's mode.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from .assignment import Assignment

#: (stream, shard id) -> the client id the operator pinned it to.
Pins = Mapping[tuple[str, str], str]


@dataclass(frozen=True)
class StepDown:
    """A member stepped down until ``until_ms``; ``drain``: from its shards too.

    As stored, ``until_ms`` is the operator's wall clock and ``for_ms`` the length it asked for
    (0 from an older command line). Members never compare the operator's clock with theirs:
    each counts ``for_ms`` from when it first read the step-down, on its own monotonic clock,
    and applies the controls in that frame (``until_ms`` and ``now_ms`` both local:
    :mod:`kinesumer.group.controls`).
    """

    until_ms: int
    drain: bool = False
    for_ms: int = 0

    def active(self, now_ms: int) -> bool:
        return now_ms < self.until_ms


@dataclass(frozen=True)
class Controls:
    """The operator's controls of one app, as stored (``version`` 0: no item yet)."""

    version: int = 0
    pins: Mapping[tuple[str, str], str] = field(default_factory=dict)
    step_downs: Mapping[str, StepDown] = field(default_factory=dict)
    #: Bumped by every forced rebalance; members that see it change assign afresh.
    rebalance: int = 0
    updated_ms: int = 0

    def stepped_down(self, now_ms: int, *, drained: bool = False) -> frozenset[str]:
        """Members whose step-down is in force at ``now_ms`` (only drained ones with
        ``drained``)."""
        return frozenset(
            c for c, s in self.step_downs.items() if s.active(now_ms) and (s.drain or not drained)
        )


def leader_candidates(live_ids: Sequence[str], controls: Controls, now_ms: int) -> list[str]:
    """The sorted live ids that may lead: those not stepped down (all of them if none is
    left)."""
    excluded = controls.stepped_down(now_ms)
    candidates = sorted(c for c in live_ids if c not in excluded)
    return candidates or sorted(live_ids)


def controlled_leader(live_ids: Sequence[str], controls: Controls, now_ms: int) -> str | None:
    """Index 0 of the live ids not stepped down; None when nobody is live."""
    candidates = leader_candidates(live_ids, controls, now_ms)
    return candidates[0] if candidates else None


def controlled_is_leader(
    client_id: str, live_ids: Sequence[str], controls: Controls, now_ms: int
) -> bool:
    """True only when ``client_id`` is live and :func:`controlled_leader` names it."""
    return client_id in live_ids and controlled_leader(live_ids, controls, now_ms) == client_id


@dataclass(frozen=True)
class SplitInputs:
    """The assignment's inputs once the controls are applied."""

    #: Members for the automatic assignment (drained ones without the streams others cover).
    members: dict[str, frozenset[str]]
    #: Shards left for the automatic assignment (pinned ones removed).
    shards: dict[str, list[str]]
    #: client -> stream -> pinned shard ids it reads.
    pinned: Assignment
    #: Pins that fell back (target dead or not subscribed): (stream, shard, target).
    fallen_back: tuple[tuple[str, str, str], ...]


def split_pins(
    members: Mapping[str, Collection[str]],
    shards: Mapping[str, Sequence[str]],
    controls: Controls,
    now_ms: int,
) -> SplitInputs:
    """Take the pinned shards and the drained members out of the automatic assignment."""
    pinned: Assignment = {}
    fallen: list[tuple[str, str, str]] = []
    rest: dict[str, list[str]] = {}
    for stream in sorted(shards):
        kept = []
        for shard_id in sorted(set(shards[stream])):
            target = controls.pins.get((stream, shard_id))
            if target is None:
                kept.append(shard_id)
            elif target in members and stream in members[target]:
                by_stream = pinned.setdefault(target, {})
                by_stream[stream] = (*by_stream.get(stream, ()), shard_id)
            else:
                fallen.append((stream, shard_id, target))
                kept.append(shard_id)
        rest[stream] = kept
    drained = controls.stepped_down(now_ms, drained=True)
    # A drained member gives up a stream only where a member that is not drained consumes it:
    # otherwise nobody would read that stream.
    covered = {s for c, streams in members.items() if c not in drained for s in streams}
    auto = {
        c: frozenset(s for s in streams if c not in drained or s not in covered)
        for c, streams in members.items()
    }
    return SplitInputs(auto, rest, pinned, tuple(fallen))


def merge(
    automatic: Mapping[str, tuple[str, ...]], pinned: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """One member's shards: its automatic ones plus its pinned ones, per stream, sorted."""
    result = {s: tuple(ids) for s, ids in automatic.items()}
    for stream, ids in pinned.items():
        result[stream] = tuple(sorted({*result.get(stream, ()), *ids}))
    return result
