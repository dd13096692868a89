"""OpenTelemetry spans, with the ``otel`` extra (``pip install 'kinesumer[otel]'``), and the
handler timing behind the Prometheus histogram ``kinesumer_handler_seconds``.

Spans (all of kind CONSUMER, parented to whatever span is current where they start):

======================================  ============================================================
``kinesumer.handle``                    one call of a ``run()`` handler on one record; every
                                        attempt (a retry) is a span of its own
``kinesumer.handle_batch``              one call of a batch handler (``run(batch=Batch(...))``)
``kinesumer.sink.transaction``          one exactly-once sink transaction (the handler's span
                                        runs inside it)
``kinesumer.checkpoint``                one fenced checkpoint write: a flush, a handoff's or
                                        finish's release, where a LATEST read began
======================================  ============================================================

Their attributes follow OpenTelemetry's messaging conventions where one fits:
``messaging.system`` (``aws_kinesis``), ``messaging.destination.name`` (the stream),
``messaging.destination.partition.id`` (the shard), ``messaging.message.id`` (the record's
sequence number), ``messaging.batch.message_count``; and kinesumer's own ``kinesumer.*`` (the
handler, the first and last sequence numbers of a batch, the lease number, the checkpoint's
kind and outcome). A failed handler call, a refused commit or a refused checkpoint sets the
span's status to ERROR and records the exception.

Off and free: ``opentelemetry`` is imported once, here. Without it (or with tracing and metrics
both off) :func:`instrument_handler` and :func:`traced_sink` return what they were given, and
:meth:`Tracing.checkpoint` a shared null context, so a call site pays an attribute check at
most. With it, spans go to ``Config.tracer_provider``, or to the global provider (the one
``opentelemetry.trace.set_tracer_provider`` installs, before or after the consumer is made);
with no SDK installed the global provider records nothing, cheaply.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..models import Position, Record

try:
    from opentelemetry import trace as otel_trace
except ImportError:  # the otel extra is not installed: spans are off, and free
    otel_trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from ..config import Config
    from .metric_events import Metrics

#: Whether ``opentelemetry-api`` could be imported (checked once, when this module loads).
INSTALLED = otel_trace is not None
_CONSUMER = otel_trace.SpanKind.CONSUMER if otel_trace is not None else None

HANDLE = "kinesumer.handle"
HANDLE_BATCH = "kinesumer.handle_batch"
SINK_TRANSACTION = "kinesumer.sink.transaction"
CHECKPOINT = "kinesumer.checkpoint"

SYSTEM = "aws_kinesis"
STREAM = "messaging.destination.name"
SHARD = "messaging.destination.partition.id"
SEQUENCE = "messaging.message.id"
COUNT = "messaging.batch.message_count"
FIRST_SEQUENCE = "kinesumer.sequence_number.first"
LAST_SEQUENCE = "kinesumer.sequence_number.last"
HANDLER = "kinesumer.handler"
LEASE = "kinesumer.lease"

#: What a disabled span site enters: reusable, yields None.
_NO_SPAN: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()


def tracer_for(config: Config) -> Any | None:
    """The tracer spans of ``config``'s consumer go to, or None without ``opentelemetry``."""
    if otel_trace is None:
        return None
    provider = config.tracer_provider
    tracer = otel_trace.get_tracer("kinesumer", __version__, tracer_provider=provider)
    return tracer if provider is not None else _GlobalTracer(tracer)


class _GlobalTracer:
    """The global provider's tracer, skipped while no provider is installed: the API's
    placeholder would make a span that records nothing, at about 10 us a call (context attach
    and detach). Whether one was installed is looked up at most once a second (the lookup reads
    the environment: about 1 us); once it was (that happens once per process), spans are made
    for good. So spans begin within a second of ``set_tracer_provider``."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._installed = False
        self._next_look = 0.0

    def active(self) -> bool:
        if self._installed:
            return True
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + 1.0
            provider = otel_trace.get_tracer_provider()
            self._installed = not isinstance(provider, otel_trace.ProxyTracerProvider)
        return self._installed

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._tracer.start_as_current_span(*args, **kwargs)


def _active(tracer: Any) -> bool:
    """Whether a span made with ``tracer`` (None: the extra is absent) would record."""
    return tracer is not None and (type(tracer) is not _GlobalTracer or tracer.active())


@contextlib.contextmanager
def _span(tracer: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    with tracer.start_as_current_span(
        name,
        kind=_CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as exc:
            failed(span, _reported(exc))
            raise


def failed(span: Any, error: BaseException | str) -> None:
    """Mark ``span`` (None: tracing off) as failed with ``error`` (recorded as an exception
    event when it is one)."""
    if span is None:
        return
    if isinstance(error, BaseException):
        span.record_exception(error)
        error = f"{type(error).__name__}: {error}"
    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error))


def _reported(exc: BaseException) -> BaseException:
    """The exception worth showing: a library-internal carrier (a private class raised ``from``
    the handler's error, as the invocation does inside a sink's transaction) gives way to its
    cause."""
    while type(exc).__name__.startswith("_") and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _record_of(value: Any) -> Record | None:
    """The record a handler argument came from: a Record, or a Message's record."""
    if isinstance(value, Record):
        return value
    record = getattr(value, "record", None)
    return record if isinstance(record, Record) else None


def _base(stream: str, shard_id: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, STREAM: stream, SHARD: shard_id}


def call_attributes(handler: str, argument: Any, batched: bool) -> dict[str, Any]:
    """A handler span's attributes for its ``argument`` (a value, or a list of them)."""
    if not batched:
        record = _record_of(argument)
        if record is None:
            return {"messaging.system": SYSTEM, HANDLER: handler}
        attributes = _base(record.stream, record.shard_id)
        attributes[SEQUENCE] = record.sequence_number
        attributes[HANDLER] = handler
        return attributes
    attributes = {"messaging.system": SYSTEM, HANDLER: handler, COUNT: len(argument)}
    records = [r for r in map(_record_of, argument) if r is not None]
    if not records:
        return attributes
    # The dispatcher holds several shards' batches: with ordering "key" or "none" one call can
    # hold records of several shards (even streams). Only what all of them share is named: a
    # shard and a sequence range would be false for the others.
    first = records[0]
    if any(r.stream != first.stream for r in records):
        return attributes
    attributes[STREAM] = first.stream
    if any(r.shard_id != first.shard_id for r in records):
        return attributes
    attributes[SHARD] = first.shard_id
    # A call holds its keys' records one key after another, not in the shard's order.
    sequences = sorted({r.sequence_number for r in records}, key=lambda s: (len(s), s))
    attributes[FIRST_SEQUENCE] = sequences[0]
    attributes[LAST_SEQUENCE] = sequences[-1]
    return attributes


def instrument_handler(
    handler: Callable[..., Any],
    name: str,
    batched: bool,
    is_async: bool,
    config: Config,
    metrics: Metrics | None,
) -> Callable[..., Any]:
    """``handler``, with a span around each call (when ``opentelemetry`` is installed) and its
    duration reported to ``kinesumer_handler_seconds`` (when Prometheus metrics are on); the
    handler itself when neither is. The wrapper passes every argument through (a sink's
    transaction included), and returns or raises what the handler did."""
    tracer = tracer_for(config)
    timed = metrics if metrics is not None and metrics.times_handlers else None
    if tracer is None and timed is None:
        return handler
    span_name = HANDLE_BATCH if batched else HANDLE
    clock = time.perf_counter

    def opened(argument: Any) -> contextlib.AbstractContextManager[Any]:
        if not _active(tracer):
            return _NO_SPAN
        # The handler's own exception: the API records it and sets the status itself.
        assert tracer is not None
        attributes = call_attributes(name, argument, batched)
        span: contextlib.AbstractContextManager[Any] = tracer.start_as_current_span(
            span_name, kind=_CONSUMER, attributes=attributes
        )
        return span

    if is_async:

        @functools.wraps(handler)
        async def traced_async(argument: Any, *rest: Any) -> Any:
            started = clock()
            try:
                with opened(argument):
                    return await handler(argument, *rest)
            finally:
                if timed is not None:
                    timed.handler_call(name, clock() - started)

        return traced_async

    @functools.wraps(handler)
    def traced(argument: Any, *rest: Any) -> Any:
        started = clock()
        try:
            with opened(argument):
                return handler(argument, *rest)
        finally:
            if timed is not None:
                timed.handler_call(name, clock() - started)

    return traced


def sink_transaction_span(
    tracer: Any, key: tuple[str, str], lease_number: int, end: Position, sink: str
) -> contextlib.AbstractContextManager[Any]:
    """A span around one exactly-once sink transaction of shard ``key`` under lease
    ``lease_number``, committing position ``end`` (a null context when tracing is off)."""
    if not _active(tracer):
        return _NO_SPAN
    attributes = _base(*key)
    attributes[LAST_SEQUENCE] = end.sequence_number
    attributes[LEASE] = lease_number
    attributes["kinesumer.sink"] = sink
    return _span(tracer, SINK_TRANSACTION, attributes)


class Tracing:
    """The engine's spans (checkpoints), or none: ``Tracing(None)`` costs a null context."""

    def __init__(self, tracer: Any | None = None) -> None:
        self.tracer = tracer

    @classmethod
    def for_config(cls, config: Config) -> Tracing:
        return cls(tracer_for(config))

    def checkpoint(
        self, key: tuple[str, str], lease_number: int, position: Position | None, kind: str
    ) -> contextlib.AbstractContextManager[Any]:
        """A span around one checkpoint write of shard ``key`` under lease ``lease_number``:
        ``kind`` is ``flush``, ``release``,
        ``finish`` or ``start``; ``position`` the sequence written (None: not moved). Enter it
        and call :func:`refused` with the span when the write was refused."""
        if not _active(self.tracer):
            return _NO_SPAN
        attributes = _base(*key)
        attributes[LEASE] = lease_number
        attributes["kinesumer.checkpoint.kind"] = kind
        if position is not None:
            attributes[SEQUENCE] = position.sequence_number
        return _span(self.tracer, CHECKPOINT, attributes)


def written(span: Any, ok: bool) -> None:
    """A checkpoint write's outcome on its span (None: tracing off): refused means another
    member owns the shard now."""
    if span is None:
        return
    span.set_attribute("kinesumer.checkpoint.outcome", "written" if ok else "refused")
    if not ok:
        failed(span, "refused: another member owns the shard")
