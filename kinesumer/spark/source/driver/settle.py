"""Settling batches: the group's checkpoints, written once Spark committed a batch.

A batch this process planned began each of its shards on the member (a handoff waits for it);
settling completes each at the ledger's end. A batch planned by an earlier run of the query (a
restart) is *adopted*: its ledger ends move the member's checkpoints forward (never backwards)
for the shards the member holds. A shard the member does not hold yet (its claim comes a tick
later, or waits for its parents' finish to be seen) keeps its entry pending here, and is adopted
when it shows up in ``owned()``: otherwise its last batch's end would be lost, and it would
restart from the older group checkpoint (duplicates in an exactly-once sink).

A shard whose read reached SHARD_END must be *finished* in the group (its children wait for
that), also when its last read found no record (``end`` None), also when it was checkpointed as
far already, and also when its ``complete()`` was refused because the lease was lost meanwhile:
such an entry stays pending until the shard shows up in ``owned()`` again (re-claimed, or after
a restart) and is finished then. The planner never plans a shard again once a committed batch
read it to SHARD_END, so nothing but this pending entry would ever finish it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ....config import Config
from ....models import Position
from ..ledger import LedgerEntry
from ..offsets import SourceOffset, sequence_after

log = logging.getLogger("kinesumer.spark.source")

Key = tuple[str, str]


class Owned(Protocol):
    """What the planner reads of :class:`~kinesumer.group.external.OwnedShard`."""

    @property
    def key(self) -> Key: ...
    @property
    def lease(self) -> int: ...
    @property
    def position(self) -> Position | None: ...
    @property
    def start(self) -> Any: ...
    @property
    def started_at_ms(self) -> int | None: ...


class Member(Protocol):
    """The part of :class:`~kinesumer.group.external.ExternalReadMember` the planner uses."""

    def start(self, streams: Any) -> None: ...
    def owned(self) -> Any: ...
    def begin(self, key: Key, lease: int | None = None) -> bool: ...
    def record_start(self, key: Key, lease: int, started_at_ms: int) -> bool: ...
    def complete(self, key: Key, position: Position | None, *, finished: bool = False) -> bool: ...
    def abandon(self, key: Key) -> None: ...
    def abandon_all(self) -> int: ...
    def stats(self) -> Any: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Held:
    """An owned shard whose position the planner knows better than the snapshot it read (an
    adopted ledger end)."""

    key: Key
    lease: int
    position: Position | None
    start: Any
    started_at_ms: int | None = None


class Settlement:
    """Which batches this process planned and settled, and the pending adoptions."""

    def __init__(self) -> None:
        self.begun: dict[int, set[Key]] = {}  # batches planned (and begun) here, not settled
        self.planned_here: set[int] = set()  # batches this process planned (pruned on commit)
        self.settled: set[int] = set()
        self.pending: dict[Key, LedgerEntry] = {}  # an earlier run's ends, shard not held yet
        self.finished = 0  # shards finished by adopt() (their children become claimable)

    def planned(self, batch: int, keys: set[Key]) -> None:
        """Batch ``batch`` was planned here over ``keys`` (each begun)."""
        self.begun[batch] = set(keys)
        self.planned_here.add(batch)

    def settle(self, member: Member, offset: SourceOffset, ends: dict[Key, LedgerEntry]) -> None:
        """Batch ``offset.batch`` is committed in Spark: complete its shards (or keep an
        earlier run's ends to adopt, see the module docstring)."""
        if not offset.shards or offset.batch in self.settled:
            return
        began = self.begun.get(offset.batch)
        if began is None:
            for key in sorted(offset.shards):
                entry = ends.get(key)
                if entry is not None and (entry.end is not None or entry.shard_end):
                    self.keep(entry)
        else:
            # Each shard leaves ``begun`` once its complete() returned: a settle cut short (a
            # SIGTERM's SystemExit) leaves the rest for the leave to complete, not abandon.
            for key in sorted(began):
                self._settle_one(member, offset, key, ends)
                began.discard(key)
            del self.begun[offset.batch]
        self.settled.add(offset.batch)

    def _settle_one(
        self, member: Member, offset: SourceOffset, key: Key, ends: dict[Key, LedgerEntry]
    ) -> None:
        """Complete ``key``'s begin of the committed batch at its ledger end (abandon it
        without one)."""
        entry = ends.get(key)
        if entry is None:
            member.abandon(key)
        elif not member.complete(key, entry.end, finished=entry.shard_end):
            # Lost is all this side knows: the shard moved to another member, or this
            # query's heartbeats did not land in time (DynamoDB unreachable) and it let
            # the shard go before others could take it; the member's own "lost ..."
            # warning said which.
            log.warning(
                "%s/%s was no longer held when batch %d settled (see the 'lost' warning "
                "before this for why): its records are read again by the shard's next "
                "holder, from the last checkpoint",
                *key,
                offset.batch,
            )
            if entry.shard_end:
                self.keep(entry)  # finished when (if) it is held here again

    def keep(self, entry: LedgerEntry) -> None:
        """Keep ``entry`` to adopt (the latest batch's entry of a shard wins)."""
        known = self.pending.get(entry.key)
        if known is None or known.batch < entry.batch:
            self.pending[entry.key] = entry

    def adopt(self, member: Member, owned: dict[Key, Owned]) -> dict[Key, Owned]:
        """Adopt the pending ends of shards in ``owned``; returns ``owned`` as it is now (an
        adopted shard at its end, one adopted at SHARD_END left out)."""
        out = dict(owned)
        for key in sorted(set(self.pending) & set(owned)):
            entry, holder = self.pending.pop(key), owned[key]
            end = entry.end
            known = holder.position
            if end is not None and known is not None and not sequence_after(end, known):
                end = None  # checkpointed as far or further since: the position stays
            if end is None and not entry.shard_end:
                continue
            if not member.begin(key, holder.lease):
                member.abandon(key)  # moved meanwhile
                if entry.shard_end:
                    self.keep(entry)
                continue
            if not member.complete(key, end, finished=entry.shard_end):
                if entry.shard_end:
                    self.keep(entry)
                continue
            log.info("%s/%s: batch %d adopted%s", *key, entry.batch,
                     " (SHARD_END: finished)" if entry.shard_end else "")  # fmt: skip
            if entry.shard_end:
                self.finished += 1
                del out[key]
            else:
                out[key] = Held(key, holder.lease, end, holder.start, holder.started_at_ms)
        return out

    def prune(self, batch: int) -> None:
        """Spark committed ``batch``: forget the batches before it."""
        self.planned_here = {b for b in self.planned_here if b >= batch}
        self.settled = {b for b in self.settled if b >= batch}


def await_claims(member: Member, config: Config) -> None:
    """No claim pending, and two coordinator ticks passed (bounded by a handoff)."""
    deadline = time.monotonic() + config.handoff_timeout + 2 * config.client_timeout
    first = _ticks(member)
    while time.monotonic() < deadline:
        stats = member.stats()
        if not getattr(stats, "claims_pending", False) and _ticks(member) >= first + 2:
            return
        time.sleep(min(0.1, config.heartbeat_interval))


def _ticks(member: Member) -> int:
    return int(getattr(member.stats(), "coordinator_ticks", 0))
