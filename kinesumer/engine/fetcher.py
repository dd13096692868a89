"""One task per owned shard: GetRecords into the shared buffer, paced and resilient.

:meth:`ShardFetcher.run` reads in named steps: wait until the shard's parents are finished, open
an iterator after the checkpoint, then read (reserve room, GetRecords, buffer the records, pace)
until the lease stops being deliverable or the shard ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..config import Config, InitialPosition
from ..errors import TransientAWSError
from ..kinesis.reader import IteratorExpired, KinesisReader, ShardBatch
from ..metrics import Metrics
from ..models import Position
from .buffer import RecordBuffer
from .leases import Lease

log = logging.getLogger("kinesumer.fetcher")

#: Longest pause between reads of an idle shard: keeps idle shards cheap while adding at most
#: this much latency to the first record after a quiet spell.
MAX_IDLE_INTERVAL = 1.0
#: Pause after GetRecords kept failing past its retries, before starting over.
FAILURE_PAUSE = 2.0


async def wait_for_parents(
    lease: Lease, parents_finished: Callable[[], Awaitable[bool]], interval: float
) -> bool:
    """Parents before children: poll until every parent of the shard is checkpointed finished.
    False when the lease ended meanwhile."""
    while lease.deliverable and not await parents_finished():  # noqa: ASYNC110 (polls DynamoDB)
        await asyncio.sleep(interval)
    return lease.deliverable


class ShardFetcher:
    """Reads ``lease``'s shard into ``buffer``. Transient AWS trouble is retried here forever
    (logged and counted); anything else propagates to the engine, which reports it."""

    def __init__(
        self,
        lease: Lease,
        reader: KinesisReader,
        buffer: RecordBuffer,
        config: Config,
        initial: InitialPosition,
        parents_finished: Callable[[], Awaitable[bool]],
        on_shard_end: Callable[[Lease], None],
        client_id: str,
        metrics: Metrics,
    ) -> None:
        self._lease = lease
        self._reader = reader
        self._buffer = buffer
        self._config = config
        self._initial = initial
        self._parents_finished = parents_finished
        self._on_shard_end = on_shard_end
        self._metrics = metrics
        self._stream, self._shard_id = lease.key
        self._where = f"[{client_id}] {self._stream}/{self._shard_id}"
        self._start: Position | None = lease.checkpointed
        self._iterator = ""
        # Records up to here were read before (a resumed iterator): GetRecords skips them.
        self._skip: Position | None = self._start
        self._wait = config.scan_interval
        self._next_call = 0.0

    async def run(self) -> None:
        lease = self._lease
        if not await wait_for_parents(
            lease, self._parents_finished, self._config.heartbeat_interval
        ):
            return
        first = await self._iterator_at(self._start)
        if first is None:
            return
        self._iterator = first
        start = self._start
        log.info(
            "%s reading from %s",
            self._where,
            f"after {start.sequence_number}" if start else self._initial,
        )
        loop = asyncio.get_running_loop()
        self._next_call = loop.time()
        self._buffer.fetchers += 1
        try:
            while lease.deliverable:
                delay = self._next_call - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not lease.deliverable or not await self._read_once():
                    return
        finally:
            self._buffer.fetchers -= 1

    async def _iterator_at(self, position: Position | None) -> str | None:
        """A shard iterator, retried while AWS has trouble (5 GetShardIterator/s per shard is
        easy to hit in a big rebalance); None when the lease ended meanwhile."""
        while self._lease.deliverable:
            try:
                return await self._reader.shard_iterator(
                    self._stream, self._shard_id, position, self._initial
                )
            except TransientAWSError as exc:
                log.warning(
                    "%s GetShardIterator failing (%s); pausing %.1fs",
                    self._where,
                    exc,
                    FAILURE_PAUSE,
                )
                await asyncio.sleep(FAILURE_PAUSE)
        return None

    async def _read_once(self) -> bool:
        """Reserve room, call GetRecords once, buffer what came. False: stop reading (the lease
        ended, or the shard did)."""
        buffer = self._buffer
        limit = await buffer.reserve(self._config.scan_limit)
        reserved = limit  # handed over to the buffer with the records, or released
        try:
            started = asyncio.get_running_loop().time()
            try:
                batch = await self._reader.get_records(
                    self._stream, self._shard_id, self._iterator, limit, self._skip
                )
            except IteratorExpired:
                return await self._renew_iterator()
            except TransientAWSError as exc:
                log.warning(
                    "%s GetRecords failing (%s); pausing %.1fs", self._where, exc, FAILURE_PAUSE
                )
                self._next_call = started + FAILURE_PAUSE
                return True
            if batch.raw_count:
                self._skip = None  # the resume point has been passed
            if not self._lease.deliverable:
                return False  # revoked or lost while the call was in flight: drop what came
            self._observe(batch)
            if batch.records:
                last = batch.records[-1]
                self._lease.mark_fetched(Position(last.sequence_number, last.sub_sequence_number))
                await buffer.put(self._lease, batch.records, reserved)
                reserved = 0
            if batch.next_iterator is None:
                log.info("%s reached SHARD_END", self._where)
                self._lease.mark_end()
                self._on_shard_end(self._lease)
                return False
            self._iterator = batch.next_iterator
            self._pace(started, batch)
            return True
        finally:
            if reserved:
                buffer.release(reserved)

    async def _renew_iterator(self) -> bool:
        """Resume after the last record we buffered, not the checkpoint: nothing replays."""
        resume = self._lease.fetched or self._start
        log.info("%s iterator expired; resuming at %s", self._where, resume)
        renewed = await self._iterator_at(resume)
        if renewed is None:
            return False
        self._iterator, self._skip = renewed, resume
        return True

    def _observe(self, batch: ShardBatch) -> None:
        self._lease.observe_read(batch.millis_behind, batch.raw_count)
        self._metrics.behind(self._stream, self._shard_id, batch.millis_behind)

    def _pace(self, started: float, batch: ShardBatch) -> None:
        """At most one call per scan_interval (5/s per shard is the service limit, shared with
        other consumers); empty reads at the tip back off to MAX_IDLE_INTERVAL."""
        interval = self._config.scan_interval
        behind = batch.millis_behind or 0
        self._wait = (
            interval if batch.raw_count or behind > 0 else min(self._wait * 2, MAX_IDLE_INTERVAL)
        )
        self._next_call = started + max(self._wait, interval)
