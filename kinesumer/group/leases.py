"""The lease: this member's ownership of one shard, the state every engine part shares.

The leasing part creates a lease when a claim succeeds; a fetcher fills the buffer under it; the
delivery side (possibly on the application's thread) moves its ``delivered`` and ``processed``
marks; the checkpointer writes ``processed`` and ends the lease. Every change goes through a
method below, whose docstring says who calls it and what it changes. Marks are single attribute
writes, so the engine thread may read them while the application thread writes them; the one
step that must not interleave, "is this lease still deliverable? then it is delivered", happens
under the lease's lock.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..core import done_ranges
from ..core.done_ranges import DoneRuns, Run
from ..models import Checkpoint, Position, Record

log = logging.getLogger("kinesumer.checkpoint")

#: What a handler run reports for the done runs: (processed, runs of done records above it),
#: read together (see :meth:`Lease.set_done_source`).
DoneSource = Callable[[], tuple[Position | None, list[Run]]]


class LeaseStatus(enum.Enum):
    """Where a lease is in its life. Every transition, and who makes it::

        (claim) ──────────────► ACTIVE        leasing.Leasing: a conditional claim succeeded
        ACTIVE ──begin_handoff─► REVOKING     Checkpointer.handoff: the assignment moved the
                                              shard away, or the member is closing
        REVOKING ──release────► RELEASED      Checkpointer.handoff: the final write landed
        ACTIVE ──finish───────► RELEASED      Checkpointer.finish: SHARD_END reached, every
                                              record processed, written ``finished``
        ACTIVE/REVOKING ─fence─► LOST         delivery.Cursor (any thread): the fence passed
                                              while delivering; records are being dropped
        ACTIVE/REVOKING ─lose──► LOST         Checkpointer.lose: a write was refused, or the
                                              heartbeats failed (membership's fence)

    RELEASED and LOST are final: a shard claimed again gets a new lease.
    """

    ACTIVE = "active"  # claimed: fetching and delivering
    REVOKING = "revoking"  # moving away gracefully: no more deliveries, finishing the in-hand one
    LOST = "lost"  # someone else owns it now: drop everything buffered
    RELEASED = "released"  # handed back (or finished) with its checkpoint written


@dataclass(eq=False)
class Lease:
    """This client's ownership of one shard, from a successful claim until release or loss.

    Read its fields freely; change them only through its methods.
    """

    checkpoint: Checkpoint
    status: LeaseStatus = LeaseStatus.ACTIVE
    #: The last record handed to the application.
    delivered: Position | None = None
    #: The last record the application finished (auto mode) or committed.
    processed: Position | None = None
    #: The position last written to the checkpoint.
    checkpointed: Position | None = None
    #: The last record put in the buffer under this lease.
    fetched: Position | None = None
    #: GetRecords reached SHARD_END: every record of the shard was fetched.
    reached_end: bool = False
    #: Checkpointed finished (SHARD_END reached and every record processed).
    finished: bool = False
    #: MillisBehindLatest of the last GetRecords (None until the first).
    millis_behind: int | None = None
    #: The last GetRecords came back empty at the tip: nothing more to fetch now.
    caught_up: bool = False
    #: Enhanced fan-out: stalls of this shard's subscriptions under this lease, and whether it
    #: is read by polling for now (efo_fallback).
    efo_stalls: int = 0
    efo_polling: bool = False
    #: Batches read elsewhere (external members) begun and not yet completed or abandoned.
    open_batches: int = 0
    #: Records are being checked against the done runs inherited from the previous owner
    #: (:meth:`already_done`); False once the shard's records passed them (the hot path's test).
    skipping: bool = field(default=False, init=False)
    #: The ``done`` attribute the checkpoint item holds (as claimed, then as last written).
    done_written: bytes = field(default=b"", init=False, repr=False)
    _inherited: tuple[Run, ...] = field(default=(), init=False, repr=False)
    _skip: DoneRuns | None = field(default=None, init=False, repr=False)
    _done_source: DoneSource | None = field(default=None, init=False, repr=False)
    _loss_handled: bool = field(default=False, init=False, repr=False)
    _fetcher: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        start = self.checkpoint.sequence_number
        if start is not None:
            resumed = Position(start, self.checkpoint.sub_sequence_number)
            self.processed = self.checkpointed = resumed
        self.done_written = self.checkpoint.done
        if self.checkpoint.done:
            self._inherit(self.checkpoint.done)

    def _inherit(self, blob: bytes) -> None:
        """The previous owner's done runs, if they were written with the position the
        checkpoint holds now (else a writer that knows nothing of them moved it: ignored)."""
        try:
            base, runs = done_ranges.decode(blob)
        except ValueError as exc:
            log.warning("%s/%s: done runs ignored (%s)", *self.key, exc)
            return
        if base != self.processed or not runs:
            return
        self._inherited = tuple(runs)
        self._skip = DoneRuns(runs)
        self.skipping = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.checkpoint.stream, self.checkpoint.shard_id)

    @property
    def deliverable(self) -> bool:
        return self.status is LeaseStatus.ACTIVE

    @property
    def in_hand(self) -> bool:
        """Something the application holds and has not finished: a delivered record not yet
        processed (auto mode) or committed, or a batch read elsewhere not yet completed."""
        return self.open_batches > 0 or (
            self.delivered is not None and self.delivered != self.processed
        )

    @property
    def drained(self) -> bool:
        """At SHARD_END with every fetched record processed: the shard can be marked finished."""
        return (
            self.reached_end
            and self.open_batches == 0
            and (self.fetched is None or self.processed == self.fetched)
        )

    # -- delivery side (delivery.Cursor, Engine.commit/close; any thread) ---------------------
    def mark_delivered(self, record: Record) -> bool:
        """Cursor: hand ``record`` out if this lease may still deliver. Sets ``delivered``;
        False (nothing changed) means drop the record: the lease was revoked or lost."""
        with self._lock:
            if self.status is not LeaseStatus.ACTIVE:
                return False
            self.delivered = Position(record.sequence_number, record.sub_sequence_number)
            return True

    def mark_processed(self, position: Position) -> None:
        """Cursor (auto mode: the application asked for more) and external members (a batch
        completed): everything up to ``position`` is done. Sets ``processed``."""
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
        (when nothing else is in hand) processed. False: the lease may no longer deliver."""
        with self._lock:
            if self.status is not LeaseStatus.ACTIVE:
                return False
            # Nothing delivered yet under this lease (None) holds nothing either: the records
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

    def forget_done(self) -> None:
        """Engine (a sink said where reading resumes): the inherited runs do not apply."""
        self._inherited, self._skip, self.skipping = (), None, False

    def done_marks(self) -> tuple[Position | None, list[Run]]:
        """Checkpointer: the position to write and the runs of done records above it (own and
        inherited, merged), read together."""
        source = self._done_source
        position, own = source() if source is not None else (self.processed, [])
        if not own and not self._inherited:
            return position, []
        return position, done_ranges.above([*self._inherited, *own], position)

    def mark_done_written(self, blob: bytes) -> None:
        """Checkpointer: a write landed with this ``done`` attribute."""
        self.done_written = blob

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

    def fence(self) -> None:
        """Cursor (any thread): the fence passed while delivering; stop delivering at once
        (status LOST). The checkpointer's :meth:`lose` does the rest on the engine's loop."""
        with self._lock:
            self.status = LeaseStatus.LOST

    # -- external members (external.ExternalReadMember) ---------------------------------------
    def begin_batch(self) -> None:
        """A batch reading this shard elsewhere was planned: a handoff waits for it."""
        self.open_batches += 1

    def end_batch(self) -> None:
        """That batch was completed (after its checkpoint write) or abandoned."""
        self.open_batches = max(0, self.open_batches - 1)

    # -- fetcher side (fetcher.ShardFetcher) ----------------------------------------------------
    def attach_fetcher(self, task: asyncio.Task[None]) -> None:
        """Engine: the task reading this shard, cancelled when the lease stops."""
        self._fetcher = task

    def stop_fetching(self) -> None:
        """Checkpointer (handoff, loss) and the engine (failure): cancel the fetcher, if any."""
        if self._fetcher is not None:
            self._fetcher.cancel()

    def observe_read(self, millis_behind: int | None, raw_count: int) -> None:
        """ShardFetcher, after each GetRecords: how far behind the shard is, and whether the
        read came back empty at the tip. Sets ``millis_behind`` and ``caught_up``."""
        self.millis_behind = millis_behind
        self.caught_up = raw_count == 0 and not millis_behind

    def mark_fetched(self, position: Position) -> None:
        """ShardFetcher (a batch went into the buffer) and external members (a batch ending
        at SHARD_END completed): sets ``fetched``."""
        self.fetched = position

    def mark_end(self) -> None:
        """ShardFetcher and external members: the shard's reads reached SHARD_END."""
        self.reached_end = True

    # -- checkpointer side (checkpointer.Checkpointer; on the engine's loop) -------------------
    def mark_checkpointed(self, position: Position | None) -> None:
        """A checkpoint write landed with ``position``. Sets ``checkpointed``."""
        self.checkpointed = position

    def begin_handoff(self) -> bool:
        """ACTIVE → REVOKING: no more deliveries, fetcher cancelled. False (nothing changed)
        when the lease already ended (LOST or RELEASED)."""
        with self._lock:
            if self.status in (LeaseStatus.LOST, LeaseStatus.RELEASED):
                return False
            self.status = LeaseStatus.REVOKING
        self.stop_fetching()
        return True

    def release(self) -> None:
        """REVOKING → RELEASED: the handoff's final write (checkpoint, owner cleared) landed."""
        with self._lock:
            self.status = LeaseStatus.RELEASED

    def finish(self) -> None:
        """ACTIVE → RELEASED with ``finished``: the shard was checkpointed finished."""
        with self._lock:
            self.status = LeaseStatus.RELEASED
            self.finished = True

    def lose(self) -> bool:
        """→ LOST: another member owns the shard now. Stops deliveries and the fetcher. True
        the first time only (the caller then tells the hooks); False once handled or when the
        lease was already released."""
        if self.status is LeaseStatus.RELEASED or self._loss_handled:
            return False
        self._loss_handled = True
        self.fence()
        self.stop_fetching()
        return True


async def wait_for_parents(
    lease: Lease, parents_finished: Callable[[], Awaitable[bool]], interval: float
) -> bool:
    """Parents before children: poll until every parent of the shard is checkpointed finished.
    False when the lease ended meanwhile."""
    while lease.deliverable and not await parents_finished():  # noqa: ASYNC110 (polls DynamoDB)
        await asyncio.sleep(interval)
    return lease.deliverable
