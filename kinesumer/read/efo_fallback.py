"""GetRecords for enhanced fan-out: polling in place of a stalled subscription, from exactly where
the subscriptions were, and the SHARD_END check of closed shards (:class:`EndCheck`).

An :class:`~.efo_fetcher.EfoShardFetcher` whose subscriptions of a shard stalled
``Config.efo_stall_limit`` times in a row (no event for :data:`STALL_AFTER` seconds: refused
with ResourceInUse past AWS's takeover window, a read that waits, a connection that keeps
resetting) reads that shard here for :data:`POLL_FOR` seconds, then subscribes again. The
fetcher's resume point (:class:`ResumePoint`: the SubscribeToShard StartingPosition it would
use next, the checkpoint to skip through, the instant before which leading records are skipped)
becomes a shard iterator at the same record; every batch buffered here moves it on, AFTER the
last record buffered, so that the next subscription starts after it: no gap, no replay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ..aws import error_code, is_transient
from ..config import Config
from ..errors import TransientAWSError
from ..kinesis.reader import IteratorExpired, KinesisReader, arrived_since
from ..models import Position
from ..observability.metrics import Metrics
from ..runtime.aio_timeout import await_within
from .buffer import RecordBuffer
from .fetcher import FAILURE_PAUSE, read_wait
from .progress import ShardLease

log = logging.getLogger("kinesumer.fetcher")

#: A subscription (or a run of refused or failed ones) that gives no event for this long is a
#: stall: AWS sends an event at least every 5 s and lets a new subscription take over after 5 s.
STALL_AFTER = 10.0
#: How long a stalled shard is read by polling before enhanced fan-out is tried again.
POLL_FOR = 60.0
#: A sequence number's every sub-record (skip through the whole record).
WHOLE_RECORD = 2**31


#: Errors that heal by subscribing again later: another subscription to the shard is still
#: open (a takeover, or our own previous one closing), the 1/s/shard limit, server trouble.
RETRY_CODES = frozenset(
    {
        "ResourceInUseException",
        "LimitExceededException",
        "InternalFailure",
        "InternalFailureException",
        "ServiceUnavailable",
        "SubscriptionEnded",
        "SubscriptionStalled",
    }
)


class SubscriptionStalled(Exception):
    """A subscription gave no event for STALL_AFTER seconds (AWS sends one every 5 s at
    least): closed, and counted as a stall."""

    code = "SubscriptionStalled"


T = TypeVar("T")


async def next_event(events: AsyncIterator[T], timeout: float) -> T:
    """The subscription's next event; SubscriptionStalled after ``timeout`` seconds without one.

    Not ``asyncio.wait_for``: on Python 3.10 and 3.11 it returns the event when the caller is
    cancelled just as the event arrives (CPython gh-86296). A fetcher cancelled while its lease
    is still ACTIVE (the engine closing or failing: ``Supervisor.cancel_all``) would then read
    on for ever. ``asyncio.timeout`` (3.11+) awaits in the caller's own task, so a cancellation
    always lands; on 3.10 ``asyncio.wait`` raises the caller's cancellation in every case
    (:func:`~kinesumer.runtime.aio_timeout.await_within`).
    """
    try:
        return await await_within(anext(events), timeout)
    except asyncio.TimeoutError:
        raise SubscriptionStalled(f"no event for {timeout:.0f}s") from None


def retryable(exc: BaseException) -> bool:
    """Whether subscribing again later may succeed; anything else reaches the application."""
    if isinstance(exc, (TransientAWSError, ConnectionError, asyncio.TimeoutError)):
        return True
    code = getattr(exc, "code", None) or error_code(exc)
    return code in RETRY_CODES or is_transient(exc)


@dataclass
class ResumePoint:
    """Where the fetcher reads next. ``position``: SubscribeToShard's StartingPosition (None:
    from ``since_ms``, where a LATEST read began); ``skip``: records up to here were processed;
    ``skip_before``: leading records that arrived before it are skipped."""

    position: dict[str, Any] | None
    skip: Position | None
    skip_before: datetime | None
    since_ms: int | None


class PollingInterlude:
    """Reads one shard by GetRecords from a :class:`ResumePoint` until :data:`POLL_FOR` passed,
    the shard ended or the lease did. :meth:`run` returns False when reading stops (SHARD_END
    or the lease ended) and True when the fetcher should subscribe again from ``resume``."""

    def __init__(
        self,
        lease: ShardLease,
        reader: KinesisReader,
        buffer: RecordBuffer,
        config: Config,
        metrics: Metrics,
        resume: ResumePoint,
        on_shard_end: Callable[[ShardLease], None],
        where: str,
    ) -> None:
        self._lease = lease
        self._reader = reader
        self._buffer = buffer
        self._config = config
        self._metrics = metrics
        self.resume = resume
        self._on_shard_end = on_shard_end
        self._where = where
        self._stream, self._shard_id = lease.key
        #: GetRecords calls made (tests read it).
        self.reads = 0

    async def run(self) -> bool:
        loop = asyncio.get_running_loop()
        until = loop.time() + POLL_FOR
        iterator = await self._open()
        if iterator is None:
            return False
        wait = self._config.scan_interval
        while self._lease.claim.deliverable and loop.time() < until:
            started = loop.time()
            try:
                iterator, empty = await self._read_once(iterator)
            except IteratorExpired:
                iterator, empty = await self._open(), False
            except TransientAWSError as exc:
                log.warning("%s GetRecords failing (%s)", self._where, exc)
                iterator, empty = iterator, True
                await asyncio.sleep(FAILURE_PAUSE)
            if iterator is None:
                return False
            config = self._config
            wait = read_wait(wait, not empty, config.scan_interval, config.idle_poll_interval)
            await asyncio.sleep(max(0.0, started + wait - loop.time()))
        return self._lease.claim.deliverable

    async def _open(self) -> str | None:
        """An iterator at the resume point; None when the lease ended meanwhile."""
        point = self.resume
        position = point.position
        while self._lease.claim.deliverable:
            try:
                if position is None or position["Type"] == "LATEST":
                    if point.since_ms is None:
                        return await self._iterator(None, "LATEST")
                    iterator, skip_before = await self._reader.iterator_since(
                        self._stream, self._shard_id, point.since_ms
                    )
                    point.skip_before = skip_before
                    return iterator
                kind = position["Type"]
                if kind == "AFTER_SEQUENCE_NUMBER":
                    after = Position(position["SequenceNumber"], WHOLE_RECORD)
                    point.skip = after
                    return await self._iterator(after, "TRIM_HORIZON")
                if kind == "AT_SEQUENCE_NUMBER":
                    at = Position(position["SequenceNumber"], 0)
                    return await self._iterator(point.skip or at, "TRIM_HORIZON")
                if kind == "AT_TIMESTAMP":
                    return await self._iterator(None, position["Timestamp"])
                return await self._iterator(None, "TRIM_HORIZON")
            except TransientAWSError as exc:
                log.warning("%s GetShardIterator failing (%s)", self._where, exc)
                await asyncio.sleep(FAILURE_PAUSE)
        return None

    async def _iterator(self, after: Position | None, initial: Any) -> str:
        return await self._reader.shard_iterator(self._stream, self._shard_id, after, initial)

    async def _read_once(self, iterator: str) -> tuple[str | None, bool]:
        """One GetRecords into the buffer: (the next iterator, None when reading stops; whether
        the read was empty at the tip)."""
        point, buffer, lease = self.resume, self._buffer, self._lease
        reserved = await buffer.reserve(self._config.scan_limit)
        try:
            self.reads += 1
            batch = await self._reader.get_records(
                self._stream, self._shard_id, iterator, reserved, point.skip
            )
            if not lease.claim.deliverable:
                return None, True
            records = batch.records
            if point.skip_before is not None and records:
                records, reached = arrived_since(records, point.skip_before)
                if reached:
                    point.skip_before = None
                batch = dataclasses.replace(batch, records=records)
            lease.progress.observe_read(batch.millis_behind, batch.raw_count)
            self._metrics.behind(self._stream, self._shard_id, batch.millis_behind)
            if records:
                last = records[-1]
                lease.progress.mark_fetched(
                    Position(last.sequence_number, last.sub_sequence_number)
                )
                await buffer.put(lease, records, reserved)
                reserved = 0
                # Past the resume point only now: a read of nothing but the records skipped
                # (the checkpointed one, processed) must leave the skip for the next reader.
                point.skip = None
                point.position = {
                    "Type": "AFTER_SEQUENCE_NUMBER",
                    "SequenceNumber": last.sequence_number,
                }
            if batch.next_iterator is None:
                log.info("%s reached SHARD_END (polling)", self._where)
                lease.progress.mark_end()
                self._on_shard_end(lease)
                return None, True
            return batch.next_iterator, not batch.raw_count and not batch.millis_behind
        finally:
            if reserved:
                buffer.release(reserved)


#: How often an idle subscription of a closed shard checks, with GetRecords, that it is drained.
END_CHECK_INTERVAL = 5.0
#: GetRecords calls one check makes at most before concluding "not drained yet".
MAX_END_CHECK_READS = 3


class EndCheck:
    """Whether a closed shard has nothing after ``continuation`` (GetRecords gives no record past
    it and no next iterator): its SHARD_END, for endpoints whose subscriptions of a closed shard
    never say so. Open shards (per the group's shard cache) are never checked."""

    def __init__(self, reader: KinesisReader, stream: str, closed: Callable[[str], bool]) -> None:
        self._reader = reader
        self._stream = stream
        self._closed = closed

    async def __call__(self, shard_id: str, continuation: str) -> bool:
        if not self._closed(shard_id):
            return False
        after = Position(continuation, 2**31)  # every sub-record of that record was read
        try:
            iterator = await self._reader.shard_iterator(
                self._stream, shard_id, after, "TRIM_HORIZON"
            )
            next_iterator: str | None = iterator
            for _ in range(MAX_END_CHECK_READS):  # the end may take a read or two to show
                if next_iterator is None:
                    return True
                batch = await self._reader.get_records(
                    self._stream, shard_id, next_iterator, 10, after
                )
                if batch.records:
                    return False  # more to come through the subscription
                next_iterator = batch.next_iterator
        except TransientAWSError:
            return False
        return next_iterator is None
