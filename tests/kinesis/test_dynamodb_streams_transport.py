"""The DynamoDB Streams transport over an in-memory ``dynamodbstreams`` client
(support/fake_table_stream.py): records turned into Kinesis records, DescribeStream paged into
ListShards, errors as Kinesis's through the reader, calls routed by stream ARN and iterator,
writes and fan-out refused by name; and a shard rotation (a closed parent, its child) read by a
group with parents first, which moto cannot make."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from decimal import Decimal

import pytest
from boto3.dynamodb.types import Binary
from support.fake_table_stream import ARN, FakeShard, FakeTableStream, stream_record
from support.wait import wait_until

from kinesumer import Config, ConfigError, Kinesumer, StreamNotFoundError
from kinesumer.aws import RequestStats
from kinesumer.dynamodb_streams import change
from kinesumer.kinesis.dynamodb_streams import DynamoDBStreamsTransport, raw_record_of
from kinesumer.kinesis.reader import IteratorExpired, KinesisReader
from kinesumer.kinesis.routing import RoutingTransport
from kinesumer.models import Record, Shard
from kinesumer.testing import MemoryKinesis, MemoryState


def test_a_stream_record_becomes_a_kinesis_record_of_its_json() -> None:
    record = stream_record("k1", 7, 42, "MODIFY")
    record["userIdentity"] = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    raw = raw_record_of(record)
    data = json.loads(raw.Data)
    assert raw.SequenceNumber == record["dynamodb"]["SequenceNumber"]
    assert raw.PartitionKey == '{"pk":{"S":"k1"}}'
    assert raw.ApproximateArrivalTimestamp == record["dynamodb"]["ApproximateCreationDateTime"]
    assert data["dynamodb"]["ApproximateCreationDateTime"] == 1767225600.0  # epoch seconds
    assert data["dynamodb"]["NewImage"]["b"] == {"B": base64.b64encode(b"\x07").decode()}
    assert data["eventName"] == "MODIFY" and data["userIdentity"]["type"] == "Service"

    c = change(Record(ARN, "s", raw.SequenceNumber, 0, raw.PartitionKey, raw.Data, None))
    assert c.keys == {"pk": "k1"} and c.is_ttl_delete and c.event_name == "MODIFY"
    assert c.new_image == {"pk": "k1", "n": Decimal(7), "b": Binary(b"\x07")}
    assert c.created_at == record["dynamodb"]["ApproximateCreationDateTime"]


def test_the_decoder_gives_sets_maps_lists_and_binaries_as_python_values() -> None:
    image = {
        "s": {"SS": ["a", "b"]},
        "ns": {"NS": ["1", "2.5"]},
        "bs": {"BS": [base64.b64encode(b"x").decode()]},
        "m": {"M": {"l": {"L": [{"B": base64.b64encode(b"y").decode()}, {"NULL": True}]}}},
        "t": {"BOOL": True},
    }
    data = json.dumps({"eventName": "INSERT", "dynamodb": {"Keys": {}, "NewImage": image}})
    c = change(data)
    assert c.new_image == {
        "s": {"a", "b"},
        "ns": {Decimal(1), Decimal("2.5")},
        "bs": {Binary(b"x")},
        "m": {"l": [Binary(b"y"), None]},
        "t": True,
    }
    assert c.old_image is None and not c.is_ttl_delete
    with pytest.raises(ValueError, match="not a DynamoDB Streams record"):
        change(b'{"eventName": "x"}')


def reader_over(fake: FakeTableStream) -> KinesisReader:
    routed = RoutingTransport(MemoryKinesis(), DynamoDBStreamsTransport.over(fake))
    return KinesisReader(routed, RequestStats(), "us-east-1")


async def test_shards_are_listed_through_every_describe_stream_page_with_parents() -> None:
    shards = [
        FakeShard(f"shardId-{i}", f"shardId-{i - 1}" if i else None, closed=i < 4) for i in range(5)
    ]
    fake = FakeTableStream(shards, page_size=2)
    listed = await reader_over(fake).list_shards(ARN)
    assert listed == sorted(
        Shard(f"shardId-{i}", f"shardId-{i - 1}" if i else None, None, i < 4) for i in range(5)
    )
    assert fake.calls.count("DescribeStream") == 3


async def test_records_and_the_shard_end_are_read_as_kinesis_ones() -> None:
    parent = FakeShard(
        "shardId-0", records=[stream_record("a", i, i) for i in range(3)], closed=True
    )
    reader = reader_over(FakeTableStream([parent]))
    iterator = await reader.shard_iterator(ARN, "shardId-0", None, "TRIM_HORIZON")
    assert iterator.startswith(ARN + "|")
    batch = await reader.get_records(ARN, "shardId-0", iterator, 10_000, None)
    assert [r.sequence_number for r in batch.records] == [f"{i:021d}" for i in range(3)]
    assert batch.next_iterator is None and batch.millis_behind is None  # SHARD_END; no lag


async def test_errors_are_kinesis_errors_to_the_reader() -> None:
    shard = FakeShard("shardId-0", records=[stream_record("a", 1, 1)])
    fake = FakeTableStream([shard])
    reader = reader_over(fake)
    iterator = await reader.shard_iterator(ARN, "shardId-0", None, "TRIM_HORIZON")
    fake.errors = [("GetRecords", "LimitExceededException")]  # throttling: retried
    assert len((await reader.get_records(ARN, "shardId-0", iterator, 10, None)).records) == 1
    fake.errors = [("GetRecords", "TrimmedDataAccessException")]
    with pytest.raises(IteratorExpired):  # the reader renews from the last record delivered
        await reader.get_records(ARN, "shardId-0", iterator, 10, None)
    fake.errors = [("DescribeStream", "ResourceNotFoundException")]
    with pytest.raises(StreamNotFoundError):
        await reader.check_stream(ARN)


async def test_writes_and_fan_out_are_refused_by_name() -> None:
    transport = DynamoDBStreamsTransport.over(FakeTableStream([]))
    with pytest.raises(ConfigError, match="written through its table"):
        await transport.put_record(ARN, b"x", "k")
    with pytest.raises(ConfigError, match="no enhanced fan-out"):
        await transport.register_stream_consumer(ARN, "app")


def test_a_group_reads_a_rotated_shard_parent_first() -> None:
    """DynamoDB closes a stream's shard every few hours and opens a child: the child's changes
    are delivered only after every change of the parent (moto never rotates a shard)."""
    keys = ["a", "b", "c"]
    parent = FakeShard(
        "shardId-0", records=[stream_record(keys[i % 3], i, i) for i in range(30)], closed=True
    )
    child = FakeShard(
        "shardId-1", "shardId-0", [stream_record(keys[i % 3], i, i) for i in range(30, 60)]
    )
    routed = RoutingTransport(
        MemoryKinesis(), DynamoDBStreamsTransport.over(FakeTableStream([parent, child]))
    )
    config = Config(
        app="items",
        dynamodb_table="kinesumer-state",
        region="us-east-1",
        initial_position="TRIM_HORIZON",
        heartbeat_interval=0.25,
        commit_interval=0.2,
    )
    seen: list[str] = []
    member = Kinesumer(config, kinesis=routed, state=MemoryState())

    def read() -> None:
        for record in member.consume([ARN]):
            seen.append(record.sequence_number)
            if len(seen) == 60:
                break

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(seen) == 60, 60, "every change of both shards")
    finally:
        member.close()
        thread.join(30)
    assert seen == [f"{i:021d}" for i in range(60)]


def test_records_keep_the_fake_and_moto_iterator_prefix() -> None:
    # moto's iterators are "<stream ARN>|1|<base64>" (moto/dynamodbstreams/models.py); AWS's too.
    assert asyncio.run(
        DynamoDBStreamsTransport.over(FakeTableStream([FakeShard("shardId-0")])).get_shard_iterator(
            ARN, "shardId-0", "LATEST"
        )
    ).iterator.startswith(ARN + "|")
