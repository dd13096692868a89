"""Kinesis micro-batches into PySpark: :func:`foreach_batch`.

::

    from kinesumer import Config
    from kinesumer.spark import BatchInfo, foreach_batch

    def write(df, batch_id, info: BatchInfo):
        df.write.mode("append").parquet("s3://bucket/orders/")

    config = Config(app="orders-etl", dynamodb_table="kinesumer-state", region="eu-west-1")
    summary = foreach_batch(spark, config, ["orders"], write, max_records=50_000)

The driver process is one member of the consumer group. Records of its shards are collected into
micro-batches (bounded by records, bytes and time), each batch becomes **one** DataFrame built
through Arrow, ``fn(df, batch_id[, info])`` runs, and only after it returns are the batch's
checkpoints written. If ``fn`` raises, nothing of that batch is checkpointed, the consumer is
closed and the error reaches the caller: the next run delivers the batch again (at-least-once;
make the sink idempotent with :class:`BatchInfo`'s per-shard ranges).

pyspark and pyarrow are imported lazily, so ``import kinesumer.spark`` works without them; using
it without them raises :class:`SparkNotInstalledError`, which names the extra to install
(``pip install 'kinesumer[spark]'``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

from ..config import Config, check_streams
from ..consumer.sync import Kinesumer
from ..engine.hooks import Hook
from ..engine.leases import LeaseStatus
from ..errors import KinesumerError
from ..models import Record

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BATCH_HANDOFF_TIMEOUT",
    "COLUMNS",
    "BatchFunction",
    "BatchInfo",
    "RunSummary",
    "ShardRange",
    "SparkNotInstalledError",
    "arrow_schema",
    "foreach_batch",
    "records_to_arrow",
    "records_to_dataframe",
]

log = logging.getLogger("kinesumer.spark")

#: The DataFrame's columns, in order: the fields of :class:`~kinesumer.Record`.
COLUMNS: tuple[str, ...] = Record._fields

#: ``Config.handoff_timeout`` used by :func:`foreach_batch` when the config keeps the library's
#: default (5 s, sized for one record in hand). A shard moving away waits for the batch in flight
#: to be committed; a Spark write easily takes longer than 5 s, and the wait ends as soon as the
#: batch commits, so a generous bound costs nothing in the usual case.
BATCH_HANDOFF_TIMEOUT = 60.0


def _library_default_handoff() -> float:
    for f in dataclasses.fields(Config):
        if f.name == "handoff_timeout" and isinstance(f.default, (int, float)):
            return float(f.default)
    return 5.0  # pragma: no cover - the field always has a default


_DEFAULT_HANDOFF_TIMEOUT = _library_default_handoff()

#: Longest a single poll blocks: how quickly a stop request (event or signal) is noticed while
#: waiting for records, and how often the drain condition is re-checked in ``available_now``.
_TICK = 0.25

#: ``available_now``: coordinator ticks the drained state must survive before the run ends, so
#: that shards about to arrive (a rebalance in progress, children of a finished parent, which
#: are claimed at the next tick) are not missed.
_SETTLE_TICKS = 2

_EXTRA_HINT = "pip install 'kinesumer[spark]'"


class SparkNotInstalledError(KinesumerError, ImportError):
    """pyspark or pyarrow is missing: ``pip install 'kinesumer[spark]'``.

    Both a :class:`~kinesumer.KinesumerError` (the library's one exception tree) and an
    :class:`ImportError` (what code that probes optional dependencies already catches).
    """


def _missing(modules: tuple[str, ...]) -> SparkNotInstalledError | None:
    """The error naming every module of ``modules`` that cannot be imported, or None."""
    missing: list[str] = []
    cause: ImportError | None = None
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(module.split(".")[0])
            cause = cause or exc
    if not missing:
        return None
    error = SparkNotInstalledError(
        f"kinesumer.spark needs pyspark and pyarrow; not installed: {', '.join(missing)}. "
        f"Install them with: {_EXTRA_HINT}",
        name=missing[0],
    )
    error.__cause__ = cause  # the original ImportError, shown as "the direct cause"
    return error


def _require_pyarrow() -> Any:
    error = _missing(("pyarrow",))
    if error is not None:
        raise error
    return importlib.import_module("pyarrow")


def _require_spark() -> None:
    error = _missing(("pyspark.sql", "pyarrow"))
    if error is not None:
        raise error


# -- what fn sees -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardRange:
    """The records of one shard in a batch (or a run): first and last position, and how many.

    Records of a shard arrive in sequence order, so a sink can make its writes idempotent per
    shard: remember the last position written, skip what is not past it. Sequence numbers are
    decimal strings of up to 56 digits; compare them as integers (:meth:`contains` does).
    """

    stream: str
    shard_id: str
    first_sequence_number: str
    first_sub_sequence_number: int
    last_sequence_number: str
    last_sub_sequence_number: int
    count: int

    def contains(self, sequence_number: str, sub_sequence_number: int = 0) -> bool:
        """Whether the position lies between the first and last record (inclusive)."""
        position = (int(sequence_number), sub_sequence_number)
        first = (int(self.first_sequence_number), self.first_sub_sequence_number)
        last = (int(self.last_sequence_number), self.last_sub_sequence_number)
        return first <= position <= last


@dataclass(frozen=True)
class BatchInfo:
    """What a batch holds, for ``fn(df, batch_id, info)``.

    ``batch_id`` counts the batches of this :func:`foreach_batch` call from 0; unlike Spark's
    own foreachBatch id it is **not** durable (it restarts with every run and differs between
    drivers), so never use it as an idempotency key: use ``ranges``.
    """

    batch_id: int
    client_id: str
    ranges: tuple[ShardRange, ...]
    records: int
    bytes: int
    collect_seconds: float
    """From the batch's first record to its closing (bounded by ``max_interval``)."""

    def range_of(self, stream: str, shard_id: str) -> ShardRange | None:
        for shard_range in self.ranges:
            if shard_range.stream == stream and shard_range.shard_id == shard_id:
                return shard_range
        return None


@dataclass(frozen=True)
class RunSummary:
    """What a :func:`foreach_batch` call processed (and checkpointed) before it returned."""

    batches: int
    records: int
    bytes: int
    shards: tuple[ShardRange, ...]
    """Per shard: first and last record processed by this run, and their number."""
    stopped_by: str
    """``"drained"`` (available_now), ``"stop"`` (the stop event) or ``"signal:SIGTERM"``..."""
    seconds: float

    @property
    def last_sequence_numbers(self) -> dict[tuple[str, str], tuple[str, int]]:
        """``(stream, shard_id) -> (sequence_number, sub_sequence_number)`` of the last record
        processed and checkpointed per shard."""
        return {
            (r.stream, r.shard_id): (r.last_sequence_number, r.last_sub_sequence_number)
            for r in self.shards
        }


BatchFunction: TypeAlias = (
    "Callable[[DataFrame, int], object] | Callable[[DataFrame, int, BatchInfo], object]"
)
"""``fn(df, batch_id)`` (Spark's own foreachBatch signature) or ``fn(df, batch_id, info)``."""


# -- Arrow --------------------------------------------------------------------------------------
def arrow_schema() -> pyarrow.Schema:
    """The Arrow schema of a batch; Spark maps it to string, string, string, bigint, string,
    binary, timestamp (UTC instants)."""
    pa = _require_pyarrow()
    return pa.schema(
        [
            pa.field("stream", pa.string(), nullable=False),
            pa.field("shard_id", pa.string(), nullable=False),
            pa.field("sequence_number", pa.string(), nullable=False),
            pa.field("sub_sequence_number", pa.int64(), nullable=False),
            pa.field("partition_key", pa.string(), nullable=False),
            pa.field("data", pa.binary(), nullable=False),
            pa.field("approximate_arrival_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


def records_to_arrow(records: Sequence[Record]) -> pyarrow.Table:
    """Records as one Arrow table, column by column (no per-row Python objects on the way to the
    JVM). Arrival timestamps become UTC instants whatever their tzinfo."""
    pa = _require_pyarrow()
    schema = arrow_schema()
    if not records:
        return schema.empty_table()
    columns = zip(*records, strict=True)
    arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def records_to_dataframe(spark: SparkSession, records: Sequence[Record]) -> DataFrame:
    """One DataFrame for ``records``, through Arrow (``spark.createDataFrame(pyarrow.Table)``).

    pyspark 4 ships an Arrow table to the JVM as Arrow record batches (one partition per
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), several times faster than a list
    of rows, which it would verify, pickle and convert row by row.
    """
    _require_spark()
    return spark.createDataFrame(records_to_arrow(records))


# -- the driver ---------------------------------------------------------------------------------
def foreach_batch(
    spark: SparkSession,
    config: Config,
    streams: Iterable[str],
    fn: BatchFunction,
    *,
    max_records: int = 10_000,
    max_bytes: int = 32 * 1024 * 1024,
    max_interval: float = 2.0,
    available_now: bool = False,
    stop: threading.Event | None = None,
    handle_signals: bool = True,
    on_assigned: Hook | None = None,
    on_revoked: Hook | None = None,
) -> RunSummary:
    """Consume ``streams`` as a member of ``config.app``'s group, one DataFrame per micro-batch.

    A batch closes when it holds ``max_records`` records, when its data reaches ``max_bytes``
    (polls are sized from the largest record seen, so it overshoots by about one record at most),
    or ``max_interval`` seconds after its first record: a record waits at most that long for its
    batch, and an idle stream costs no batches. Empty batches never reach ``fn``.

    ``fn(df, batch_id)`` or ``fn(df, batch_id, info)`` (chosen from its signature: it gets
    ``info`` when it accepts three positional arguments) runs in this thread. The batch's
    checkpoints are written when it returns. When it raises, the batch is not checkpointed,
    the consumer is closed without committing and the error is raised here; the next run
    delivers the batch again.

    Modes:

    - default: run until ``stop`` is set or, when called from the main thread with
      ``handle_signals``, until SIGINT or SIGTERM (the batch in progress is finished and
      committed; a second signal gets the previous handler, e.g. KeyboardInterrupt). The
      previous handlers are restored on return.
    - ``available_now=True``: process what the shards hold and return. The run ends when every
      shard this member owns was read to its tip (or past the records that existed when the run
      started, so a busy stream still ends), no claim is pending, nothing is left to deliver,
      and that held over two coordinator ticks, so shards still on their way (a rebalance,
      children of a resharded shard) are not missed.

    Several drivers (on one machine or many) with the same ``config.app`` split the shards like
    any group members; a shard moving away waits for the batch in flight to be committed, up to
    ``config.handoff_timeout``. Set it to the longest batch you expect (collection plus ``fn``):
    when the config keeps the library default (5 s), :data:`BATCH_HANDOFF_TIMEOUT` (60 s, or
    ``2 * max_interval`` if larger) is used instead. ``config.auto_commit`` is ignored: batches
    are always committed explicitly, after ``fn``.

    ``on_assigned`` / ``on_revoked``: the rebalance hooks of :class:`~kinesumer.Kinesumer`
    (called on the engine's thread with a list of ``(stream, shard_id)``). ``on_revoked`` runs
    after the batch in flight was committed, before the shard is released.
    """
    _require_spark()
    names = check_streams(streams)
    _check_bounds(max_records, max_bytes, max_interval)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    wants_info = _wants_info(fn)
    handoff = config.handoff_timeout
    if handoff == _DEFAULT_HANDOFF_TIMEOUT:
        handoff = max(BATCH_HANDOFF_TIMEOUT, 2 * max_interval)
        log.info("handoff_timeout left at the default: using %.0fs to cover a batch", handoff)
    config = config.replace(auto_commit=False, handoff_timeout=handoff)
    driver = _Driver(
        spark,
        config,
        names,
        fn,
        wants_info,
        max_records=max_records,
        max_bytes=max_bytes,
        max_interval=max_interval,
        available_now=available_now,
        stop=stop,
        on_assigned=on_assigned,
        on_revoked=on_revoked,
    )
    with _stop_on_signals(driver.on_signal, enabled=handle_signals):
        return driver.run()


def _check_bounds(max_records: int, max_bytes: int, max_interval: float) -> None:
    for name, value in (("max_records", max_records), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if (
        isinstance(max_interval, bool)
        or not isinstance(max_interval, (int, float))
        or not math.isfinite(max_interval)
        or max_interval <= 0
    ):
        raise ValueError(
            f"max_interval must be a finite number of seconds > 0, got {max_interval!r}"
        )


def _wants_info(fn: Callable[..., object]) -> bool:
    """True for ``fn(df, batch_id, info)``, False for ``fn(df, batch_id)``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none
        return False
    for count, wants in ((3, True), (2, False)):
        try:
            signature.bind(*([None] * count))
        except TypeError:
            continue
        return wants
    raise TypeError(
        f"fn must accept (df, batch_id) or (df, batch_id, info); {fn!r} has signature {signature}"
    )


@contextlib.contextmanager
def _stop_on_signals(on_signal: Callable[[str], None], *, enabled: bool) -> Iterator[None]:
    """While inside, SIGINT/SIGTERM call ``on_signal(name)`` (a graceful stop after the current
    batch).

    Only the main thread may install handlers. The first signal puts the previous handlers
    back, so a second one acts as before (Ctrl-C twice: KeyboardInterrupt, which abandons the
    batch uncommitted). Previous handlers are restored on exit in any case.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)

    def handler(number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        log.warning("%s: stopping after the current batch (send it again to abort)", name)
        on_signal(name)
        restore()

    for number in (signal.SIGINT, signal.SIGTERM):
        previous[number] = signal.signal(number, handler)
    try:
        yield
    finally:
        restore()


class _RangeBuilder:
    """Accumulates per-shard first/last positions and counts."""

    def __init__(self) -> None:
        self._shards: dict[tuple[str, str], list[Any]] = {}

    def add_records(self, records: Sequence[Record]) -> None:
        shards = self._shards
        for record in records:
            key = (record.stream, record.shard_id)
            entry = shards.get(key)
            if entry is None:
                shards[key] = [record, record, 1]
            else:
                entry[1] = record
                entry[2] += 1

    def add_range(self, shard_range: ShardRange) -> None:
        key = (shard_range.stream, shard_range.shard_id)
        entry = self._shards.get(key)
        if entry is None:
            self._shards[key] = [shard_range, shard_range, shard_range.count]
        else:
            entry[1] = shard_range
            entry[2] += shard_range.count

    def build(self) -> tuple[ShardRange, ...]:
        out = []
        for (stream, shard_id), (first, last, count) in sorted(self._shards.items()):
            if isinstance(first, ShardRange):
                head = (first.first_sequence_number, first.first_sub_sequence_number)
                tail = (last.last_sequence_number, last.last_sub_sequence_number)
            else:
                head = (first.sequence_number, first.sub_sequence_number)
                tail = (last.sequence_number, last.sub_sequence_number)
            out.append(ShardRange(stream, shard_id, *head, *tail, count))
        return tuple(out)


class _DrainWatch:
    """``available_now``: decides when this member has processed what its shards hold.

    A shard counts as done when its last GetRecords came back empty (``caught_up``) or when it
    delivered a record that arrived after the run started (everything older is behind it, so a
    busy stream still ends); a shard at SHARD_END is not done until it is finished (its
    children are claimed right after). The member is drained when every active shard is done,
    no claim is pending (a second driver that owns nothing *yet* waits for the shards coming its
    way), a poll brings nothing more from shards not yet past the start, and all of that still
    holds :data:`_SETTLE_TICKS` coordinator ticks later, after the last commit.

    It reads the engine's leases and coordinator directly: :meth:`Kinesumer.stats` does not
    show pending claims, SHARD_END or the tick count. mypy checks these accesses with the rest of
    the package, so a rename in the engine fails the type check, not a production run.
    """

    def __init__(self, consumer: Kinesumer, started: datetime) -> None:
        self._engine = consumer._engine
        self._started = started
        self._passed: set[tuple[str, str]] = set()
        self._since: int | None = None
        self.candidate = False

    def before_poll(self) -> int | None:
        """The coordinator's tick count if every active shard is done and no claim is pending,
        else None. The count is read first: if it shows tick ``n``, tick ``n - 1`` has completed
        and the leases read after it include its claims."""
        engine = self._engine
        coordinator = engine._coordinator
        ticks = coordinator.ticks
        if coordinator.has_pending:
            return None
        passed = self._passed
        for lease in list(engine.leases.values()):
            if lease.status is not LeaseStatus.ACTIVE:
                continue  # moving away or lost: another member reads the rest
            if lease.reached_end or not (lease.caught_up or lease.key in passed):
                return None
        return ticks

    def after_poll(self, ticks: int | None, got: list[Record]) -> bool:
        """True once the member is drained (and stayed so, see the class)."""
        passed = self._passed
        fresh = any((r.stream, r.shard_id) not in passed for r in got)
        started = self._started
        for record in got:
            arrived = record.approximate_arrival_timestamp
            if arrived is not None and arrived >= started:
                passed.add((record.stream, record.shard_id))
        self.candidate = ticks is not None and not fresh
        if ticks is None or fresh:
            self._since = None
            return False
        if self._since is None:
            self._since = ticks
            return False
        return ticks >= self._since + _SETTLE_TICKS

    def reset(self) -> None:
        """After a commit: shards may finish now (and their children follow); start over."""
        self._since = None


@dataclass
class _Batch:
    records: list[Record]
    bytes: int
    collect_seconds: float
    drained: bool


class _Driver:
    def __init__(
        self,
        spark: SparkSession,
        config: Config,
        streams: tuple[str, ...],
        fn: BatchFunction,
        wants_info: bool,
        *,
        max_records: int,
        max_bytes: int,
        max_interval: float,
        available_now: bool,
        stop: threading.Event | None,
        on_assigned: Hook | None,
        on_revoked: Hook | None,
    ) -> None:
        self._spark = spark
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._config = config
        self._streams = streams
        self._fn: Callable[..., object] = fn
        self._wants_info = wants_info
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._max_interval = max_interval
        self._available_now = available_now
        self._stop = stop
        self._signal: str | None = None

    def on_signal(self, name: str) -> None:
        self._signal = name

    def _stopping(self) -> str | None:
        if self._signal is not None:
            return f"signal:{self._signal}"
        if self._stop is not None and self._stop.is_set():
            return "stop"
        return None

    def run(self) -> RunSummary:
        started_wall = datetime.now(timezone.utc)
        started = time.monotonic()
        consumer = Kinesumer(
            self._config, on_assigned=self._on_assigned, on_revoked=self._on_revoked
        )
        totals = _RangeBuilder()
        batches = records = nbytes = 0
        stopped_by = "stop"
        try:
            consumer.subscribe(self._streams)
            watch = _DrainWatch(consumer, started_wall) if self._available_now else None
            while True:
                batch = self._collect(consumer, watch)
                if batch.records:
                    info = self._process(consumer, batches, batch)
                    if watch is not None:
                        watch.reset()
                    for shard_range in info.ranges:
                        totals.add_range(shard_range)
                    batches += 1
                    records += info.records
                    nbytes += info.bytes
                if batch.drained:
                    stopped_by = "drained"
                    break
                reason = self._stopping()
                if reason is not None:
                    stopped_by = reason
                    break
        except BaseException:
            _close_discarding(consumer)
            raise
        consumer.close()
        summary = RunSummary(
            batches, records, nbytes, totals.build(), stopped_by, time.monotonic() - started
        )
        log.info(
            "[%s] %s: %d batches, %d records in %.1fs",
            consumer.client_id,
            stopped_by,
            batches,
            records,
            summary.seconds,
        )
        return summary

    def _collect(self, consumer: Kinesumer, watch: _DrainWatch | None) -> _Batch:
        """Poll until a bound is reached, a stop is requested, or (available_now) the shards are
        drained. Every record polled goes into this batch: ``commit()`` marks everything
        delivered as processed, so nothing delivered may be held back for a later batch."""
        max_records, max_bytes = self._max_records, self._max_bytes
        out: list[Record] = []
        nbytes = largest = 0
        first_at: float | None = None
        while self._stopping() is None:
            if first_at is None:
                # One record first: it starts the clock and tells the size of records.
                want, timeout = 1, _TICK
            else:
                left = first_at + self._max_interval - time.monotonic()
                if left <= 0:
                    break
                room = max(1, (max_bytes - nbytes) // max(1, largest))
                want, timeout = min(max_records - len(out), room), min(left, _TICK)
            ticks = watch.before_poll() if watch is not None else None
            got = consumer.poll(want, timeout)
            if got:
                if first_at is None:
                    first_at = time.monotonic()
                out.extend(got)
                for record in got:
                    size = len(record.data)
                    nbytes += size
                    if size > largest:
                        largest = size
            if watch is not None:
                if watch.after_poll(ticks, got):
                    return _Batch(out, nbytes, _since(first_at), drained=True)
                if watch.candidate and out and not got:
                    break  # nothing more to come right now: no point waiting max_interval
            if len(out) >= max_records or nbytes >= max_bytes:
                break
        return _Batch(out, nbytes, _since(first_at), drained=False)

    def _process(self, consumer: Kinesumer, batch_id: int, batch: _Batch) -> BatchInfo:
        ranges = _RangeBuilder()
        ranges.add_records(batch.records)
        info = BatchInfo(
            batch_id=batch_id,
            client_id=consumer.client_id,
            ranges=ranges.build(),
            records=len(batch.records),
            bytes=batch.bytes,
            collect_seconds=batch.collect_seconds,
        )
        began = time.monotonic()
        df = records_to_dataframe(self._spark, batch.records)
        if self._wants_info:
            self._fn(df, batch_id, info)
        else:
            self._fn(df, batch_id)
        ran = time.monotonic()
        consumer.commit()  # only now: fn returned
        log.debug(
            "[%s] batch %d: %d records, %d bytes, collected in %.2fs, fn %.2fs, commit %.3fs",
            consumer.client_id,
            batch_id,
            info.records,
            info.bytes,
            info.collect_seconds,
            ran - began,
            time.monotonic() - ran,
        )
        return info


def _since(first_at: float | None) -> float:
    return 0.0 if first_at is None else time.monotonic() - first_at


def _close_discarding(consumer: Kinesumer) -> None:
    """Close after a failed batch: nothing of it is checkpointed, and the handoffs do not wait.

    ``close(discard=True)`` releases every shard at once at its last commit instead of waiting
    ``handoff_timeout`` for records that will never be committed. Errors while closing are
    logged, not raised: the caller is already propagating the error that matters.
    """
    try:
        consumer.close(discard=True)
    except Exception as exc:
        log.warning("[%s] closing after a failed batch: %r", consumer.client_id, exc)
