"""The one asyncio core behind :class:`~kinesumer.Producer` and
:class:`~kinesumer.AsyncProducer`: admission into a bounded buffer, a writer per stream,
every record's outcome, flush, close and the counters behind ``stats()``.

Threads: :meth:`ProducerCore.admit` and :meth:`ProducerCore.submit` may be called from any
thread (the blocking face calls them on the application's threads); everything else runs on the
core's event loop. A submitted record crosses to the loop through an inbox drained by one
scheduled callback, so a burst of puts costs one wake-up of the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator

from ..aws.accounting import RequestStats
from ..aws.clients import AwsClients
from ..config import Config
from ..errors import BufferFullError, FlushError, ProducerClosedError, RecordRejectedError
from ..kinesis.dynamodb_streams import DynamoDBStreamsTransport
from ..kinesis.places import places_for
from ..kinesis.routing import RoutingTransport
from ..kinesis.transport import AwsKinesisTransport, KinesisTransport
from ..observability.metrics import Metrics
from .futures import settle
from .limits import RecordSizeLimits, refuse_over_limit
from .options import ProducerOptions
from .records import MAX_RECORD_BYTES, PendingRecord, PutResult
from .stats import ProducerStats, latency_summary
from .stream import StreamWriter

#: Seconds between reports of the buffer to the metrics while it changes: a bounded rate, not a
#: report per put or per answer (flush and close report at once).
BUFFER_REPORT_INTERVAL = 0.5


@contextlib.asynccontextmanager
async def producer_transport(config: Config) -> AsyncIterator[KinesisTransport]:
    """The transport a producer over AWS writes through: a stream named by name goes to the
    config's Kinesis client; one given by ARN to the client of its (account, region), opened at
    its first put (:class:`~kinesumer.kinesis.places.AccountPlaces`, as the consume side's:
    ``config.accounts``' role for a listed account, the caller's own credentials for its own
    account, :class:`~kinesumer.errors.AccountAccessError` for any other). A producer putting
    to names only opens one client and never asks STS who it is."""
    aws = AwsClients(config, RequestStats())
    try:
        await aws.open(dynamodb=False, kinesis=True)
        # PutRecords always goes leanly (the GetRecords kill switch is the readers' only).
        yield RoutingTransport(
            AwsKinesisTransport(aws.kinesis, lean=True),
            DynamoDBStreamsTransport(aws.dynamodb_streams),  # never called: put() refuses them
            places_for(config, aws),
        )
    finally:
        await aws.close()


class ProducerCore:
    def __init__(
        self,
        options: ProducerOptions,
        config: Config,
        metrics: Metrics,
        kinesis: KinesisTransport | None = None,
    ) -> None:
        """``kinesis``: the transport every Kinesis call goes through; None: open() opens an
        AWS client as ``config`` says and calls through an :class:`AwsKinesisTransport`."""
        self.options = options
        self._config = config
        self._metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stack = contextlib.AsyncExitStack()
        self._given_kinesis = kinesis
        # Set by open(): what the stream writers and the record size limits call.
        self._kinesis: KinesisTransport
        self._record_limits = RecordSizeLimits()
        self._writers: dict[str, StreamWriter] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Admission (any thread).
        self._room = threading.Condition()
        self._buffered_records = 0
        self._buffered_bytes = 0
        self._room_event: asyncio.Event | None = None
        # Inbox (any thread).
        self._inbox_lock = threading.Lock()
        self._inbox: list[PendingRecord] = []
        self._drain_scheduled = False
        self._seq = 0
        self.closed = False
        self._unresolved = 0
        # Loop only.
        self.flushing = False
        self._flush_waiters: list[tuple[int, list[int], asyncio.Future[None]]] = []
        self._failures: Counter[str] = Counter()
        self._first_failure: BaseException | None = None
        self._counts: Counter[str] = Counter()
        self._failures_total: Counter[str] = Counter()
        self._latencies: deque[float] = deque(maxlen=4096)
        # What the PutRecords answer being handled wrote: records, bytes, oldest put-to-ack.
        self._answer: list[float] = [0, 0, 0.0]
        # The buffer (records, bytes) as last reported to the metrics, and the pending report;
        # nothing is scheduled with the metrics off (the default).
        self._reports_buffer = type(metrics) is not Metrics
        self._reported_buffer = (0, 0)
        self._buffer_report: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._room_event = asyncio.Event()
        if self._given_kinesis is not None:
            self._kinesis = self._given_kinesis
            return
        self._kinesis = await self._stack.enter_async_context(producer_transport(self._config))

    # -- any thread --

    def admit(self, size: int, block: bool, timeout: float | None = None) -> None:
        """Reserve buffer room for a record of ``size`` bytes: wait for it (``block``) or raise
        :class:`BufferFullError`. Blocking waits on a thread lock: not for the loop's thread."""
        limit_records, limit_bytes = (
            self.options.max_buffered_records,
            self.options.max_buffered_bytes,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            # A record larger than max_buffered_bytes (a large record, up to 10 MiB) waits for
            # an empty buffer, not for room it could never have.
            while self._buffered_records + 1 > limit_records or (
                self._buffered_bytes + size > limit_bytes and self._buffered_bytes > 0
            ):
                if self.closed:
                    raise ProducerClosedError("this producer was closed; create a new one")
                if not block:
                    raise BufferFullError(self._full_message())
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise BufferFullError(self._full_message())
                self._room.wait(left if left is not None else 1.0)
            self._buffered_records += 1
            self._buffered_bytes += size

    def try_admit(self, size: int) -> bool:
        with self._room:
            if self._buffered_records + 1 > self.options.max_buffered_records or (
                self._buffered_bytes + size > self.options.max_buffered_bytes
                and self._buffered_bytes > 0  # see admit()
            ):
                return False
            self._buffered_records += 1
            self._buffered_bytes += size
            return True

    async def admit_async(self, size: int, block: bool) -> None:
        """:meth:`admit` for the loop's own thread: waits on the loop, not on a lock."""
        assert self._room_event is not None
        while not self.try_admit(size):
            if not block:
                raise BufferFullError(self._full_message())
            if self.closed:
                raise ProducerClosedError("this producer was closed; create a new one")
            self._room_event.clear()
            await self._room_event.wait()

    def _full_message(self) -> str:
        return (
            f"the producer's buffer is full ({self._buffered_records} records, "
            f"{self._buffered_bytes} bytes unwritten; max_buffered_records="
            f"{self.options.max_buffered_records}, max_buffered_bytes="
            f"{self.options.max_buffered_bytes}): wait, flush(), or raise the bounds"
        )

    def submit(self, record: PendingRecord) -> None:
        """Hand an admitted record to the loop."""
        loop = self._loop
        assert loop is not None
        record.put_time = time.monotonic()
        record.deadline = record.put_time + self.options.delivery_timeout
        with self._inbox_lock:
            self._seq += 1
            record.seq = self._seq
            self._inbox.append(record)
            schedule = not self._drain_scheduled
            self._drain_scheduled = True
        if schedule:
            loop.call_soon_threadsafe(self._drain)

    # -- the loop --

    async def check_large(self, record: PendingRecord) -> None:
        """Raise :class:`~kinesumer.errors.RecordTooLargeError` when ``record`` (over 1 MiB:
        ``put`` asks only then) exceeds its stream's maximum record size (:mod:`.limits`)."""
        limit = await self._record_limits.limit_for(self._kinesis, record.stream, record.size)
        refuse_over_limit(record.stream, record.size, limit)

    def check_large_known(self, record: PendingRecord) -> None:
        """:meth:`check_large` without asking Kinesis: against the limit learned already, if
        any (else Kinesis judges the record). For a ``put`` made on the producer's own loop (a
        future's done-callback), which must not wait for that loop."""
        limit = self._record_limits.known(record.stream)
        if limit is not None:
            refuse_over_limit(record.stream, record.size, limit)

    def _drain(self) -> int:
        """Route the inbox's records to their writers; the put order (seq) reached."""
        with self._inbox_lock:
            records, self._inbox = self._inbox, []
            self._drain_scheduled = False
            reached = self._seq
        self._unresolved += len(records)
        if self._reports_buffer and self._buffer_report is None:
            self._schedule_buffer_report()
        for record in records:
            writer = self._writers.get(record.stream)
            if writer is None:
                writer = self._start_writer(record.stream)
            writer.add(record)
        return reached

    def _start_writer(self, stream: str) -> StreamWriter:
        writer = StreamWriter(stream, self._kinesis, self.options, self)
        self._writers[stream] = writer
        task = asyncio.get_running_loop().create_task(self._run_writer(writer))
        self._tasks[stream] = task
        return writer

    async def _run_writer(self, writer: StreamWriter) -> None:
        try:
            await writer.run()
        finally:
            # A writer that stopped (closed, or the stream missing) is forgotten: a later put
            # to the stream starts a new one, which lists the shards again.
            if self._writers.get(writer.stream) is writer:
                del self._writers[writer.stream]
                self._tasks.pop(writer.stream, None)

    def succeeded(self, written: list[tuple[PendingRecord, PutResult]]) -> None:
        """Records of one answer written: resolve their futures, then give their buffer room
        back once (not once per record: a lock, a wake-up and a flush check each)."""
        if not written:
            return
        now = time.monotonic()
        latencies = self._latencies
        nbytes = 0
        oldest = 0.0
        for record, result in written:
            nbytes += record.size
            latency = now - record.put_time
            latencies.append(latency)
            oldest = max(oldest, latency)
            settle(record.future, result)
        self._counts["records_put"] += len(written)
        self._counts["bytes_put"] += nbytes
        delta = self._answer
        delta[0] += len(written)
        delta[1] += nbytes
        delta[2] = max(delta[2], oldest)
        self._resolved([record for record, _ in written], nbytes)

    def failed(self, record: PendingRecord, error: BaseException) -> None:
        if record.size > MAX_RECORD_BYTES and isinstance(error, RecordRejectedError):
            # Its stream's limit may have been lowered since it was learned: ask again.
            self._record_limits.forget(record.stream)
        name = type(error).__name__
        self._failures[name] += 1
        self._failures_total[name] += 1
        if self._first_failure is None:
            self._first_failure = error
        self._metrics.produce_failed(record.stream, name)
        settle(record.future, error=error)
        self._resolved([record], record.size)

    def retried(self, stream: str, entries: int, throttled: int) -> None:
        self._counts["retries"] += entries
        self._counts["throttled_entries"] += throttled
        self._metrics.produce_retried(stream, entries, throttled)

    def called(self, stream: str, seconds: float, error: str | None) -> None:
        """A PutRecords call was answered (after its records' outcomes): report it and what it
        wrote to the metrics, once per call."""
        self._counts["calls"] += 1
        self._metrics.aws_call("kinesis", "PutRecords", seconds, error, 0.0)
        records, nbytes, oldest = self._answer
        if records:
            self._metrics.produced(stream, int(records), int(nbytes), oldest)
        self._answer = [0, 0, 0.0]

    def _resolved(self, records: list[PendingRecord], nbytes: int) -> None:
        """``records`` (of ``nbytes``) have their outcome: their buffer room is free."""
        self._unresolved -= len(records)
        with self._room:
            self._buffered_records -= len(records)
            self._buffered_bytes -= nbytes
            self._room.notify_all()
        if self._room_event is not None:
            self._room_event.set()
        if self._reports_buffer and self._buffer_report is None:
            self._schedule_buffer_report()
        for seq, remaining, waiter in self._flush_waiters:
            remaining[0] -= sum(1 for record in records if record.seq <= seq)
            if remaining[0] == 0 and not waiter.done():
                waiter.set_result(None)

    def _schedule_buffer_report(self) -> None:
        loop = asyncio.get_running_loop()
        self._buffer_report = loop.call_later(BUFFER_REPORT_INTERVAL, self._report_buffer)

    def _report_buffer(self, final: bool = False) -> None:
        """Tell the metrics how the buffer changed since the last report; ``final``: take back
        all this producer reported (closed: its records are no longer its to hold)."""
        if self._buffer_report is not None:
            self._buffer_report.cancel()
            self._buffer_report = None
        if not self._reports_buffer:
            return
        with self._room:
            now = (0, 0) if final else (self._buffered_records, self._buffered_bytes)
        before, self._reported_buffer = self._reported_buffer, now
        if now != before:
            self._metrics.produce_buffer_changed(now[0] - before[0], now[1] - before[1])

    async def flush(self) -> None:
        """Wait until every record submitted so far is written or failed; raise
        :class:`FlushError` if any record failed since the last flush."""
        # Every record drained here has seq <= the seq reached, and every unresolved record was
        # drained: the waiter counts exactly the records put before this flush.
        seq = self._drain()
        unresolved = self._unresolved
        if unresolved:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (seq, [unresolved], waiter)
            self._flush_waiters.append(entry)
            self.flushing = True
            for writer in self._writers.values():
                writer.wake.set()
            try:
                await waiter
            finally:
                self._flush_waiters.remove(entry)
                self.flushing = bool(self._flush_waiters)
        self._report_buffer()
        if self._failures:
            failures, first = dict(self._failures), self._first_failure
            self._failures.clear()
            self._first_failure = None
            raise FlushError(failures, first)

    async def close(self) -> None:
        """Flush, stop every writer, close the client. FlushError if anything failed."""
        try:
            await self.flush()
        finally:
            self.closed = True
            with self._room:
                self._room.notify_all()
            for writer in self._writers.values():
                writer.closing = True
                writer.wake.set()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self._report_buffer(final=True)
            await self._stack.aclose()
            self._metrics.close()

    def stats(self) -> ProducerStats:
        with self._room:
            buffered, buffered_bytes = self._buffered_records, self._buffered_bytes
        return ProducerStats(
            records_put=self._counts["records_put"],
            bytes_put=self._counts["bytes_put"],
            calls=self._counts["calls"],
            retries=self._counts["retries"],
            throttled_entries=self._counts["throttled_entries"],
            records_failed=sum(self._failures_total.values()),
            failures=dict(self._failures_total),
            buffered_records=buffered,
            buffered_bytes=buffered_bytes,
            latency=latency_summary(list(self._latencies)),
        )
