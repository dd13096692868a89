"""The runner's bookkeeping, shared by the thread pool (threads.py) and the tasks (tasks.py).

:class:`Dispatch` admits the records of the engine's batches (the engine's one admission check,
``Cursor.admit``), holding the batches of several shards at once and sharing ``max_in_flight``
among them by records held (so few-key shards cannot take the window over; see
:meth:`Dispatch.admit`), keeps a low-water tracker per lease, asks the scheduler for the next
handler call when a slot is free (with the batch's ``max_wait`` timer), and sorts out how each
call ended. It never blocks and never looks at a clock itself: the runners pass ``now`` and do the
waiting, each in its own way. Everything here runs on one thread (the dispatching one, or the
event loop); only :meth:`Entry.tracker.finish <LowWater.finish>` is called from the workers.

How a call can end, and what the run does:

- returned: its records are done (the worker finished them in their trackers already);
- ``HandlerFailedError`` (the policy stops the run): no more calls start, the in-flight ones
  end, then the runner closes with discard and raises the handler's exception;
- ``AbandonedError`` (the run is closing, or the shard was handed off, while the call waited):
  its records stay undone, the next owner's, and so do its key's queued records of that lease;
- ``LeaseLostError`` (a sink's fenced commit was refused): the lease's queued records are
  dropped and the engine is told (:attr:`Dispatch.lost`), the run goes on;
- anything else is a bug in the layers below: it stops the run like a handler failure.

A lease being handed off (REVOKING) gives up every record no call started, and the handoff
waits only for the calls in flight: the records done after such a gap (or after an abandoned
call) are written with the checkpoint as done runs, and the next owner skips them (see
:mod:`kinesumer.core.done_ranges`; a record the previous owner finished is admitted here as done
at once, with no call). With an exactly-once sink, whose positions carry no done runs, only the
records at the end that no call started are given up (nothing after them is done, so the mark
alone is exact); a queued record with a started or done record after it runs. Queued records of
a LOST or RELEASED lease are dropped: the checkpoint can no longer move for them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from ..group.leases import LeaseStatus
from ..kinesis.kpl import record_cost
from ..models import Record
from ..read.progress import ShardLease
from ..sinks.base import LeaseLostError
from .options import RunOptions
from .policies import AbandonedError, HandlerFailedError
from .progress import Entry, LowWater
from .registry import HandlerSet
from .scheduler import Call, Scheduler

if TYPE_CHECKING:
    from ..read.delivery import Cursor


def key_function(ordering: str) -> Callable[[Record], Hashable]:
    """What a record must be ordered with, for the scheduler."""
    if ordering == "key":
        return lambda record: (record.stream, record.partition_key)
    if ordering == "shard":
        return lambda record: (record.stream, record.shard_id)
    return lambda record: None


class Dispatch:
    def __init__(
        self,
        options: RunOptions,
        cursor: Cursor,
        hold: int = 0,
        added: HandlerSet | None = None,
        hold_bytes: int | None = None,
    ) -> None:
        #: Handlers added at runtime: each admitted record takes the current snapshot.
        self.added = added if added is not None else HandlerSet()
        self.options = options
        self.cursor = cursor
        self.scheduler: Scheduler[Entry] = Scheduler(
            options.ordering != "none",
            options.max_in_flight,
            options.batch_size,
            one_key_per_call=options.sink is not None,
        )
        self._key = key_function(options.ordering)
        self.trackers: dict[ShardLease, LowWater] = {}
        # Engine batches not admitted yet, per lease in the order they came (a lease's batches
        # come in its shard's order), each with the index of its next record; the lease
        # admitted from first next time comes first (see admit()).
        self._pending: dict[ShardLease, deque[_Pending]] = {}
        self._pending_records = 0
        #: Records held in pending batches before no more are asked for (besides one per lease),
        #: and their bytes (Config.max_buffered_bytes, weighed as the engine's buffer does: the
        #: records held here left the buffer's bound; None: records only).
        self._hold = hold
        self._hold_bytes = hold_bytes
        self._pending_bytes = 0
        #: Calls started and not reported back yet.
        self.running = 0
        #: What stops the run with an error (the handler's failure, or a bug below it).
        self.failure: BaseException | None = None
        #: The engine said it is closed: start nothing more.
        self.closed = False
        #: Leases a sink found lost: the runner tells the engine, then clears this.
        self.lost: list[tuple[ShardLease, str]] = []
        self._ready_since: float | None = None
        batch = options.batch
        self._max_wait = batch.max_wait if batch is not None else 0.0

    # -- admission -----------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """Nothing more starts: the run failed or the engine closed."""
        return self.failure is not None or self.closed

    @property
    def wants_records(self) -> bool:
        """Ask the engine for another batch: nothing is pending, or (while records are held
        back by the in-flight bound) fewer than ``hold`` records wait in pending batches.
        Holding batches of several leases is what lets every shard's keys into the window:
        the engine hands out one shard's batch at a time, and a batch admitted alone would
        fill the whole bound with that shard's few keys."""
        if self.stopping:
            return False
        if not self._pending:
            return True
        under = self._hold_bytes is None or self._pending_bytes < self._hold_bytes
        return under and self._pending_records < self._hold

    def set_batch(self, lease: ShardLease, records: list[Record]) -> None:
        if not records:
            return
        batches = self._pending.get(lease)
        if batches is None:
            # First in the turn: the leases already pending had their share of the room.
            batches = deque()
            self._pending = {lease: batches, **self._pending}
        batch = _Pending(records)
        batches.append(batch)
        self._pending_records += len(records)
        self._pending_bytes += batch.cost

    def admit(self) -> None:
        """Admit records of the pending engine batches while the bound leaves room (each
        lease's records in its shard's order), sharing it among their leases: first each lease
        up to an equal share of ``max_in_flight`` (those holding fewest records first), then
        what is left in turn. Shares by records held, not admitted: a shard whose few keys
        drain slowly must not fill the window while another shard's many keys starve."""
        if self.stopping:
            return
        scheduler = self.scheduler
        while self._pending:
            room = scheduler.room()
            if room <= 0:
                return
            fair = max(1, self.options.max_in_flight // len(self._pending))
            progressed = False
            for lease in sorted(self._pending, key=self._open_of):
                allowance = min(scheduler.room(), fair - self._open_of(lease))
                if allowance > 0:
                    self._admit_from(lease, allowance)
                    progressed = True
            if progressed:
                continue
            # Every pending lease holds its share: the room left (others hold less) in turn.
            share = max(1, room // len(self._pending))
            for lease in list(self._pending):
                room = scheduler.room()
                if room <= 0:
                    return
                self._admit_from(lease, min(share, room))

    def _open_of(self, lease: ShardLease) -> int:
        tracker = self.trackers.get(lease)
        return 0 if tracker is None else tracker.open

    def _admit_from(self, lease: ShardLease, limit: int) -> None:
        """Admit up to ``limit`` records of ``lease``'s oldest pending batch; the lease goes
        to the back of the turn."""
        batches = self._pending.pop(lease)
        batch = batches[0]
        scheduler, records, key = self.scheduler, batch.records, self._key
        tracker = self.trackers.get(lease)
        if tracker is None:
            tracker = self.trackers[lease] = LowWater(lease)
        admit = self.cursor.admit
        progress = lease.progress
        added = self.added.current
        index = start = batch.index
        end = min(len(records), index + limit)
        while index < end:
            record = records[index]
            if not admit(lease, record):
                # Revoked or lost: the rest of its batches are the next owner's.
                self._forget_pending(batches)
                return
            if progress.skipping and progress.already_done(record):
                # The previous owner finished it (a done run of the checkpoint): done here too,
                # so the mark moves past it, but no call.
                tracker.finish(tracker.admit(record))
            else:
                entry = tracker.admit(record)
                if added:
                    entry.added = added
                scheduler.add(entry, key(record))
                tracker.open += 1
            index += 1
        batch.index = index
        self._pending_records -= index - start
        if index >= len(records):
            self._pending_bytes -= batches.popleft().cost
        if batches:
            self._pending[lease] = batches

    # -- calls ---------------------------------------------------------------------------------
    def next_call(self, now: float) -> Call[Entry] | None:
        """The next call to start, if a slot is free and one may start now."""
        if self.stopping or self.running >= self.options.concurrency:
            return None
        scheduler = self.scheduler
        if self.options.batch is None:
            call = scheduler.take()
        else:
            if scheduler.ready() == 0:
                self._ready_since = None
                return None
            if self._ready_since is None:
                self._ready_since = now
            call = scheduler.take(force=now - self._ready_since >= self._max_wait)
            if call is not None:
                self._ready_since = now if scheduler.ready() else None
        if call is not None:
            self.running += 1
            for entry in call.items:
                entry.started = True
        return call

    def wait_time(self, now: float) -> float | None:
        """Seconds until a partial batch may start (None: no timer runs)."""
        if (
            self._ready_since is None
            or self.stopping
            or self.running >= self.options.concurrency
            or self.scheduler.ready() == 0
        ):
            return None
        return max(0.0, self._ready_since + self._max_wait - now)

    def finished(self, call: Call[Entry], error: BaseException | None) -> None:
        """``call`` came back, with the error it raised (None: its records are done)."""
        self.running -= 1
        self.scheduler.done(call)
        for entry in call.items:
            entry.tracker.open -= 1
        if error is None:
            return
        if isinstance(error, AbandonedError):
            # Not done, and no call has them now: a handoff's sweep may give them up (when
            # nothing after them started) instead of waiting out its timeout for them. Their
            # keys' later records must not start before them: they are the next owner's.
            for entry in call.items:
                entry.started = False
                entry.dropped = True
            if call.keys:  # (of the same leases: another shard's must not be stranded)
                keys, key = set(call.keys), self._key
                trackers = {entry.tracker for entry in call.items}
                _closed(
                    self.scheduler.drop(
                        lambda entry: (
                            _dropping(entry)
                            if entry.tracker in trackers and key(entry.record) in keys
                            else False
                        )
                    )
                )
            return
        if isinstance(error, LeaseLostError):
            lease = call.items[0].lease
            self.lost.append((lease, str(error)))
            self.drop(lease)
            return
        if self.failure is None:
            self.failure = error

    # -- leases that ended ---------------------------------------------------------------------
    def drop(self, lease: ShardLease) -> None:
        """Forget the queued records of ``lease``, its pending batches and its tracker."""
        batches = self._pending.pop(lease, None)
        if batches is not None:
            self._forget_pending(batches)
        tracker = self.trackers.pop(lease, None)
        if tracker is not None:
            self.scheduler.drop(lambda entry: entry.tracker is tracker)

    def _forget_pending(self, batches: deque[_Pending]) -> None:
        """``batches`` (taken out of ``_pending``) will not be admitted."""
        self._pending_records -= sum(len(b.records) - b.index for b in batches)
        self._pending_bytes -= sum(b.cost for b in batches)

    def sweep(self) -> None:
        """Leases that ended (lost, or released after a handoff): drop their queued records.
        Leases being handed off: give up the records at the end that no call started (see
        :meth:`LowWater.give_up_unstarted`), so the handoff waits only for calls in flight."""
        for lease, tracker in list(self.trackers.items()):
            status = lease.claim.status
            if status is LeaseStatus.LOST or status is LeaseStatus.RELEASED:
                self.drop(lease)
            elif status is LeaseStatus.REVOKING:
                # Without a sink the done runs go with the checkpoint: every queued record may
                # be given up (a sink's positions carry no runs: only those at the end).
                cut = tracker.give_up_unstarted(anywhere=self.options.sink is None)
                if cut:
                    self._forget(cut)

    def _forget(self, entries: list[Entry]) -> None:
        """Take ``entries`` (queued, not started) out of the scheduler."""
        given_up = set(map(id, entries))
        _closed(self.scheduler.drop(lambda entry: id(entry) in given_up))

    def handler_error(self) -> BaseException | None:
        """What ``run()`` raises: the handler's own exception for a policy's stop."""
        failure = self.failure
        if isinstance(failure, HandlerFailedError):
            error = failure.error
            error.add_note(f"kinesumer: {failure}")
            return error
        return failure


class _Pending:
    """An engine batch and the index of its next record to admit."""

    __slots__ = ("cost", "index", "records")

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.index = 0
        #: Its weight in bytes, counted until it is admitted whole or dropped.
        self.cost = sum(map(record_cost, records))


def _closed(entries: list[Entry]) -> None:
    """``entries`` left the scheduler without a call: their leases hold fewer records."""
    for entry in entries:
        entry.tracker.open -= 1


def _dropping(entry: Entry) -> bool:
    """A scheduler predicate that marks what it drops (the abandoned key's queued records)."""
    entry.dropped = True
    return True
