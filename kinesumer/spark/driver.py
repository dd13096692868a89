""":func:`foreach_batch`: the driver-only path from Kinesis into PySpark micro-batches.

The calling process is one member of the consumer group (a :class:`~kinesumer.Kinesumer`): it
polls its shards' records, closes a batch on records, bytes or time, turns it into one
DataFrame through Arrow, runs ``fn`` and only then commits. Every record passes through this
one Python process; the streaming source (``spark.readStream.format("kinesumer")``) is the path
whose executors read the shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..config import Config, check_streams
from ..consumer.sync import Kinesumer
from ..group.hooks import Hook
from ..models import Record
from ..signals import stop_on_signals
from .arrow import records_to_dataframe
from .batches import BatchFunction, BatchInfo, RangeBuilder, RunSummary
from .deps import require_spark
from .drain import DrainWatch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("kinesumer.spark")

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
      committed; a second signal raises KeyboardInterrupt, which abandons the batch
      uncommitted). The previous handlers are restored on return
      (:func:`kinesumer.signals.stop_on_signals`).
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
    require_spark()
    names = check_streams(streams, kinesis_arns=True)
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
    signals = stop_on_signals(driver.on_signal) if handle_signals else contextlib.nullcontext()
    with signals:
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


@dataclass
class _Batch:
    records: list[Record]
    bytes: int
    collect_seconds: float
    drained: bool


class _Driver:
    """One :func:`foreach_batch` call: the consumer, the batch loop and the stop requests."""

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
        """Called from the signal handler: stop after the batch in progress."""
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
        totals = RangeBuilder()
        batches = records = nbytes = 0
        stopped_by = "stop"
        try:
            consumer.subscribe(self._streams)
            watch = DrainWatch(consumer, started_wall) if self._available_now else None
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

    def _collect(self, consumer: Kinesumer, watch: DrainWatch | None) -> _Batch:
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
        ranges = RangeBuilder()
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
