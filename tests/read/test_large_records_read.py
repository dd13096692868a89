"""A 10 MiB record (data plus partition key) through every read path: the lean GetRecords
decoder and the consumer behind it, a KPL aggregate holding one, enhanced fan-out's event
frames, and the Spark source's columns, Arrow table and read-ahead file.

No stand-in serves one: kinesalite and moto refuse a record over 1 MiB, and kinesis-local,
which takes one on a raised stream, fails its GetRecords with a 500. So each path gets the
smallest honest substitute: a GetRecords answer of kinesalite rewritten on the wire by the fault
proxy (``Fault.rewrite_answer``) for the consumer, the HTTP/2 SubscribeToShard stand-in
(``support.efo_standin``) for enhanced fan-out, and the Spark source's own steps at the unit level.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aws_kinesis_agg
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator
from support.efo_standin import EfoStandIn, ScriptedShard
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream, kinesis, make_config, setup_table

from kinesumer import Config, Kinesumer
from kinesumer.aws import RequestStats
from kinesumer.kinesis import lean
from kinesumer.kinesis.columns import epoch_columns_of
from kinesumer.kinesis.efo.subscriber import ShardSubscriber, SubscribeEvent
from kinesumer.models import Record

MIB = 1024 * 1024
#: Data of a 10 MiB record with a one-character partition key.
LARGE = bytes(range(256)) * (10 * MIB // 256 - 1) + b"L" * 255
assert len(LARGE) + 1 == 10 * MIB
#: A user record of a KPL aggregate that is itself 10 MiB with its key (the aggregate's
#: framing, keys and digest take the rest).
LARGE_USER = LARGE[: 10 * MIB - 1024]


@pytest.fixture
def aggregate(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[tuple[str, bytes]]], bytes]:
    """KPL aggregates as aws-kinesis-agg writes them, up to 10 MiB (its bound is 1 MiB)."""
    monkeypatch.setattr(aws_kinesis_agg, "MAX_BYTES_PER_RECORD", 10 * MIB)

    def make(pairs: list[tuple[str, bytes]]) -> bytes:
        aggregator = RecordAggregator(max_size=10 * MIB)
        for key, data in pairs:
            assert aggregator.add_user_record(key, data) is None
        _, _, blob = aggregator.clear_and_get().get_contents()
        assert len(blob) + 1 <= 10 * MIB
        return bytes(blob)

    return make


def test_the_consumer_delivers_a_10_mib_record_and_one_in_an_aggregate(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Callable[[str], str],
    aggregate: Callable[[list[tuple[str, bytes]]], bytes],
) -> None:
    packed = aggregate([("a", b"first"), ("b", LARGE_USER), ("c", b"last")])

    def swap_placeholders(answer: dict[str, Any]) -> dict[str, Any]:
        """kinesalite's answer with its placeholders replaced by a 10 MiB record and a 10 MiB
        KPL aggregate."""
        for record in answer.get("Records", []):
            data = base64.b64decode(record["Data"])
            if data == b"LARGE":
                record["Data"] = base64.b64encode(LARGE).decode()
            elif data == b"AGGREGATE":
                record["Data"] = base64.b64encode(packed).decode()
        return answer

    stream = unique_name("large")
    create_stream(kinesalite.url, stream, 1)
    client = kinesis(kinesalite.url)
    for data in (b"before", b"LARGE", b"AGGREGATE", b"after"):
        client.put_record(StreamName=stream, Data=data, PartitionKey="k")
    with FaultProxy(kinesalite.url) as proxy:
        proxy.add_rule(
            Fault.rewrite_answer(swap_placeholders), service="kinesis", operation="GetRecords"
        )
        config = make_config(proxy.url, dynalite.url, unique_name("app"), unique_name("state"))
        setup_table(config)
        got: list[Record] = []
        with Kinesumer(config) as consumer:
            for record in consumer.consume([stream]):
                got.append(record)
                if len(got) == 6:
                    break
    assert [(r.partition_key, len(r.data)) for r in got] == [
        ("k", 6),
        ("k", len(LARGE)),
        ("a", 5),
        ("b", len(LARGE_USER)),
        ("c", 4),
        ("k", 5),
    ]
    assert got[1].data == LARGE and got[3].data == LARGE_USER
    assert [r.sub_sequence_number for r in got[2:5]] == [0, 1, 2]


def _config(endpoint: str) -> Config:
    return Config(
        app="efo-large",
        dynamodb_table="efo-table",
        region="us-east-1",
        kinesis_endpoint=endpoint,
        enhanced_fan_out=True,
    )


async def _records(events: AsyncIterator[SubscribeEvent], count: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    while len(records) < count:
        records.extend((await anext(events)).records)
    return records


async def test_enhanced_fan_out_carries_a_10_mib_record_in_an_event() -> None:
    consumer_arn = "arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1"
    async with EfoStandIn() as server:
        shard = server.shards["shardId-0"] = ScriptedShard()
        shard.put(b"before")
        shard.put(LARGE)
        shard.put(b"after")
        subscriber = ShardSubscriber(_config(server.url), None, RequestStats())
        await subscriber.open()
        try:
            events = subscriber.subscribe(consumer_arn, "shardId-0", {"Type": "TRIM_HORIZON"})
            async with contextlib.aclosing(events):
                records = await _records(events, 3)
        finally:
            await subscriber.close()
    assert [r["Data"] for r in records] == [b"before", LARGE, b"after"]


def _answer_body(datas: list[bytes]) -> bytes:
    records = [
        {
            "SequenceNumber": f"4959{i:052d}",
            "PartitionKey": "k",
            "Data": base64.b64encode(data).decode(),
            "ApproximateArrivalTimestamp": 1_700_000_000.5,
        }
        for i, data in enumerate(datas)
    ]
    body = {"Records": records, "NextShardIterator": "next", "MillisBehindLatest": 0}
    return json.dumps(body).encode()


def test_the_spark_sources_columns_arrow_table_and_read_ahead_file_carry_a_10_mib_record(
    aggregate: Callable[[list[tuple[str, bytes]]], bytes],
) -> None:
    pytest.importorskip("pyarrow")
    from kinesumer.spark.arrow import epoch_columns_to_arrow, records_to_arrow
    from kinesumer.spark.source.executor import readahead_format

    packed = aggregate([("a", b"first"), ("b", LARGE_USER)])
    answer = lean.decode_epoch_answer(_answer_body([b"before", LARGE, packed]))
    assert answer is not None
    columns = epoch_columns_of("s", "shardId-0", answer.Records, None)
    assert columns.datas == [b"before", LARGE, b"first", LARGE_USER]
    table = epoch_columns_to_arrow(columns)
    header = readahead_format.Header(
        readahead_format.LAYOUT, "s", "shardId-0", ("0", 0), True, False, 0, "run"
    )
    read_header, rows = readahead_format.decode(readahead_format.encode(header, table))
    assert read_header.count == 4
    assert rows.column("data").to_pylist() == [b"before", LARGE, b"first", LARGE_USER]
    # foreach_batch's Arrow building, from the consumer's records.
    plain = lean.decode_records_answer(_answer_body([LARGE]))
    assert plain is not None
    record = Record("s", "shardId-0", plain.Records[0].SequenceNumber, 0, "k", LARGE, None)
    assert records_to_arrow([record]).column("data").to_pylist() == [LARGE]
