"""A lease's read progress: how far the read side got in the shard under one claim.

The group side owns the claim (:class:`kinesumer.group.leases.Claim`); this object is the read
side's, and only the read side changes it:

- the fetcher (:mod:`.fetcher`, :mod:`.efo_fetcher`, :mod:`.efo_fallback`; the engine's loop):
  ``fetched``, ``reached_end``, ``millis_behind``, ``caught_up``, the EFO stalls and polling,
  the fetcher task;
- the delivery side (the cursor on the application's thread or task, ``run()``'s workers, and
  ``Engine.commit``/``close``): ``delivered``, ``processed``, the skip of done records, the
  handler run's done source;
- the engine, once, before the fetcher starts: where an exactly-once sink says reading resumes.

The checkpointer (group side, the loop) reads ``processed``, :meth:`done_marks`, ``in_hand``
and ``drained`` through :class:`~kinesumer.group.leases.ReadProgress`, and cancels the fetcher.

The admission of a record, "is the claim still active? then the record is delivered", must not
interleave with a status change: it runs under the claim's lock (:attr:`Claim.lock`), the one
lock of the pair, as do the changes that move ``delivered`` and ``processed`` together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..core import done_ranges
from ..core.done_ranges import DoneRuns, Run
from ..group.leases import Claim, Lease, LeaseStatus, resumed_at
from ..models import Checkpoint, Position, Record

#: What a handler run reports for the done runs: (processed, runs of done records above it),
#: read together (see :meth:`ShardProgress.set_done_source`).
DoneSource = Callable[[], tuple[Position | None, list[Run]]]


class ShardProgress:
    """The read side's progress on one claimed shard. Read its fields freely; change them only
    through its methods."""

    __slots__ = (
        "_done_source",
        "_fetcher",
        "_inherited",
        "_lock",
        "_skip",
        "caught_up",
        "claim",
        "delivered",
        "efo_polling",
        "efo_stalls",
        "fetched",
        "millis_behind",
        "processed",
        "reached_end",
        "skipping",
    )

    def __init__(self, claim: Claim) -> None:
        #: The claim this progress is read under (never changed from here but for its fence).
        self.claim = claim
        self._lock = claim.lock
        #: The last record handed to the application.
        self.delivered: Position | None = None
        #: The last record the application finished (auto mode) or committed.
        self.processed: Position | None = resumed_at(claim.checkpoint)
        #: The last record put in the buffer under this claim.
        self.fetched: Position | None = None
        #: GetRecords reached SHARD_END: every record of the shard was fetched.
        self.reached_end = False
        #: MillisBehindLatest of the last GetRecords (None until the first).
        self.millis_behind: int | None = None
        #: The last GetRecords came back empty at the tip: nothing more to fetch now.
        self.caught_up = False
        #: Enhanced fan-out: stalls of this shard's subscriptions under this claim, and whether
        #: it is read by polling for now (efo_fallback).
        self.efo_stalls = 0
        self.efo_polling = False
        #: Records are being checked against the done runs inherited from the previous owner
        #: (:meth:`already_done`); False once the shard's records passed them (the hot path's
        #: test).
        self._inherited: tuple[Run, ...] = claim.inherited
        self._skip: DoneRuns | None = DoneRuns(claim.inherited) if claim.inherited else None
        self.skipping = self._skip is not None
        self._done_source: DoneSource | None = None
        self._fetcher: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return (
            f"ShardProgress(delivered={self.delivered}, processed={self.processed}, "
            f"fetched={self.fetched}, reached_end={self.reached_end})"
        )

    @property
    def in_hand(self) -> bool:
        """Something the application holds and has not finished: a delivered record not yet
        processed (auto mode) or committed."""
        return self.delivered is not None and self.delivered != self.processed

    @property
    def drained(self) -> bool:
        """At SHARD_END with every fetched record processed: the shard can be marked finished."""
        return self.reached_end and (self.fetched is None or self.processed == self.fetched)

    # -- delivery side (delivery.Cursor, handlers, Engine.commit/close; any thread) -------------
    def mark_delivered(self, record: Record) -> bool:
        """Cursor: hand ``record`` out if the claim may still deliver. Sets ``delivered``;
        False (nothing changed) means drop the record: the claim was revoked or lost."""
        with self._lock:
            if self.claim.status is not LeaseStatus.ACTIVE:
                return False
            self.delivered = Position(record.sequence_number, record.sub_sequence_number)
            return True

    def mark_processed(self, position: Position) -> None:
        """Cursor (auto mode: the application asked for more) and handler runs: everything up
        to ``position`` is done. Sets ``processed``."""
        self.processed = position

    def already_done(self, record: Record) -> bool:
        """Delivery side, records in shard order: whether the previous owner finished
        ``record`` already (inside an inherited done run): skip it. Stops checking (clears
        ``skipping``) once the records passed the last run."""
        skip = self._skip
        if skip is None:
            return False
        done = skip.contains(Position(record.sequence_number, record.sub_sequence_number))
        if not done and skip.exhausted:
            self._skip, self.skipping = None, False
        return done

    def skip_done(self, record: Record) -> bool:
        """Cursor: pass over ``record``, done by the previous owner, as if it was delivered and
        (when nothing else is in hand) processed. False: the claim may no longer deliver."""
        with self._lock:
            if self.claim.status is not LeaseStatus.ACTIVE:
                return False
            # Nothing delivered yet under this claim (None) holds nothing either: the records
            # right after the checkpoint can be the inherited done ones.
            nothing_in_hand = self.delivered is None or self.delivered == self.processed
            self.delivered = Position(record.sequence_number, record.sub_sequence_number)
            if nothing_in_hand:
                self.processed = self.delivered
            return True

    def set_done_source(self, source: DoneSource) -> None:
        """A handler run's low-water tracker (handlers.progress): it knows which records above
        ``processed`` are done; the checkpointer asks it at every write."""
        self._done_source = source

    def done_marks(self) -> tuple[Position | None, list[Run]]:
        """Checkpointer: the position to write and the runs of done records above it (own and
        inherited, merged), read together."""
        source = self._done_source
        position, own = source() if source is not None else (self.processed, [])
        if not own and not self._inherited:
            return position, []
        return position, done_ranges.above([*self._inherited, *own], position)

    def commit_delivered(self) -> None:
        """Engine.commit: everything delivered so far is processed."""
        with self._lock:
            if self.delivered is not None:
                self.processed = self.delivered

    def discard_delivered(self) -> None:
        """Engine.close(discard=True): what was delivered but not processed never will be; it
        is delivered again by the next owner. Moves ``delivered`` back to ``processed``."""
        with self._lock:
            self.delivered = self.processed

    # -- the engine, before the fetcher starts ---------------------------------------------------
    def resume_after(self, position: Position) -> None:
        """An exactly-once sink holds the truth of where reading resumes: ``position`` is
        processed, and the inherited done runs (written with another position) do not apply."""
        self.processed = position
        self._inherited, self._skip, self.skipping = (), None, False

    # -- fetcher side (fetcher.ShardFetcher, EFO; the engine's loop) -----------------------------
    def attach_fetcher(self, task: asyncio.Task[None]) -> None:
        """Engine: the task reading this shard, cancelled when the claim ends."""
        self._fetcher = task

    def stop_fetching(self) -> None:
        """Checkpointer (handoff, loss) and the member (failure): cancel the fetcher, if any."""
        if self._fetcher is not None:
            self._fetcher.cancel()

    def observe_read(self, millis_behind: int | None, raw_count: int) -> None:
        """ShardFetcher, after each GetRecords: how far behind the shard is, and whether the
        read came back empty at the tip. Sets ``millis_behind`` and ``caught_up``."""
        self.millis_behind = millis_behind
        self.caught_up = raw_count == 0 and not millis_behind

    def mark_fetched(self, position: Position) -> None:
        """ShardFetcher: a batch ending at ``position`` went into the buffer."""
        self.fetched = position

    def mark_end(self) -> None:
        """ShardFetcher: the shard's reads reached SHARD_END."""
        self.reached_end = True


#: A lease of a member that reads its shards itself (the engine, broadcast mode).
ShardLease = Lease[ShardProgress]


def shard_lease(checkpoint: Checkpoint) -> ShardLease:
    """A claim of ``checkpoint`` and the read progress under it, created together."""
    claim = Claim(checkpoint)
    return Lease(claim, ShardProgress(claim))
