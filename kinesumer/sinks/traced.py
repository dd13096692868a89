"""An exactly-once sink whose transactions are OpenTelemetry spans (the ``otel`` extra)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..observability.telemetry import sink_transaction_span, tracer_for
from .base import ExactlyOnceSink

if TYPE_CHECKING:
    from ..aws.clients import ClientFactory
    from ..models import Position
    from ..read.engine import Engine
    from ..read.progress import ShardLease


class TracedSink:
    """``sink``, with a span around each transaction (see :func:`traced_sink`)."""

    def __init__(self, sink: ExactlyOnceSink, tracer: Any) -> None:
        self.sink = sink
        self._tracer = tracer

    def _span(self, lease: ShardLease, end: Position) -> Any:
        name = type(self.sink).__name__
        return sink_transaction_span(
            self._tracer, lease.key, lease.claim.checkpoint.lease, end, name
        )

    def attach(self, engine: Engine) -> None:
        self.sink.attach(engine)

    def transact_sync(self, lease: ShardLease, end: Position, body: Callable[[Any], None]) -> None:
        with self._span(lease, end):
            self.sink.transact_sync(lease, end, body)

    async def transact_async(
        self, lease: ShardLease, end: Position, body: Callable[[Any], Awaitable[None]]
    ) -> None:
        with self._span(lease, end):
            await self.sink.transact_async(lease, end, body)

    def close_sync(self) -> None:
        self.sink.close_sync()

    async def close_async(self) -> None:
        await self.sink.close_async()


def traced_sink(sink: ExactlyOnceSink | None, aws: ClientFactory) -> ExactlyOnceSink | None:
    """``sink`` with a span per transaction when ``opentelemetry`` is installed, else ``sink``."""
    tracer = tracer_for(aws.config)
    if sink is None or tracer is None:
        return sink
    return TracedSink(sink, tracer)
