"""OpenTelemetry spans (kinesumer.observability.telemetry) from a real consumer: a handler run
at the default LATEST on kinesalite + dynalite (handler calls, a failed attempt, the checkpoints
and where the read began), an exactly-once sink's transactions on moto (the batch handler's span
inside each), and the extra absent (nothing wrapped, nothing imported).

Spans go to an SDK TracerProvider with the in-memory exporter, passed as
``Config.tracer_provider``; the process's global provider is never touched.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY
from support.group import create_stream, make_config, put, setup_table
from support.sink_driver import SinkMember
from support.sinks import counts, recorder, sink_table
from support.standins import MotoStandIn
from support.wait import eventually

from kinesumer import Config, ConfigError, Kinesumer, Record
from kinesumer.handlers import Discard, Retry
from kinesumer.observability import telemetry as t
from kinesumer.sinks import DynamoDBTransactions

ROOT = Path(__file__).resolve().parents[2]
#: Longest wait for one step of a run (the records, the shards' starts) before the test fails.
WAIT = 60.0


def exporter() -> tuple[TracerProvider, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider, spans


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


def test_a_handler_run_at_latest_traces_calls_failures_and_checkpoints(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    provider, spans = exporter()
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
        tracer_provider=provider,
        metrics=True,
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    handled: list[Record] = []
    failed_once: set[bytes] = set()

    def handle(record: Record) -> None:
        if record.data == b"3" and record.data not in failed_once:
            failed_once.add(record.data)
            raise ValueError("boom on 3")
        handled.append(record)

    policy = Discard(retry=Retry(attempts=3, backoff=0.0))
    stop = threading.Event()
    with Kinesumer(config) as consumer:

        def feed_then_close() -> None:
            # LATEST: records put before the read began are not for us. Every shard's start is
            # recorded (a checkpoint span of kind "start") before its first record is read.
            # Each wait is bounded, so that a run without spans fails instead of hanging.
            deadline = time.monotonic() + WAIT
            while not stop.wait(0.1) and time.monotonic() < deadline:
                starts = [
                    s
                    for s in named(spans, t.CHECKPOINT)
                    if attr(s, "kinesumer.checkpoint.kind") == "start"
                ]
                if len(starts) >= 2:
                    break
            put(kinesalite.url, stream, 0, 20)
            deadline = time.monotonic() + WAIT
            while not stop.wait(0.1) and len(handled) < 20 and time.monotonic() < deadline:
                pass
            consumer.close()

        closer = threading.Thread(target=feed_then_close, daemon=True)
        closer.start()
        try:
            consumer.run([stream], handle, on_failure=policy, name="orders")
        finally:
            stop.set()
            closer.join()
        client_id = consumer.client_id
    assert sorted(int(r.data) for r in handled) == list(range(20))

    calls = named(spans, t.HANDLE)
    by_sequence: dict[str, list[ReadableSpan]] = {}
    for span in calls:
        by_sequence.setdefault(attr(span, t.SEQUENCE), []).append(span)
    for record in handled:
        ok = [s for s in by_sequence[record.sequence_number] if s.status.is_ok]
        assert len(ok) == 1, record
        span = ok[0]
        assert attr(span, t.STREAM) == stream
        assert attr(span, t.SHARD) == record.shard_id
        assert attr(span, t.HANDLER) == "orders"
        assert attr(span, "messaging.system") == "aws_kinesis"
    three = next(r for r in handled if r.data == b"3")
    failures = [s for s in by_sequence[three.sequence_number] if not s.status.is_ok]
    assert len(failures) == 1
    assert failures[0].status.status_code is StatusCode.ERROR
    assert "ValueError: boom on 3" in (failures[0].status.description or "")
    assert [e.attributes["exception.type"] for e in failures[0].events] == ["ValueError"]
    assert len(calls) == 21  # 20 records, one of them tried twice

    checkpoints = named(spans, t.CHECKPOINT)
    assert all(attr(s, "kinesumer.checkpoint.outcome") == "written" for s in checkpoints)
    assert all(attr(s, t.STREAM) == stream and attr(s, t.LEASE) for s in checkpoints)
    starts = {
        attr(s, t.SHARD) for s in checkpoints if attr(s, "kinesumer.checkpoint.kind") == "start"
    }
    last: dict[str, str] = {}
    for record in handled:
        last[record.shard_id] = max(last.get(record.shard_id, "0"), record.sequence_number, key=int)
    assert len(starts) == 2 and set(last) <= starts
    for shard_id, sequence in last.items():
        # The checkpoint of each shard's last record was written under a span naming it.
        assert any(
            attr(s, t.SHARD) == shard_id and attr(s, t.SEQUENCE) == sequence for s in checkpoints
        ), shard_id

    # Every call was timed into the handler histogram (kinesumer_handler_seconds).
    labels = {"app": config.app, "client_id": client_id, "handler": "orders"}
    assert REGISTRY.get_sample_value("kinesumer_handler_seconds_count", labels) == 21


async def test_sink_transactions_carry_their_batch_calls(
    kinesalite: Any, moto_server: MotoStandIn, unique_name: Callable[[str], str]
) -> None:
    provider, spans = exporter()
    config = make_config(
        kinesalite.url,
        moto_server.url,
        unique_name("app"),
        unique_name("state"),
        tracer_provider=provider,
    )
    setup_table(config)
    stream, table = unique_name("s"), unique_name("sink")
    create_stream(kinesalite.url, stream, 2)
    sink_table(moto_server.url, table)
    put(kinesalite.url, stream, 0, 30)
    member = SinkMember(config, stream, DynamoDBTransactions(), recorder(table), runner=True)
    member.start()
    try:
        await eventually(
            lambda: member.check() or len(counts(moto_server.url, table)) >= 30, 60, "30 commits"
        )
    finally:
        await member.close()
    transactions = {s.context.span_id: s for s in named(spans, t.SINK_TRANSACTION)}
    batches = named(spans, t.HANDLE_BATCH)
    assert transactions and batches
    total = 0
    for batch in batches:
        assert batch.parent is not None
        tx = transactions[batch.parent.span_id]  # each batch call ran inside its transaction
        assert batch.status.is_ok and tx.status.is_ok
        assert attr(tx, "kinesumer.sink") == "DynamoDBTransactions"
        assert attr(tx, t.STREAM) == attr(batch, t.STREAM) == stream
        assert attr(tx, t.SHARD) == attr(batch, t.SHARD)
        assert attr(tx, t.LAST_SEQUENCE) == attr(batch, t.LAST_SEQUENCE)
        assert isinstance(attr(tx, t.LEASE), int) and attr(tx, t.LEASE) >= 1
        assert int(attr(batch, t.FIRST_SEQUENCE)) <= int(attr(batch, t.LAST_SEQUENCE))
        total += attr(batch, t.COUNT)
    assert total >= 30


def test_a_tracer_provider_must_be_one() -> None:
    with pytest.raises(ConfigError, match="tracer_provider"):
        Config(app="a", dynamodb_table="state", tracer_provider="jaeger")
    provider, _ = exporter()
    config = Config(app="a", dynamodb_table="state", tracer_provider=provider)
    assert config == Config(app="a", dynamodb_table="state")  # not compared
    assert "tracer_provider" not in repr(config)


def test_without_opentelemetry_nothing_is_wrapped() -> None:
    """The extra absent (its import blocked): handlers and sinks are passed through as they are,
    checkpoints enter a shared null context, and no opentelemetry module is loaded."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from kinesumer import Config
        from kinesumer.observability import telemetry
        from kinesumer.sinks.traced import traced_sink
        from kinesumer.aws.clients import ClientFactory
        assert not telemetry.INSTALLED
        aws = ClientFactory(Config(app="a", dynamodb_table="state"))
        def handle(record):
            return record
        assert telemetry.instrument_handler(handle, "h", False, False, aws.config, None) is handle
        sink = object()
        assert traced_sink(sink, aws) is sink
        tracing = telemetry.Tracing.for_config(aws.config)
        assert tracing.tracer is None
        with tracing.checkpoint(("s", "shardId-0"), 1, None, "flush") as span:
            telemetry.written(span, False)
        assert span is None
        assert not [m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]]
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_global_provider_is_followed_once_installed() -> None:
    """Without Config.tracer_provider, spans go to the global provider: none while only the
    API's placeholder is there (a call costs no span), then every call once the application
    installed its provider (looked up at most once a second)."""
    script = textwrap.dedent(
        """
        import time
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from kinesumer import Config
        from kinesumer.observability import telemetry
        from kinesumer.aws.clients import ClientFactory
        from kinesumer.models import Record

        aws = ClientFactory(Config(app="a", dynamodb_table="state"))
        seen = []
        handle = telemetry.instrument_handler(seen.append, "h", False, False, aws.config, None)
        record = Record("orders", "shardId-000000000000", "1", 0, "k", b"x", None)
        handle(record)
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        time.sleep(1.1)  # the next look at the global provider
        handle(record)
        assert len(seen) == 2
        names = [(s.name, s.attributes["messaging.message.id"]) for s in spans.get_finished_spans()]
        assert names == [("kinesumer.handle", "1")], names
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
