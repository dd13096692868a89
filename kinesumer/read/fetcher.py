"""One task per owned shard: GetRecords into the shared buffer, paced and resilient.

:meth:`ShardFetcher.run` reads in named steps: wait until the shard's parents are finished, open
an iterator after the checkpoint, then read (reserve room, GetRecords, buffer the records, pace)
until the lease stops being deliverable or the shard ends.

A shard with no checkpoint read from ``LATEST`` has no record to resume after until its first
one is processed: where its reading began (Kinesis's clock, see
:func:`~kinesumer.kinesis.reader.start_instant_ms`) is recorded in its checkpoint item before
any record is buffered (``record_start``), and every reopening (an expired iterator here, the
next owner after a handoff, a crash or a lost lease) starts from that instant, never later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

from ..config import Config, InitialPosition
from ..errors import TransientAWSError
from ..group.leases import wait_for_parents
from ..kinesis.reader import IteratorExpired, KinesisReader, ShardBatch, arrived_since
from ..models import Position, Record
from ..observability.metrics import Metrics
from .buffer import RecordBuffer
from .progress import ShardLease

log = logging.getLogger("kinesumer.fetcher")

#: Pause after GetRecords kept failing past its retries, before starting over.
FAILURE_PAUSE = 2.0

T = TypeVar("T")

#: Records where a ``LATEST`` read of the lease's shard began (epoch ms), before its first
#: record is handed out. False: the lease was lost (stop reading).
RecordStart = Callable[[ShardLease, int], Awaitable[bool]]


class ShardFetcher:
    """Reads ``lease``'s shard into ``buffer``. Transient AWS trouble is retried here forever
    (logged and counted); anything else propagates to the engine, which reports it."""

    def __init__(
        self,
        lease: ShardLease,
        reader: KinesisReader,
        buffer: RecordBuffer,
        config: Config,
        initial: InitialPosition,
        parents_finished: Callable[[], Awaitable[bool]],
        on_shard_end: Callable[[ShardLease], None],
        client_id: str,
        metrics: Metrics,
        record_start: RecordStart | None = None,
    ) -> None:
        self._lease = lease
        self._record_start = record_start
        self._reader = reader
        self._buffer = buffer
        self._config = config
        self._initial = initial
        self._parents_finished = parents_finished
        self._on_shard_end = on_shard_end
        self._metrics = metrics
        self._stream, self._shard_id = lease.key
        self._where = f"[{client_id}] {self._stream}/{self._shard_id}"
        self._start: Position | None = lease.claim.checkpointed
        #: Where a LATEST read of the shard began (epoch ms), by this owner or an earlier one:
        #: while nothing was fetched, every reopening starts there.
        self._since_ms = lease.claim.checkpoint.started_at_ms if self._start is None else None
        #: Leading records that arrived before this are skipped (a scan standing in for
        #: AT_TIMESTAMP, see KinesisReader.scan_since).
        self._skip_before: datetime | None = None
        self._iterator = ""
        # Records up to here were read before (a resumed iterator): GetRecords skips them.
        self._skip: Position | None = self._start
        self._wait = config.scan_interval
        self._next_call = 0.0

    async def run(self) -> None:
        lease = self._lease
        if not await wait_for_parents(
            lease.claim, self._parents_finished, self._config.heartbeat_interval
        ):
            return
        first = await self._open()
        if first is None:
            return
        self._iterator = first
        start = self._start
        log.info(
            "%s reading from %s",
            self._where,
            f"after {start.sequence_number}"
            if start
            else f"{self._initial} (recorded start {self._since_ms})",
        )
        loop = asyncio.get_running_loop()
        self._next_call = loop.time()
        self._buffer.fetchers += 1
        try:
            while lease.claim.deliverable:
                delay = self._next_call - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not lease.claim.deliverable or not await self._read_once():
                    return
        finally:
            self._buffer.fetchers -= 1

    async def _open(self) -> str | None:
        """The first iterator: after the checkpoint; else from where an earlier LATEST read
        began; else at LATEST, recorded before any record is read; else the initial position.
        None when the lease ended meanwhile."""
        if self._start is None and self._since_ms is not None:
            return await self._reopen_since(self._since_ms)
        if self._start is None and self._initial == "LATEST":
            opened = await self._retrying(
                "GetShardIterator",
                lambda: self._reader.open_latest(self._stream, self._shard_id),
            )
            if opened is None:
                return None
            iterator, since = opened
            if self._record_start is not None and not await self._record_start(self._lease, since):
                return None
            self._since_ms = since
            return iterator
        return await self._iterator_at(self._start)

    async def _reopen_since(self, since_ms: int) -> str | None:
        opened = await self._retrying(
            "GetShardIterator",
            lambda: self._reader.iterator_since(self._stream, self._shard_id, since_ms),
        )
        if opened is None:
            return None
        iterator, self._skip_before = opened
        return iterator

    async def _iterator_at(self, position: Position | None) -> str | None:
        """A shard iterator, retried while AWS has trouble (5 GetShardIterator/s per shard is
        easy to hit in a big rebalance); None when the lease ended meanwhile."""
        return await self._retrying(
            "GetShardIterator",
            lambda: self._reader.shard_iterator(
                self._stream, self._shard_id, position, self._initial
            ),
        )

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """``call()``, again after a pause while AWS has trouble; None when the lease ended."""
        while self._lease.claim.deliverable:
            try:
                return await call()
            except TransientAWSError as exc:
                log.warning(
                    "%s %s failing (%s); pausing %.1fs", self._where, what, exc, FAILURE_PAUSE
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
            if self._skip_before is not None and batch.records:
                kept, reached = arrived_since(batch.records, self._skip_before)
                if reached:
                    self._skip_before = None
                batch = dataclasses.replace(batch, records=kept)
            if not self._lease.claim.deliverable:
                return False  # revoked or lost while the call was in flight: drop what came
            self._observe(batch)
            if batch.records:
                last = batch.records[-1]
                self._lease.progress.mark_fetched(
                    Position(last.sequence_number, last.sub_sequence_number)
                )
                await buffer.put(self._lease, batch.records, reserved)
                reserved = 0
            if batch.next_iterator is None:
                log.info("%s reached SHARD_END", self._where)
                self._lease.progress.mark_end()
                self._on_shard_end(self._lease)
                return False
            self._iterator = batch.next_iterator
            self._pace(started, batch)
            return True
        finally:
            if reserved:
                buffer.release(reserved)

    async def _renew_iterator(self) -> bool:
        """Resume after the last record we buffered, not the checkpoint: nothing replays. With
        nothing buffered yet, from where the read began (a LATEST start: its recorded instant;
        else the checkpoint or the initial position, which do not move)."""
        resume = self._lease.progress.fetched or self._start
        if resume is None and self._since_ms is not None:
            log.info("%s iterator expired; reading again from %d", self._where, self._since_ms)
            renewed = await self._reopen_since(self._since_ms)
        else:
            log.info("%s iterator expired; resuming at %s", self._where, resume)
            renewed = await self._iterator_at(resume)
            self._skip_before = None
        if renewed is None:
            return False
        self._iterator, self._skip = renewed, resume
        return True

    def _observe(self, batch: ShardBatch[list[Record]]) -> None:
        self._lease.progress.observe_read(batch.millis_behind, batch.raw_count)
        self._metrics.behind(self._stream, self._shard_id, batch.millis_behind)

    def _pace(self, started: float, batch: ShardBatch[list[Record]]) -> None:
        """At most one call per scan_interval (5/s per shard is the service limit, shared with
        other consumers); empty reads at the tip back off (see :func:`read_wait`)."""
        config = self._config
        found = bool(batch.raw_count or (batch.millis_behind or 0) > 0)
        self._wait = read_wait(self._wait, found, config.scan_interval, config.idle_poll_interval)
        self._next_call = started + self._wait


def read_wait(
    previous: float, found: bool, scan_interval: float, idle_poll_interval: float
) -> float:
    """Seconds from one GetRecords call to the next on a shard: ``scan_interval`` after a read
    that found records (or is behind the tip); after an empty read at the tip, the previous wait
    doubled, up to ``idle_poll_interval`` (never below ``scan_interval``). Idle shards stay
    cheap, and the first record after a quiet spell waits at most ``idle_poll_interval``."""
    if found:
        return scan_interval
    return max(scan_interval, min(previous * 2, max(idle_poll_interval, scan_interval)))
