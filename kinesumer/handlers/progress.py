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
and everything after it again. Cheap: one small object per record, O(1) amortised per finish.
Thread-safe: admit and finish may come from different threads.
"""

from __future__ import annotations

import threading
from collections import deque

from ..engine.leases import Lease
from ..models import Position, Record


class Entry:
    """One admitted record: what the scheduler queues and the handler call gets."""

    __slots__ = ("done", "position", "record", "tracker")

    def __init__(self, record: Record, position: Position, tracker: LowWater) -> None:
        self.record = record
        self.position = position
        self.tracker = tracker
        self.done = False

    @property
    def lease(self) -> Lease:
        return self.tracker.lease

    def __repr__(self) -> str:
        record = self.record
        return f"Entry({record.stream}/{record.shard_id}@{record.sequence_number})"


class LowWater:
    """Admitted records of one lease, in order, until the done prefix passes them."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._entries: deque[Entry] = deque()
        self._lock = threading.Lock()

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
            self.lease.mark_processed(last.position)

    @property
    def pending(self) -> int:
        """Admitted records the mark has not passed yet (done or not)."""
        return len(self._entries)
