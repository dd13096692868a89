"""One task per owned shard read by enhanced fan-out: SubscribeToShard events into the buffer.

The twin of :class:`~.fetcher.ShardFetcher` for ``Config(enhanced_fan_out=True)``: the same
lease, buffer, parents-first wait, KPL unpacking and SHARD_END path, records pushed not pulled.

:meth:`EfoShardFetcher.run` subscribes from the lease's start (AT the checkpoint's sequence
number, skipping what was processed, as the polling path does inside KPL aggregates; or the
initial position; TRIM_HORIZON for a child shard) and, for each event, reserves room in the
buffer and puts the records (waiting for room is the backpressure: the subscriber reads the
HTTP/2 stream only when asked for the next event, so flow control stops the server). When a
subscription ends (every 5 minutes, or a reset), it subscribes again AFTER the continuation
sequence number of the last event whose records were all buffered: no gap, no replay. An event
without a continuation sequence number is SHARD_END.

A ``LATEST`` start without a checkpoint is recorded first, as the polling fetcher does (where the
read began, by Kinesis's clock, in the checkpoint item): a subscription that ends before its
first event (refused with ResourceInUse during a takeover, reset) and the next owner subscribe
from that instant, never later. A subscription that finds the consumer gone (deregistered) has
the session look the stream and consumer up again, registering it, and goes on from where it was.

No silent stall: STALL_AFTER seconds without progress (no event, refusals, failures, empty events
that stay behind) is a stall (logged, ``stats()``, metrics); after ``Config.efo_stall_limit`` in
a row the shard is polled from the same position for a while, then subscribed again (efo_fallback).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from ..aws import error_code
from ..config import Config, InitialPosition
from ..errors import TransientAWSError
from ..group.leases import wait_for_parents
from ..kinesis.kpl import Unaggregated, to_records
from ..kinesis.reader import KinesisReader, arrived_since
from ..models import Position, Record
from ..observability.metrics import Metrics
from .buffer import RecordBuffer
from .efo_fallback import (
    END_CHECK_INTERVAL,
    STALL_AFTER,
    PollingInterlude,
    ResumePoint,
    SubscriptionStalled,
    next_event,
    retryable,
)
from .efo_fallback import EndCheck as EndCheck  # re-exported: the engine builds it
from .fetcher import FAILURE_PAUSE, RecordStart
from .progress import ShardLease

log = logging.getLogger("kinesumer.fetcher")

#: AWS allows one SubscribeToShard per second per shard and consumer.
MIN_SUBSCRIBE_INTERVAL = 1.0
#: Longest pause between failed subscriptions (exponential backoff with full jitter up to it).
MAX_FAILURE_PAUSE = 5.0


class ShardEvent(Protocol):
    """What the fetcher reads of a SubscribeToShard event (kinesis/efo/subscriber.py)."""

    @property
    def records(self) -> list[dict[str, Any]]: ...
    @property
    def continuation_sequence_number(self) -> str | None: ...
    @property
    def millis_behind_latest(self) -> int | None: ...
    @property
    def child_shards(self) -> list[dict[str, Any]] | None: ...


class Subscriber(Protocol):
    """The transport: one member's HTTP/2 subscriptions (kinesis/efo/subscriber.py)."""

    def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[ShardEvent]: ...


def start_position(after: Position | None, initial: InitialPosition) -> dict[str, Any]:
    """SubscribeToShard's StartingPosition for a lease: AT the checkpoint (the caller skips what
    was processed, which also works inside a KPL aggregate), else the initial position."""
    if after is not None:
        return {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": after.sequence_number}
    if isinstance(initial, datetime):
        return {"Type": "AT_TIMESTAMP", "Timestamp": initial}
    return {"Type": initial}


class EfoShardFetcher:
    """Reads ``lease``'s shard into ``buffer`` through enhanced fan-out. Retryable trouble is
    retried here while the lease lasts (logged); anything else propagates to the engine."""

    def __init__(
        self,
        lease: ShardLease,
        subscriber: Subscriber,
        consumer_arn: Callable[[str], Awaitable[str]],
        buffer: RecordBuffer,
        config: Config,
        initial: InitialPosition,
        parents_finished: Callable[[], Awaitable[bool]],
        on_shard_end: Callable[[ShardLease], None],
        client_id: str,
        metrics: Metrics,
        ended: EndCheck | None = None,
        reader: KinesisReader | None = None,
        record_start: RecordStart | None = None,
        forget_consumer: Callable[[str, str], None] | None = None,
        unaggregated: Unaggregated | None = None,
    ) -> None:
        self._lease = lease
        self._unaggregated = unaggregated  # counts records of invalid KPL aggregates
        self._ended = ended
        self._reader = reader
        self._record_start = record_start
        self._forget_consumer = forget_consumer
        self._next_end_check = 0.0
        self._subscriber = subscriber
        self._consumer_arn = consumer_arn
        self._buffer = buffer
        self._config = config
        self._parents_finished = parents_finished
        self._on_shard_end = on_shard_end
        self._metrics = metrics
        self._stream, self._shard_id = lease.key
        self._where = f"[{client_id}] {self._stream}/{self._shard_id}"
        #: Where the next subscription starts; None: from where a LATEST read began.
        self._position: dict[str, Any] | None = start_position(lease.claim.checkpointed, initial)
        # Records up to here were processed before (resuming AT the checkpoint): skip them.
        self._skip: Position | None = lease.claim.checkpointed
        #: Where a LATEST read of the shard began (epoch ms, Kinesis's clock), by this owner or
        #: an earlier one; and leading records that arrived before that instant to skip.
        self._since_ms = (
            lease.claim.checkpoint.started_at_ms if lease.claim.checkpointed is None else None
        )
        if self._since_ms is not None:
            self._position = None
        self._skip_before: datetime | None = None
        self._failures = 0
        self._last_subscribe = float("-inf")
        #: Subscriptions opened (the first one included): tests and logs read it.
        self.subscriptions = 0
        #: Stalls seen (see efo_fallback), in all and in a row; polling interludes run.
        self.stalls, self._stalls_in_row, self.interludes = 0, 0, 0
        self._progress = 0.0  # loop time of the last event (or of the last stall counted)
        self._continuation: str | None = None  # of the last event

    async def run(self) -> None:
        lease = self._lease
        if not await wait_for_parents(
            lease.claim, self._parents_finished, self._config.heartbeat_interval
        ):
            return
        arn: str | None = await self._consumer_arn(self._stream)
        gone: str | None = None  # the consumer ARN last found gone
        if not await self._record_latest_start():
            return
        log.info("%s subscribing from %s", self._where, self._position or self._since_ms)
        self._buffer.fetchers += 1
        self._progress = asyncio.get_running_loop().time()
        try:
            while lease.claim.deliverable:
                stalled = self._stalls_in_row >= self._config.efo_stall_limit
                if stalled and self._reader and not await self._poll_instead(self._reader):
                    return
                await self._pace()
                try:
                    if arn is None:  # the consumer was gone: registered again here
                        arn = await self._consumer_arn(self._stream)
                    if self._position is None and not await self._position_since():
                        return
                    if not await self._subscription(arn):
                        return
                    self._failures = 0
                except Exception as exc:
                    if not lease.claim.deliverable:
                        return  # handed off or lost meanwhile (the member may be closing)
                    if type(exc).__name__ == "SubscriptionEnded":
                        # The transport's word for the 5-minute end: not a failure.
                        log.debug("%s subscription ended (%s)", self._where, exc)
                        continue
                    if self._consumer_gone(exc) and arn is not None and arn != gone:
                        assert self._forget_consumer is not None
                        self._forget_consumer(self._stream, arn)
                        # Looked up again: StreamNotFoundError if the stream went. Found again
                        # and still refused, the error is about something else: raised.
                        arn, gone = None, arn
                    elif not retryable(exc):
                        raise
                    self._count_stall(exc)
                    await self._pause_after(exc)
        finally:
            self._buffer.fetchers -= 1

    def _count_stall(self, exc: BaseException) -> None:
        """A failure after STALL_AFTER seconds without an event is a stall (a ResourceInUse
        past AWS's takeover window, a read that waits, resets again and again)."""
        now = asyncio.get_running_loop().time()
        if now - self._progress < STALL_AFTER:
            return
        self._progress = now
        self.stalls += 1
        self._lease.progress.efo_stalls = self.stalls
        self._stalls_in_row += 1
        self._metrics.efo_stalled(self._stream, self._shard_id)
        polling = self._stalls_in_row >= self._config.efo_stall_limit
        then = "reading by polling next" if polling else "subscribing again"
        cause = getattr(exc, "code", None) or error_code(exc) or type(exc).__name__
        log.warning(
            "%s EFO stalled (%d times, %d in a row; %s): %s",
            *(self._where, self.stalls, self._stalls_in_row, cause, then),
        )

    async def _poll_instead(self, reader: KinesisReader) -> bool:
        """Read the shard by GetRecords from where the subscriptions were, for a while, then
        subscribe again from where polling got to. False: stop reading."""
        point = ResumePoint(self._position, self._skip, self._skip_before, self._since_ms)
        if point.position is not None and point.position.get("Type") == "LATEST":
            point.position = None  # a recorded LATEST start: from that instant
        interlude = PollingInterlude(
            self._lease, reader, self._buffer, self._config, self._metrics, point,
            self._on_shard_end, self._where,
        )  # fmt: skip
        self.interludes += 1
        log.warning("%s EFO stalled: reading by polling (GetRecords) for now", self._where)
        self._lease.progress.efo_polling = True
        try:
            go_on = await interlude.run()
        finally:
            self._lease.progress.efo_polling = False
        self._position, self._skip = point.position, point.skip
        self._skip_before = point.skip_before
        self._stalls_in_row = 0
        self._progress = asyncio.get_running_loop().time()
        if go_on:
            log.info("%s polled %d times; subscribing again", self._where, interlude.reads)
        return go_on

    def _consumer_gone(self, exc: BaseException) -> bool:
        code = getattr(exc, "code", None) or error_code(exc)
        return code == "ResourceNotFoundException" and self._forget_consumer is not None

    async def _record_latest_start(self) -> bool:
        """A LATEST start with nothing recorded: record where reading begins (GetShardIterator
        at LATEST, for Kinesis's clock) before subscribing. False: the lease ended."""
        if self._position != {"Type": "LATEST"} or self._reader is None:
            return True
        reader = self._reader
        while self._lease.claim.deliverable:
            try:
                _, since = await reader.open_latest(self._stream, self._shard_id)
            except TransientAWSError as exc:
                log.warning("%s GetShardIterator failing (%s)", self._where, exc)
                await asyncio.sleep(FAILURE_PAUSE)
                continue
            if self._record_start is not None and not await self._record_start(self._lease, since):
                return False
            # Subscribed from that instant, not at LATEST: a LATEST subscription begins when it
            # is established, after the recorded start, and would skip what arrived between.
            self._since_ms, self._position = since, None
            return True
        return False

    async def _position_since(self) -> bool:
        """Subscribe from where the LATEST read began: AT_TIMESTAMP, or TRIM_HORIZON skipping
        what arrived before when that costs no more (see KinesisReader.scan_since).
        False: the lease ended."""
        assert self._since_ms is not None
        since = datetime.fromtimestamp(self._since_ms / 1000, timezone.utc)
        while self._lease.claim.deliverable:
            try:
                scan = self._reader is not None and (
                    await self._reader.scan_since(self._stream, self._shard_id, since) is not None
                )
            except TransientAWSError as exc:
                log.warning("%s probing the shard failing (%s)", self._where, exc)
                await asyncio.sleep(FAILURE_PAUSE)
                continue
            if scan:
                self._position, self._skip_before = {"Type": "TRIM_HORIZON"}, since
            else:
                self._position = {"Type": "AT_TIMESTAMP", "Timestamp": since}
                self._skip_before = None
            return True
        return False

    async def _pace(self) -> None:
        """At most one SubscribeToShard per second per shard."""
        loop = asyncio.get_running_loop()
        delay = self._last_subscribe + MIN_SUBSCRIBE_INTERVAL - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        self._last_subscribe = loop.time()

    async def _pause_after(self, exc: BaseException) -> None:
        self._failures += 1
        code = getattr(exc, "code", None) or error_code(exc)
        self._metrics.efo_subscribe_failed(self._stream, str(code or type(exc).__name__))
        pause = random.uniform(0, min(MAX_FAILURE_PAUSE, 0.5 * 2**self._failures))
        what = "%s subscription failed (%s: %s); subscribing again in %.1fs"
        log.warning(what, self._where, code, exc, pause)
        await asyncio.sleep(pause)

    async def _subscription(self, arn: str) -> bool:
        """One subscription, read until it ends. False: stop reading (the lease ended, or the
        shard did); True: subscribe again from ``_position``."""
        self.subscriptions += 1
        self._metrics.efo_subscribed(self._stream, self._shard_id)
        assert self._position is not None
        events = self._subscriber.subscribe(arn, self._shard_id, self._position)
        if self._position == {"Type": "LATEST"} and self._since_ms is not None:
            self._position = None  # until an event says where it is: from the recorded start
        try:
            while True:
                try:
                    event = await next_event(events, STALL_AFTER)
                except StopAsyncIteration:
                    break
                if not self._lease.claim.deliverable:
                    return False
                now = asyncio.get_running_loop().time()
                # Empty while behind, but moving on: AWS crossing a stretch with no records.
                moved = event.continuation_sequence_number != self._continuation
                self._continuation = event.continuation_sequence_number
                progress = bool(event.records) or not event.millis_behind_latest or moved
                if not progress and now - self._progress >= STALL_AFTER:  # empty while behind
                    raise SubscriptionStalled(f"no records for {STALL_AFTER:.0f}s while behind")
                if not await self._take(event):
                    return False
                if progress:  # from when _take is done: waiting for room (backpressure) is no stall
                    self._progress, self._stalls_in_row = asyncio.get_running_loop().time(), 0
        finally:
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await closer()
        log.debug("%s subscription ended; resubscribing at %s", self._where, self._position)
        return self._lease.claim.deliverable

    async def _take(self, event: ShardEvent) -> bool:
        """Buffer an event's records, then move the resume point past them. False at SHARD_END
        or when the lease ended while waiting for room."""
        lease = self._lease
        raw = event.records
        records = to_records(self._stream, self._shard_id, raw, self._skip, self._unaggregated)
        if raw:
            self._skip = None  # the resume point has been passed
        if self._skip_before is not None and records:
            records, reached = arrived_since(records, self._skip_before)
            if reached:
                self._skip_before = None
        lease.progress.observe_read(event.millis_behind_latest, len(raw))
        self._metrics.behind(self._stream, self._shard_id, event.millis_behind_latest)
        if records and not await self._put(records):
            return False
        continuation = event.continuation_sequence_number
        if continuation is not None and not raw and await self._drained_after(continuation):
            continuation = None  # an endpoint that never ends a closed shard's subscription
        if continuation is None:
            log.info(
                "%s reached SHARD_END (children %s)",
                self._where,
                [c.get("ShardId") for c in event.child_shards or []] or "from the shard listing",
            )
            lease.progress.mark_end()
            self._on_shard_end(lease)
            return False
        self._position = {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": continuation}
        return True

    async def _drained_after(self, continuation: str) -> bool:
        """Fallback for endpoints that never end a closed shard's subscription (kinesis-local):
        at most every END_CHECK_INTERVAL, on an empty event, ask :class:`EndCheck`."""
        now = asyncio.get_running_loop().time()
        if self._ended is None or now < self._next_end_check:
            return False
        self._next_end_check = now + END_CHECK_INTERVAL
        return await self._ended(self._shard_id, continuation)

    async def _put(self, records: list[Record]) -> bool:
        """Into the buffer in slices that fit the room reserved for them, so that buffered
        records never exceed the bound however big an event is."""
        buffer, lease = self._buffer, self._lease
        start = 0
        while start < len(records):
            reserved = await buffer.reserve(len(records) - start)
            if not lease.claim.deliverable:
                buffer.release(reserved)
                return False
            chunk = records[start : start + reserved]
            last = chunk[-1]
            lease.progress.mark_fetched(Position(last.sequence_number, last.sub_sequence_number))
            await buffer.put(lease, chunk, reserved)
            start += reserved
        return True
