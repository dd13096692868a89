"""Handler spans of batched calls as the dispatcher makes them: it holds several shards' batches
at once, so with ``ordering="key"`` (or ``"none"``) one call can hold records of several shards
(and streams). A span must not name one shard (and its sequence numbers) for such a call."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kinesumer import Config, Record
from kinesumer.handlers import Batch
from kinesumer.observability import telemetry as t
from kinesumer.testing import HandlerDriver, record


def batch_spans(records: list[Record], ordering: str) -> tuple[list[ReadableSpan], list[Any]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    config = Config(app="spans", dynamodb_table="state", tracer_provider=provider)
    calls: list[list[Record]] = []
    driver = HandlerDriver(calls.append, ordering=ordering, batch=Batch(max_size=10), config=config)
    driver.deliver(records)
    return [s for s in spans.get_finished_spans() if s.name == t.HANDLE_BATCH], calls


def test_a_call_of_two_shards_names_neither_shard() -> None:
    records = [
        record(b"a", shard_id="shardId-000000000000", partition_key="a"),
        record(b"b", shard_id="shardId-000000000001", partition_key="b"),
    ]
    spans, calls = batch_spans(records, "key")
    assert len(calls) == 1 and {r.shard_id for r in calls[0]} == {
        "shardId-000000000000",
        "shardId-000000000001",
    }  # the dispatcher did mix the shards in one call
    (span,) = spans
    attributes = dict(span.attributes or {})
    assert attributes[t.COUNT] == 2
    assert t.SHARD not in attributes  # neither shard is the call's
    assert t.FIRST_SEQUENCE not in attributes and t.LAST_SEQUENCE not in attributes
    assert attributes[t.STREAM] == records[0].stream  # one stream: still named


def test_a_call_of_two_streams_names_no_stream() -> None:
    records = [record(b"a", stream="orders"), record(b"b", stream="payments")]
    spans, _ = batch_spans(records, "none")
    (span,) = spans
    attributes = dict(span.attributes or {})
    assert t.STREAM not in attributes and t.SHARD not in attributes
    assert attributes[t.COUNT] == 2


def test_a_call_of_one_shard_names_it_and_its_sequence_range() -> None:
    records = [record(b"a1", partition_key="a"), record(b"b1", partition_key="b")]
    records.append(record(b"a2", partition_key="a"))
    (span,), calls = batch_spans(records, "key")
    assert [r.data for r in calls[0]] == [b"a1", b"a2", b"b1"]  # by key, not shard order
    attributes = dict(span.attributes or {})
    assert attributes[t.SHARD] == records[0].shard_id
    assert attributes[t.FIRST_SEQUENCE] == records[0].sequence_number
    assert attributes[t.LAST_SEQUENCE] == records[2].sequence_number
