"""One task per owned shard: GetRecords into the shared buffer, paced and resilient."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..config import Config, InitialPosition
from ..errors import TransientAWSError
from ..kinesis.reader import IteratorExpired, KinesisReader
from ..metrics import Metrics
from ..models import Position
from .leases import Lease, RecordBuffer

log = logging.getLogger("kinesumer.fetcher")

#: Longest pause between reads of an idle shard: keeps idle shards cheap while adding at most
#: this much latency to the first record after a quiet spell.
MAX_IDLE_INTERVAL = 1.0
#: Pause after GetRecords kept failing past its retries, before starting over.
FAILURE_PAUSE = 2.0


async def run_fetcher(
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
    """Read ``lease``'s shard into ``buffer`` until the lease stops being deliverable or the
    shard ends. Transient AWS trouble is retried here forever (logged and counted); anything
    else propagates to the engine, which reports it to the application."""
    stream, shard_id = lease.key
    where = f"[{client_id}] {stream}/{shard_id}"
    loop = asyncio.get_running_loop()

    while lease.deliverable and not await parents_finished():  # noqa: ASYNC110 (polls DynamoDB)
        await asyncio.sleep(config.heartbeat_interval)
    if not lease.deliverable:
        return

    async def iterator_at(position: Position | None) -> str | None:
        """A shard iterator, retried while AWS has trouble (5 GetShardIterator/s per shard is
        easy to hit in a big rebalance); None when the lease ended meanwhile."""
        while lease.deliverable:
            try:
                return await reader.shard_iterator(stream, shard_id, position, initial)
            except TransientAWSError as exc:
                log.warning(
                    "%s GetShardIterator failing (%s); pausing %.1fs", where, exc, FAILURE_PAUSE
                )
                await asyncio.sleep(FAILURE_PAUSE)
        return None

    start: Position | None = lease.checkpointed
    first = await iterator_at(start)
    if first is None:
        return
    iterator = first
    skip = start
    log.info("%s reading from %s", where, f"after {start.sequence_number}" if start else initial)
    interval = config.scan_interval
    wait = interval
    next_call = loop.time()
    buffer.fetchers += 1
    try:
        while lease.deliverable:
            delay = next_call - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if not lease.deliverable:
                return
            limit = await buffer.reserve(config.scan_limit)
            reserved = limit  # handed over to the buffer with the records, or released
            try:
                started = loop.time()
                try:
                    batch = await reader.get_records(stream, shard_id, iterator, limit, skip)
                except IteratorExpired:
                    # Resume after the last record we buffered, not the checkpoint: nothing replays.
                    resume = lease.fetched or start
                    log.info("%s iterator expired; resuming at %s", where, resume)
                    renewed = await iterator_at(resume)
                    if renewed is None:
                        return
                    iterator, skip = renewed, resume
                    continue
                except TransientAWSError as exc:
                    log.warning(
                        "%s GetRecords failing (%s); pausing %.1fs", where, exc, FAILURE_PAUSE
                    )
                    next_call = started + FAILURE_PAUSE
                    continue
                if batch.raw_count:
                    skip = None  # the resume point has been passed
                if not lease.deliverable:
                    return  # revoked or lost while the call was in flight: drop what came back
                lease.millis_behind = batch.millis_behind
                metrics.behind(stream, shard_id, batch.millis_behind)
                lease.caught_up = batch.raw_count == 0 and not batch.millis_behind
                if batch.records:
                    last = batch.records[-1]
                    lease.fetched = Position(last.sequence_number, last.sub_sequence_number)
                    await buffer.put(lease, batch.records, reserved)
                    reserved = 0
                if batch.next_iterator is None:
                    log.info("%s reached SHARD_END", where)
                    lease.reached_end = True
                    on_shard_end(lease)
                    return
                iterator = batch.next_iterator
                # At most one call per scan_interval (5/s per shard is the service limit, shared
                # with other consumers); empty reads at the tip back off to MAX_IDLE_INTERVAL.
                behind = batch.millis_behind or 0
                wait = (
                    interval if batch.raw_count or behind > 0 else min(wait * 2, MAX_IDLE_INTERVAL)
                )
                next_call = started + max(wait, interval)
            finally:
                if reserved:
                    buffer.release(reserved)
    finally:
        buffer.fetchers -= 1
