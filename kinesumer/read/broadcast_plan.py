"""Broadcast mode's shard plan: where this member starts each shard it sees, alone.

A broadcast member reads every shard itself; no group decides anything and no shared item says
which shards are finished. :class:`ShardPlan` keeps that knowledge locally: each time a stream's
shards are listed it decides, for every shard not seen before, to skip it or to read it from a
start, and it keeps parents before children in this member's own reading (a child is read only
once this member read every listed parent to SHARD_END and processed its records).

The rules, for a shard seen for the first time (parents decided before children):

1. A saved position (resume mode): finished, skip it; else resume after the saved record, or at
   the instant the member first began reading it (``started_at``: nothing processed yet).
2. A parent this member reads, read, or saved (it is *tracked*): the shard was born from a
   reshard the member follows, so it starts at TRIM_HORIZON once the parents are finished. A
   parent no longer listed (aged out of retention while the member was away) with a saved
   position counts too: the member followed that lineage, and the parent's records are gone.
3. Otherwise it is a root for this member, read from ``initial_position``. From LATEST a closed
   root is skipped (nothing arrives in it any more) and counts as finished, so its open children
   start at LATEST too rather than replaying their history. With resume, the member's join
   instant is saved before a LATEST read begins, so a restart resumes from it (AT_TIMESTAMP).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..config import InitialPosition
from ..models import Position, Shard
from ..statestore.base import SavedPosition

ShardKey = tuple[str, str]


@dataclass(frozen=True)
class ShardStart:
    """How to read one shard: after ``after`` if set, else from the instant ``since_ms`` if
    set, else from ``initial``; only once every shard in ``parents`` is finished.
    ``started_at_ms``: save where a LATEST read begins before reading (resume mode, a shard with
    nothing saved yet)."""

    key: ShardKey
    after: Position | None
    initial: InitialPosition
    parents: tuple[str, ...] = ()
    started_at_ms: int | None = None
    since_ms: int | None = None


class ShardPlan:
    """Which shards this broadcast member has seen, reads, and finished.

    Called on the engine's loop only: :meth:`new_shards` after each listing,
    :meth:`finish` when a shard was drained, :meth:`parents_finished` by the fetchers waiting on
    their parents.
    """

    def __init__(
        self,
        initial_position: InitialPosition,
        saved: Mapping[ShardKey, SavedPosition],
        joined_at_ms: int,
        resume: bool,
    ) -> None:
        self._initial = initial_position
        self._saved = dict(saved)
        self._joined_at_ms = joined_at_ms
        self._resume = resume
        self._decided: set[ShardKey] = set()
        #: Shards whose records this member reads or read (their children follow them).
        self._tracked: set[ShardKey] = set()
        #: Shards done for this member: read to their end, or skipped.
        self.finished: set[ShardKey] = set()

    def new_shards(self, stream: str, shards: Iterable[Shard]) -> list[ShardStart]:
        """Decide every shard of ``stream`` not seen before; the ones to read, parents first."""
        listed = {s.shard_id: s for s in shards}
        starts: list[ShardStart] = []

        def decide(shard: Shard) -> None:
            key = (stream, shard.shard_id)
            if key in self._decided:
                return
            self._decided.add(key)
            parents = tuple(p for p in shard.parents if p in listed)
            for parent in parents:
                decide(listed[parent])
            for parent in shard.parents:
                if parent not in listed:
                    self._aged_out((stream, parent))
            start = self._start_of(key, shard, parents)
            if start is not None:
                starts.append(start)

        for shard in sorted(listed.values()):
            decide(shard)
        return starts

    def _start_of(self, key: ShardKey, shard: Shard, parents: tuple[str, ...]) -> ShardStart | None:
        stream = key[0]
        saved = self._saved.pop(key, None)  # used once: after a forget() it is reloaded
        if saved is not None:  # 1
            self._tracked.add(key)
            if saved.finished:
                self.finished.add(key)
                return None
            if saved.position is not None:
                return ShardStart(key, saved.position, "TRIM_HORIZON", parents)
            if saved.started_at_ms is not None:
                return ShardStart(key, None, "LATEST", parents, since_ms=saved.started_at_ms)
        elif any((stream, p) in self._tracked for p in shard.parents):  # 2
            self._tracked.add(key)
            return ShardStart(key, None, "TRIM_HORIZON", parents)
        # 3: a root for this member.
        if self._initial != "LATEST":
            self._tracked.add(key)
            return ShardStart(key, None, self._initial, parents)
        if shard.closed:
            self.finished.add(key)
            return None
        self._tracked.add(key)
        # Resume mode saves where the LATEST read began before reading (the fetcher, by Kinesis's
        # clock; the join instant stands for it here): a restart reading from it (AT_TIMESTAMP)
        # misses nothing and replays nothing processed.
        started = self._joined_at_ms if self._resume else None
        return ShardStart(key, None, "LATEST", parents, started_at_ms=started)

    def _aged_out(self, key: ShardKey) -> None:
        """A parent no longer listed: with a saved position, this member followed it (rule 2);
        its records are gone, so it counts as finished."""
        if self._saved.pop(key, None) is not None:
            self._decided.add(key)
            self._tracked.add(key)
            self.finished.add(key)

    def finish(self, key: ShardKey) -> None:
        """The shard was read to its end and every record of it processed."""
        self.finished.add(key)

    def forget(self, stream: str) -> None:
        """The member stopped reading ``stream``: seen again later, its shards are decided
        afresh (give :meth:`remember` what was saved since, in resume mode)."""
        for keys in (self._decided, self._tracked, self.finished):
            keys.difference_update({k for k in keys if k[0] == stream})

    def remember(self, saved: Mapping[ShardKey, SavedPosition]) -> None:
        """Positions saved for shards not decided yet (a stream read again after a refresh)."""
        self._saved.update({k: v for k, v in saved.items() if k not in self._decided})

    def parents_finished(self, start: ShardStart) -> bool:
        stream = start.key[0]
        return all((stream, p) in self.finished for p in start.parents)
