"""The low-water mark of one lease: ``processed`` only moves past records that are all done.

With several handler calls in flight on one shard (ordering by key, or none) records finish out
of order. The checkpoint must not pass a record that is not done, or a crash would lose it. A
:class:`LowWater` keeps the lease's admitted records in sequence order with a done flag each,
and moves ``lease.mark_processed`` to the last record of the done prefix::

    admitted  r1 r2 r3 r4 r5        done: r1 r2 r4        processed: r2
    r3 done                                               processed: r4

Admission happens in sequence order per lease (one GetRecords batch after the other), so the
order of :meth:`LowWater.admit` calls is the shard's order. A record that is never finished
(its call was abandoned, its lease lost) holds the mark where it is: the next owner delivers it
again. The records done after it are not: at every checkpoint write the tracker reports them
(:meth:`LowWater.done_marks`, runs of consecutive done records) and they are written with the
mark, so the next owner skips them (:mod:`kinesumer.core.done_ranges`). Cheap: one small object
per record, O(1) amortised per finish. Thread-safe: admit and finish may come from different
threads.
"""

from __future__ import annotations

import threading
from collections import deque

from ..core.done_ranges import Run, runs_of
from ..models import Position, Record
from ..read.progress import ShardLease
from .registry import NONE, AddedHandler


class Entry:
    """One admitted record: what the scheduler queues and the handler call gets."""

    __slots__ = ("added", "done", "dropped", "position", "record", "started", "tracker")

    def __init__(self, record: Record, position: Position, tracker: LowWater) -> None:
        self.record = record
        self.position = position
        self.tracker = tracker
        #: A handler call took it (set by the dispatcher); done: that call finished it.
        self.started = False
        self.done = False
        #: Out of the scheduler for good (abandoned, or given up by a handoff): no call will
        #: take it here; the next owner delivers it.
        self.dropped = False
        #: The handlers added at runtime when it was admitted (see .registry).
        self.added: tuple[AddedHandler, ...] = NONE

    @property
    def lease(self) -> ShardLease:
        return self.tracker.lease

    def __repr__(self) -> str:
        record = self.record
        return f"Entry({record.stream}/{record.shard_id}@{record.sequence_number})"


class LowWater:
    """Admitted records of one lease, in order, until the done prefix passes them."""

    def __init__(self, lease: ShardLease) -> None:
        self.lease = lease
        self._entries: deque[Entry] = deque()
        self._lock = threading.Lock()
        # Records at the end were given up (the lease is being handed off): once the rest are
        # done, ``delivered`` goes back to ``processed`` so the handoff stops waiting.
        self._cut = False
        #: Records of the lease in the scheduler (queued or in a call): the dispatcher's
        #: count, on its thread only, for sharing max_in_flight among leases (dispatch.py).
        self.open = 0
        lease.progress.set_done_source(self.done_marks)

    def done_marks(self) -> tuple[Position | None, list[Run]]:
        """The checkpointer's question: the mark, and the runs of done records above it, read
        together (under the lock, so no finish moves the mark in between)."""
        with self._lock:
            entries = self._entries
            runs = runs_of((e.position, e.done) for e in entries) if entries else []
            return self.lease.progress.processed, runs

    def admit(self, record: Record) -> Entry:
        """``record`` was admitted (``Cursor.admit`` said yes): track it until it is done."""
        position = Position(record.sequence_number, record.sub_sequence_number)
        entry = Entry(record, position, self)
        with self._lock:
            self._entries.append(entry)
        return entry

    def finish(self, entry: Entry) -> None:
        """``entry`` is done; move ``processed`` over the done prefix, if it grew."""
        with self._lock:
            entry.done = True
            entries = self._entries
            if not entries or entries[0] is not entry:
                return
            last = entry
            entries.popleft()
            while entries and entries[0].done:
                last = entries.popleft()
            # Under the lock: two finishers must not write their marks in the wrong order.
            self.lease.progress.mark_processed(last.position)
            self._settle()

    def give_up_unstarted(self, anywhere: bool = False) -> list[Entry]:
        """The lease is being handed off: forget the records no call started, so the handoff
        waits only for the calls in flight. By default only those at the end (nothing after
        them started either, so no done record lies beyond them and the mark alone is exact);
        ``anywhere`` (the done runs are written with the checkpoint, so the next owner skips
        the done records after a gap): every one. Once the records left are done or dropped,
        ``delivered`` moves back to ``processed`` (the handoff's wait ends). Returns the
        records given up (the caller takes them out of the scheduler)."""
        with self._lock:
            entries = self._entries
            cut: list[Entry] = []
            if anywhere:
                cut = [e for e in entries if not (e.started or e.done or e.dropped)]
                for entry in cut:
                    entry.dropped = True
            else:
                while entries and not entries[-1].started:
                    cut.append(entries.pop())
            if cut or anywhere:
                self._cut = True
            self._settle()
            return cut

    def _settle(self) -> None:
        """(Under the lock.) Being handed off and nothing left that a call has or will take:
        nothing is in the application's hands any more."""
        if self._cut and all(e.done or e.dropped for e in self._entries):
            self.lease.progress.discard_delivered()

    @property
    def pending(self) -> int:
        """Admitted records the mark has not passed yet (done or not)."""
        return len(self._entries)
