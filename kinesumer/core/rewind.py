"""A group's rewind, planned: where each shard of a stream's lineage resumes, in which order the
moves are written. Pure: the Kinesis reads that decide a closed shard's fate and the conditional
writes live in :mod:`kinesumer.admin`.

Every move is expressed in the checkpoint item's existing vocabulary, so members of every
version that knows it agree on what it means:

- **a start instant** (:attr:`RewindTarget.started_at_ms`): no position, ``started_at`` = the
  instant. Readers resume at the first record that arrived at or after it, whatever their
  ``initial_position`` (the meaning of a recorded ``LATEST`` start: every reader path honours
  it, polling and enhanced fan-out alike). 0 is the oldest record the shard still holds (an
  instant before the trim horizon is the trim horizon), and an instant before a shard was
  created is its first record: so a child whose parents are reopened, a shard created after the
  instant, and ``--to trim-horizon`` need no other form.
- **a position** (:attr:`RewindTarget.position`): resume right after that record (``--to
  latest``: the last record Kinesis held when the command read the shard).
- **finished** (:attr:`RewindTarget.finished`): nothing of the shard is to be read (it ended
  before the instant, it is closed at ``--to latest``, or it aged out of the stream).

Worked example: shard 0 split at 12:00 into 1 and 2. A rewind to 11:00 reopens 0 at 11:00 and
starts 1 and 2 at 11:00 too, which is their first record: they wait for 0 to finish as any
child does. A rewind to 13:00 finishes 0 (none of its records arrived at or after 13:00) and
starts 1 and 2 at 13:00.

Order: ancestors before descendants (:func:`lineage_order`). A member re-claiming a child it
lost to the rewind checks its parents' items before reading it: written first, the reopened
parent is seen unfinished, so the child waits for it (the other order could let a child be read
from its start while its parent still showed ``finished``, before the parent's records).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..models import Checkpoint, Position, Shard

#: The ``--to`` values: every shard from its oldest record, or every open shard from now.
TRIM_HORIZON = "trim-horizon"
LATEST = "latest"


@dataclass(frozen=True)
class RewindTarget:
    """Where one shard's checkpoint item is moved: exactly one of a start instant (epoch ms,
    Kinesis's clock; 0: the oldest record), a position (resume after it), or finished."""

    started_at_ms: int | None = None
    position: Position | None = None
    finished: bool = False

    def __post_init__(self) -> None:
        chosen = (self.started_at_ms is not None) + (self.position is not None) + self.finished
        if chosen != 1:
            raise ValueError(f"a rewind target is one of a start, a position or finished: {self}")

    def holds(self, checkpoint: Checkpoint | None) -> bool:
        """Whether ``checkpoint`` already says exactly this (nothing to write)."""
        if checkpoint is None:
            return False
        if self.finished:
            return checkpoint.finished
        if checkpoint.finished or checkpoint.done:
            return False
        if self.position is not None:
            return (
                checkpoint.sequence_number == self.position.sequence_number
                and checkpoint.sub_sequence_number == self.position.sub_sequence_number
                and checkpoint.started_at_ms is None
            )
        return checkpoint.sequence_number is None and checkpoint.started_at_ms == self.started_at_ms


@dataclass(frozen=True)
class ShardRewind:
    """One shard's move: its item as read (None: none yet), and where it goes."""

    stream: str
    shard_id: str
    seen: Checkpoint | None
    target: RewindTarget
    #: Why this target (for the operator): "open at the instant", "ended before it", ...
    reason: str = ""

    @property
    def unchanged(self) -> bool:
        return self.target.holds(self.seen)


def lineage_order(shards: Iterable[Shard]) -> list[str]:
    """Shard ids, every shard after all of its known ancestors (then by id): the order the
    moves are written in."""
    by_id = {s.shard_id: s for s in shards}
    depth: dict[str, int] = {}

    def depth_of(shard_id: str, seen: frozenset[str] = frozenset()) -> int:
        if shard_id in depth:
            return depth[shard_id]
        shard = by_id.get(shard_id)
        parents = [p for p in (shard.parents if shard else ()) if p in by_id and p not in seen]
        found = 1 + max((depth_of(p, seen | {shard_id}) for p in parents), default=-1)
        depth[shard_id] = found
        return found

    return sorted(by_id, key=lambda s: (depth_of(s), s))


def time_target(
    shard: Shard, listed: Mapping[str, Shard], instant_ms: int, has_later_record: bool | None
) -> tuple[RewindTarget, str]:
    """A shard's target for a rewind to ``instant_ms``. ``has_later_record``: for a closed
    shard, whether it holds a record that arrived at or after the instant (None: not known,
    then it is read from the instant, and its reader finds the end itself)."""
    if shard.shard_id not in listed:
        return RewindTarget(finished=True), "no longer in the stream (aged out)"
    if listed[shard.shard_id].closed and has_later_record is False:
        return RewindTarget(finished=True), "closed, no record at or after the time"
    return RewindTarget(started_at_ms=instant_ms), "from the first record at or after the time"
