"""The delivery side: hands buffered records to the application and moves the read progress.

One admission check (:meth:`Cursor.admit`) decides for every record, whether it leaves one at a
time (the generator, the async iterator) or in a batch (``poll``): the fence has not passed and
the lease may still deliver. Runs on whatever thread consumes (the sync generator's, or the event
loop for the async faces).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..models import Position, Record
from .progress import ShardLease


class Fence(Protocol):
    """Until when (monotonic clock) this member may deliver: :class:`~.heartbeat.Heartbeat`."""

    @property
    def deadline(self) -> float: ...


class NoFence:
    """Before the engine starts there is nothing to deliver; no deadline applies."""

    deadline = float("inf")


class Cursor:
    """The current batch, and the records in the application's hands.

    In auto-commit mode the record in the application's hands (or the records of the last poll)
    becomes processed when the application asks for more.
    """

    def __init__(self, auto_commit: bool) -> None:
        self._auto = auto_commit
        self.fence: Fence = NoFence()
        # Called (from whatever thread delivers) with a lease the fence made us drop records of.
        self.on_fenced: Callable[[ShardLease], object] = lambda lease: None
        self._records: list[Record] = []
        self._index = 0
        self._lease: ShardLease | None = None
        self._in_hand: tuple[ShardLease, Position] | None = None
        self._polled: dict[ShardLease, Position] = {}

    def set_batch(self, lease: ShardLease, records: list[Record]) -> None:
        """A batch taken from the buffer: deliver from its first record."""
        self._lease, self._records, self._index = lease, records, 0

    def finish_in_hand(self) -> None:
        """Auto-commit mode: what the application holds is processed once it asks for more."""
        if self._auto:
            if self._in_hand is not None:
                lease, position = self._in_hand
                lease.progress.mark_processed(position)
            for lease, position in self._polled.items():
                lease.progress.mark_processed(position)
        self._in_hand = None
        if self._polled:
            self._polled = {}

    def drop_in_hand(self) -> None:
        """Forget what the application holds without counting it as processed."""
        self._in_hand = None
        self._polled = {}

    def admit(self, lease: ShardLease, record: Record) -> bool:
        """The one check every delivered record passes: before the fence, and the claim still
        deliverable (then the progress marks the record delivered, under the claim's lock).
        False: drop the rest of the batch; the next owner reads it from the checkpoint."""
        if time.monotonic() >= self.fence.deadline:
            # Past the fence the others may already be reading this shard: deliver nothing more.
            self._fenced(lease)
            return False
        return lease.progress.mark_delivered(record)

    def next_local(self) -> Record | None:
        """The next deliverable record of the current batch, or None when a new batch is needed."""
        self.finish_in_hand()
        lease = self._lease
        if lease is None:
            return None
        progress = lease.progress
        while self._index < len(self._records):
            record = self._records[self._index]
            self._index += 1
            if progress.skipping and progress.already_done(record):
                if self.skip(lease, record):
                    continue
            elif self.admit(lease, record):
                self._in_hand = (lease, progress.delivered)  # type: ignore[assignment]
                return record
            break
        self._lease = None
        return None

    def skip(self, lease: ShardLease, record: Record) -> bool:
        """Pass over a record the previous owner finished (a done run of the checkpoint), under
        the same check as :meth:`admit`. False: drop the rest of the batch."""
        if time.monotonic() >= self.fence.deadline:
            self._fenced(lease)
            return False
        return lease.progress.skip_done(record)

    def take(self, limit: int, out: list[Record]) -> None:
        """Deliver records of the current batch into ``out`` until it holds ``limit``."""
        lease = self._lease
        if lease is None:
            return
        records = self._records
        progress = lease.progress
        while self._index < len(records) and len(out) < limit:
            record = records[self._index]
            self._index += 1
            if progress.skipping and progress.already_done(record):
                if not self.skip(lease, record):
                    self._lease = None
                    return
            elif self.admit(lease, record):
                out.append(record)
            else:
                self._lease = None
                return
            self._polled[lease] = progress.delivered  # type: ignore[assignment]
        if self._index >= len(records):
            self._lease = None

    def _fenced(self, lease: ShardLease) -> None:
        """Records of ``lease`` are being dropped undelivered: the lease must end *now*. Left
        active, a heartbeat landing late would let it go on after the dropped records (its
        fetcher has read past them) and a later checkpoint would skip them: lost. Lost instead,
        the shard is claimed again and read from its checkpoint."""
        lease.claim.fence()
        self.on_fenced(lease)
