"""The bounded record buffer between the fetchers and the delivery side.

Fetchers reserve room before each GetRecords and put what came back; the delivery side takes the
oldest batch. When the engine fails, the failure travels through here to whoever waits for
records.
"""

from __future__ import annotations

import asyncio
import collections

from ..kinesis.kpl import record_cost
from ..models import Record
from .progress import ShardLease


class EngineFailed(Exception):
    """Internal: wraps the error that stopped the engine while it travels to the caller."""


class RecordBuffer:
    """Batches fetched from all owned shards, bounded by record count and bytes.

    Before each GetRecords a fetcher reserves room for the records it asks for (its ``Limit``),
    so buffered plus in-flight records never exceed ``max_records``, however many shards a
    member reads: a slow application slows fetching instead of growing memory. A fetcher waits
    for its fair share: the bound divided among the member's fetchers (at most ``scan_limit``),
    so every shard can have a call in flight at once and none starves while another holds room
    for records its shard does not have. Bytes are checked before each call, not reserved
    (GetRecords cannot be limited by size): they may overshoot by one answer per owned shard.
    KPL aggregates count as one record each in ``Limit``, so they can overshoot too. A record
    weighs its data, its partition key and a fixed overhead
    (:func:`~kinesumer.kinesis.kpl.record_cost`): an aggregate of many empty user records
    fills the byte bound by what it costs in memory (it counted 0 bytes before), and
    :data:`~kinesumer.kinesis.kpl.MAX_AGGREGATED_RECORDS` caps one aggregate's records.
    """

    def __init__(self, max_records: int, max_bytes: int) -> None:
        # (lease, records, bytes of data, bytes counted against the bound)
        self._batches: collections.deque[tuple[ShardLease, list[Record], int, int]] = (
            collections.deque()
        )
        self._records = 0
        self._bytes = 0
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._reserved = 0
        self.fetchers = 0  # shards being fetched: each gets a fair share of the bound
        self._notifying: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Condition()
        self._failure: BaseException | None = None

    @property
    def size(self) -> tuple[int, int]:
        """Records buffered and the bytes they count against ``max_bytes``."""
        return self._records, self._bytes

    def _free(self) -> int:
        return self._max_records - self._records - self._reserved

    async def reserve(self, wanted: int) -> int:
        """Wait for room, then reserve it for up to ``wanted`` records: the ``Limit`` of the next
        GetRecords. Give it back with :meth:`put` or :meth:`release`."""
        share = wanted

        def room() -> bool:
            # The share is recomputed at every wake-up: a fetcher that started waiting while
            # few shards were fetched must not wait for more room than a later one needs.
            nonlocal share
            share = max(1, min(wanted, self._max_records // max(1, self.fetchers)))
            return (
                self._free() >= share and self._bytes < self._max_bytes
            ) or self._failure is not None

        async with self._changed:
            await self._changed.wait_for(room)
            self._reserved += share
            return share

    def release(self, reserved: int) -> None:
        """Give back a reservation whose records never came (failed call, lease ended)."""
        self._reserved -= reserved
        # Synchronous (it runs in ``finally`` blocks, also on cancellation); waking the waiters
        # needs the condition's lock, so that happens in a task of its own.
        task = asyncio.get_running_loop().create_task(self._notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def put(self, lease: ShardLease, records: list[Record], reserved: int = 0) -> None:
        """Buffer a fetched batch, turning its reservation into the records that came."""
        size = sum(len(r.data) for r in records)
        cost = sum(map(record_cost, records))
        async with self._changed:
            self._batches.append((lease, records, size, cost))
            self._records += len(records)
            self._reserved -= reserved
            self._bytes += cost
            self._changed.notify_all()

    async def get(self) -> tuple[ShardLease, list[Record], int]:
        """The oldest batch and its bytes of data; raises the engine's failure once nothing is
        left before it."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._batches) or self._failure is not None)
            if self._failure is not None:
                raise EngineFailed() from self._failure
            lease, records, size, cost = self._batches.popleft()
            self._records -= len(records)
            self._bytes -= cost
            self._changed.notify_all()
            return lease, records, size

    async def fail(self, error: BaseException) -> None:
        """The engine stopped (failed, or closed): whoever waits for records gets ``error``."""
        async with self._changed:
            if self._failure is None:
                self._failure = error
            self._changed.notify_all()
