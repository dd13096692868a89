"""The Kinesis transport's contract: the same behaviour tests against ``MemoryKinesis`` and
``AwsKinesisTransport`` on kinesalite, moto (server mode) and kinesis-local, so the in-memory
one cannot drift from the real ones.

Where a stand-in is known to differ from AWS (``STANDINS.md``), the case is marked for that
implementation with the reason, as a strict xfail: it still runs, and if the stand-in starts
behaving like AWS the mark fails and must go.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from kinesumer.aws import RequestStats, botocore_session
from kinesumer.kinesis.kpl_aggregate import Aggregate
from kinesumer.kinesis.lean import PutEntry
from kinesumer.kinesis.reader import KinesisReader
from kinesumer.kinesis.transport import AwsKinesisTransport, KinesisTransport
from kinesumer.testing import MemoryKinesis

IMPLEMENTATIONS = ["memory", "kinesalite", "moto", "kinesis_local"]
MAX_HASH_KEY = 2**128 - 1


@dataclass
class Side:
    """One implementation under test: its transport and the admin calls a test sets up with."""

    name: str
    transport: KinesisTransport
    admin: Any = None  # an aiobotocore client, None for memory
    memory: MemoryKinesis | None = None
    #: Known differences from AWS: behaviour -> reason.
    differs: dict[str, str] = field(default_factory=dict)

    async def create_stream(self, stream: str, shards: int) -> None:
        if self.memory is not None:
            self.memory.create_stream(stream, shards=shards)
            return
        await self.admin.create_stream(StreamName=stream, ShardCount=shards)
        await self.wait_active(stream)

    async def wait_active(self, stream: str) -> None:
        while True:
            answer = await self.admin.describe_stream_summary(StreamName=stream)
            if answer["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                return
            await asyncio.sleep(0.05)

    async def split(self, stream: str, shard_id: str, at: int) -> None:
        if self.memory is not None:
            self.memory.split_shard(stream, shard_id, at)
            return
        await self.admin.split_shard(
            StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str(at)
        )
        await self.wait_active(stream)

    async def merge(self, stream: str, shard_id: str, adjacent: str) -> None:
        if self.memory is not None:
            self.memory.merge_shards(stream, shard_id, adjacent)
            return
        await self.admin.merge_shards(
            StreamName=stream, ShardToMerge=shard_id, AdjacentShardToMerge=adjacent
        )
        await self.wait_active(stream)

    def expect_difference(self, request: pytest.FixtureRequest, behaviour: str) -> None:
        """Mark the running test a strict xfail when this implementation differs from AWS in
        ``behaviour``."""
        reason = self.differs.get(behaviour)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(reason=f"{self.name}: {reason}", strict=True))


NOT_A_KINESIS_ERROR = "answers a malformed iterator with HTTP 500 (AWS: InvalidArgumentException)"
ANY_SEQUENCE_NUMBER = (
    "takes a sequence number of another shard (AWS: InvalidArgumentException, which the "
    "reader reports as a re-created stream)"
)

NO_CONSUMERS = "has no stream consumers (STANDINS.md)"

DIFFERENCES: dict[str, dict[str, str]] = {
    "memory": {},
    "kinesalite": {
        "child_shards": "sends no ChildShards at a closed shard's end (STANDINS.md)",
        "consumers": NO_CONSUMERS,
        "duplicate_consumer": NO_CONSUMERS,
    },
    "moto": {
        "shard_end": "never ends a drained closed shard: always a NextShardIterator (STANDINS.md)",
        "child_shards": "never ends a drained closed shard (STANDINS.md)",
        "last_hash_key": "ExplicitHashKey 2**128-1 (the last key) is an HTTP 500: no shard's "
        "range holds it",
        "puts_after_split": "routes a put to the closed parent after a split",
        "bad_iterator": NOT_A_KINESIS_ERROR,
        "foreign_sequence_number": ANY_SEQUENCE_NUMBER,
        "duplicate_consumer": "registers a consumer of an existing name again",
    },
    "kinesis_local": {
        "deregister_elsewhere": "DeregisterStreamConsumer removes the consumer of that name from "
        "the first stream (by ARN) that has one, and the one deregistered stays DELETING for ever "
        "(kinesis-mock's Cache.deregisterStreamConsumer finds the stream by consumer name)",
        "bad_iterator": NOT_A_KINESIS_ERROR,
        "foreign_sequence_number": ANY_SEQUENCE_NUMBER,
    },
}


@contextlib.asynccontextmanager
async def aws_client(url: str) -> AsyncIterator[Any]:
    context = botocore_session().create_client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=AioConfig(retries={"total_max_attempts": 1, "mode": "standard"}),
    )
    async with context as client:
        yield client


@pytest.fixture(params=IMPLEMENTATIONS)
async def side(request: pytest.FixtureRequest) -> AsyncIterator[Side]:
    name: str = request.param
    differs = DIFFERENCES[name]
    if name == "memory":
        memory = MemoryKinesis()
        yield Side(name, memory, memory=memory, differs=differs)
        return
    server = request.getfixturevalue({"moto": "moto_server"}.get(name, name))
    if name == "moto":
        server.reset()
    async with aws_client(server.url) as client:
        yield Side(name, AwsKinesisTransport(client), admin=client, differs=differs)


@pytest.fixture
def stream(unique_name: Any) -> str:
    name: str = unique_name("contract")
    return name


def md5_key(partition_key: str) -> int:
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


async def read_all(transport: KinesisTransport, stream: str, shard_id: str) -> list[Any]:
    """Every record of the shard from TRIM_HORIZON, until an empty answer (or its end)."""
    answer = await transport.get_shard_iterator(stream, shard_id, "TRIM_HORIZON")
    return await read_from(transport, answer.iterator)


async def read_from(transport: KinesisTransport, iterator: str | None) -> list[Any]:
    records: list[Any] = []
    while iterator is not None:
        answer = await transport.get_records(iterator, 10_000)
        records.extend(answer.Records)
        if not answer.Records:
            break
        iterator = answer.NextShardIterator
    return records


async def shard_ids(transport: KinesisTransport, stream: str) -> list[str]:
    page = await transport.list_shards(stream)
    return sorted(s["ShardId"] for s in page["Shards"])


async def test_put_records_round_trip_in_order_per_shard(side: Side, stream: str) -> None:
    await side.create_stream(stream, 2)
    entries = [PutEntry(f"r{i}".encode(), f"key-{i % 5}") for i in range(30)]
    answer = await side.transport.put_records(stream, entries)
    assert answer.get("FailedRecordCount", 0) == 0
    assert len(answer["Records"]) == 30
    put_to: dict[str, list[tuple[str, bytes]]] = {}
    for entry, result in zip(entries, answer["Records"], strict=True):
        put_to.setdefault(result["ShardId"], []).append((result["SequenceNumber"], entry.Data))
    for shard_id in await shard_ids(side.transport, stream):
        got = await read_all(side.transport, stream, shard_id)
        assert [(r.SequenceNumber, r.Data) for r in got] == put_to.get(shard_id, [])
        numbers = [int(r.SequenceNumber) for r in got]
        assert numbers == sorted(set(numbers))


async def test_put_record_answers_its_shard_and_sequence(side: Side, stream: str) -> None:
    await side.create_stream(stream, 1)
    first = await side.transport.put_record(stream, b"a", "k")
    second = await side.transport.put_record(stream, b"b", "k")
    assert first["ShardId"] == second["ShardId"] == "shardId-000000000000"
    assert int(second["SequenceNumber"]) > int(first["SequenceNumber"])


async def test_records_are_routed_by_the_md5_of_their_key(side: Side, stream: str) -> None:
    await side.create_stream(stream, 4)
    page = await side.transport.list_shards(stream)
    ranges = {
        s["ShardId"]: (
            int(s["HashKeyRange"]["StartingHashKey"]),
            int(s["HashKeyRange"]["EndingHashKey"]),
        )
        for s in page["Shards"]
    }
    assert sorted(ranges.values())[0][0] == 0
    assert sorted(ranges.values())[-1][1] == MAX_HASH_KEY
    keys = [f"user-{i}" for i in range(40)]
    answer = await side.transport.put_records(stream, [PutEntry(b"x", k) for k in keys])
    used = set()
    for key, result in zip(keys, answer["Records"], strict=True):
        low, high = ranges[result["ShardId"]]
        assert low <= md5_key(key) <= high, (key, result["ShardId"])
        used.add(result["ShardId"])
    assert len(used) == 4  # 40 keys spread over every shard


async def test_an_explicit_hash_key_routes_to_the_shard_that_holds_it(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "last_hash_key")
    await side.create_stream(stream, 4)
    page = await side.transport.list_shards(stream)
    for shard in page["Shards"]:
        for key in (
            shard["HashKeyRange"]["StartingHashKey"],
            shard["HashKeyRange"]["EndingHashKey"],
        ):
            put = await side.transport.put_record(stream, b"y", "ignored", explicit_hash_key=key)
            assert put["ShardId"] == shard["ShardId"]


async def test_iterator_types_start_where_aws_starts(side: Side, stream: str) -> None:
    await side.create_stream(stream, 1)
    shard = "shardId-000000000000"
    numbers = [
        (await side.transport.put_record(stream, f"{i}".encode(), "k"))["SequenceNumber"]
        for i in range(5)
    ]
    t = side.transport

    async def first_data(iterator_type: Any, **kwargs: Any) -> list[bytes]:
        answer = await t.get_shard_iterator(stream, shard, iterator_type, **kwargs)
        return [r.Data for r in await read_from(t, answer.iterator)]

    assert await first_data("TRIM_HORIZON") == [b"0", b"1", b"2", b"3", b"4"]
    assert await first_data("AT_SEQUENCE_NUMBER", sequence_number=numbers[2]) == [b"2", b"3", b"4"]
    assert await first_data("AFTER_SEQUENCE_NUMBER", sequence_number=numbers[2]) == [b"3", b"4"]
    assert await first_data("LATEST") == []


async def test_latest_sees_only_records_put_after_it(side: Side, stream: str) -> None:
    await side.create_stream(stream, 1)
    shard = "shardId-000000000000"
    await side.transport.put_record(stream, b"before", "k")
    latest = await side.transport.get_shard_iterator(stream, shard, "LATEST")
    assert latest.served_at is None or latest.served_at.tzinfo is not None
    await side.transport.put_record(stream, b"after", "k")
    assert [r.Data for r in await read_from(side.transport, latest.iterator)] == [b"after"]


async def test_at_timestamp_starts_at_the_first_record_that_arrived_then(
    side: Side, stream: str
) -> None:
    await side.create_stream(stream, 1)
    shard = "shardId-000000000000"
    for i in range(3):
        await side.transport.put_record(stream, f"early-{i}".encode(), "k")
    early = await read_all(side.transport, stream, shard)
    # AT_TIMESTAMP counts whole seconds (what botocore sends): put until a record arrives in a
    # later second than the early ones (a state, polled).
    early_second = second_of(early[-1].ApproximateArrivalTimestamp)
    later: list[Any] = []
    while not later or second_of(later[-1].ApproximateArrivalTimestamp) <= early_second:
        await asyncio.sleep(0.05)
        await side.transport.put_record(stream, b"late", "k")
        later = (await read_all(side.transport, stream, shard))[len(early) :]
    since = later[-1].ApproximateArrivalTimestamp
    answer = await side.transport.get_shard_iterator(stream, shard, "AT_TIMESTAMP", timestamp=since)
    got = await read_from(side.transport, answer.iterator)
    full = await read_all(side.transport, stream, shard)
    assert [r.SequenceNumber for r in got] == [
        r.SequenceNumber
        for r in full
        if second_of(r.ApproximateArrivalTimestamp) >= second_of(since)
    ]
    assert got and all(r.Data == b"late" for r in got)


def second_of(instant: Any) -> int:
    return int(instant.timestamp())


async def test_a_split_closes_the_parent_and_lists_children_with_it(
    side: Side, stream: str
) -> None:
    await side.create_stream(stream, 1)
    parent = "shardId-000000000000"
    await side.transport.put_record(stream, b"before-split", "k")
    await side.split(stream, parent, 2**127)
    page = await side.transport.list_shards(stream)
    by_id = {s["ShardId"]: s for s in page["Shards"]}
    assert "EndingSequenceNumber" in by_id[parent]["SequenceNumberRange"]
    children = sorted(sid for sid, s in by_id.items() if s.get("ParentShardId") == parent)
    assert len(children) == 2
    for child in children:
        assert "EndingSequenceNumber" not in by_id[child]["SequenceNumberRange"]
    ranges = sorted(
        (
            int(by_id[c]["HashKeyRange"]["StartingHashKey"]),
            int(by_id[c]["HashKeyRange"]["EndingHashKey"]),
        )
        for c in children
    )
    assert ranges == [(0, 2**127 - 1), (2**127, MAX_HASH_KEY)]


async def test_puts_after_a_split_go_to_the_children(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "puts_after_split")
    await side.create_stream(stream, 1)
    await side.split(stream, "shardId-000000000000", 2**127)
    keys = [f"k{i}" for i in range(10)]
    answer = await side.transport.put_records(stream, [PutEntry(b"x", k) for k in keys])
    for key, result in zip(keys, answer["Records"], strict=True):
        upper_half = md5_key(key) >= 2**127
        expected = "shardId-000000000002" if upper_half else "shardId-000000000001"
        assert result["ShardId"] == expected


async def test_a_drained_closed_shard_ends_without_a_next_iterator(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "shard_end")
    await side.create_stream(stream, 1)
    parent = "shardId-000000000000"
    await side.transport.put_record(stream, b"r", "k")
    await side.split(stream, parent, 2**127)
    iterator: str | None = (
        await side.transport.get_shard_iterator(stream, parent, "TRIM_HORIZON")
    ).iterator
    data: list[bytes] = []
    for _ in range(10):
        assert iterator is not None
        answer = await side.transport.get_records(iterator, 10_000)
        data.extend(r.Data for r in answer.Records)
        iterator = answer.NextShardIterator
        if iterator is None:
            break
    assert data == [b"r"]
    assert iterator is None


async def test_a_closed_shards_end_names_its_children(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "child_shards")
    await side.create_stream(stream, 1)
    parent = "shardId-000000000000"
    await side.split(stream, parent, 2**127)
    iterator = (await side.transport.get_shard_iterator(stream, parent, "TRIM_HORIZON")).iterator
    children = None
    for _ in range(10):
        answer = await side.transport.get_records(iterator, 10_000)
        if answer.NextShardIterator is None:
            children = answer.ChildShards
            break
        iterator = answer.NextShardIterator
    assert children is not None
    assert sorted(c["ShardId"] for c in children) == [
        "shardId-000000000001",
        "shardId-000000000002",
    ]
    assert all(c["ParentShards"] == [parent] for c in children)


async def test_a_merge_lists_both_parents(side: Side, stream: str) -> None:
    await side.create_stream(stream, 2)
    await side.merge(stream, "shardId-000000000000", "shardId-000000000001")
    page = await side.transport.list_shards(stream)
    merged = [s for s in page["Shards"] if "AdjacentParentShardId" in s]
    assert len(merged) == 1
    assert {merged[0].get("ParentShardId"), merged[0]["AdjacentParentShardId"]} == {
        "shardId-000000000000",
        "shardId-000000000001",
    }
    closed = [
        s["ShardId"] for s in page["Shards"] if "EndingSequenceNumber" in s["SequenceNumberRange"]
    ]
    assert sorted(closed) == ["shardId-000000000000", "shardId-000000000001"]


async def test_the_reader_unpacks_a_kpl_aggregate_stored_as_put(side: Side, stream: str) -> None:
    await side.create_stream(stream, 1)
    packed = Aggregate()
    for i in range(3):
        packed.add(f"user-{i}".encode(), f"k{i}")
    await side.transport.put_record(stream, packed.encode(), packed.first_key or "k")
    raw = await read_all(side.transport, stream, "shardId-000000000000")
    assert len(raw) == 1  # stored as one Kinesis record
    reader = KinesisReader(side.transport, RequestStats(), "us-east-1")
    shards = await reader.list_shards(stream)
    iterator = await reader.shard_iterator(stream, shards[0].shard_id, None, "TRIM_HORIZON")
    batch = await reader.get_records(stream, shards[0].shard_id, iterator, 100, None)
    assert [(r.data, r.sub_sequence_number) for r in batch.records] == [
        (b"user-0", 0),
        (b"user-1", 1),
        (b"user-2", 2),
    ]


async def test_a_missing_stream_is_resource_not_found(side: Side, stream: str) -> None:
    t = side.transport
    calls = [
        lambda: t.describe_stream_summary(stream),
        lambda: t.list_shards(stream),
        lambda: t.get_shard_iterator(stream, "shardId-000000000000", "TRIM_HORIZON"),
        lambda: t.put_record(stream, b"x", "k"),
    ]
    for call in calls:
        with pytest.raises(ClientError) as caught:
            await call()
        assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


async def test_a_bad_iterator_is_an_invalid_argument(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "bad_iterator")
    await side.create_stream(stream, 1)
    with pytest.raises(ClientError) as caught:
        await side.transport.get_records("not-an-iterator-" + "A" * 40, 10)
    assert caught.value.response["Error"]["Code"] == "InvalidArgumentException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


async def test_a_sequence_number_of_another_shard_is_an_invalid_argument(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "foreign_sequence_number")
    await side.create_stream(stream, 2)
    put = await side.transport.put_record(stream, b"x", "k")
    other = next(s for s in await shard_ids(side.transport, stream) if s != put["ShardId"])
    with pytest.raises(ClientError) as caught:
        await side.transport.get_shard_iterator(
            stream, other, "AT_SEQUENCE_NUMBER", sequence_number=put["SequenceNumber"]
        )
    assert caught.value.response["Error"]["Code"] == "InvalidArgumentException"


async def active_consumer(side: Side, stream_arn: str, name: str) -> str:
    """Register ``name`` and wait (polling its state) until it is ACTIVE: its ARN."""
    registered = await side.transport.register_stream_consumer(stream_arn, name)
    assert registered["ConsumerName"] == name
    while True:
        described = await side.transport.describe_stream_consumer(stream_arn, name)
        if described["ConsumerStatus"] == "ACTIVE":
            return described["ConsumerARN"]
        await asyncio.sleep(0.05)


async def test_stream_consumers_register_and_list(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    if side.name == "kinesalite":
        request.applymarker(
            pytest.mark.xfail(
                reason="kinesalite has no stream consumers (STANDINS.md)", strict=True
            )
        )
    await side.create_stream(stream, 1)
    summary = await side.transport.describe_stream_summary(stream)
    arn = summary["StreamDescriptionSummary"]["StreamARN"]
    consumer_arn = await active_consumer(side, arn, "reader-a")
    listed = await side.transport.list_stream_consumers(arn)
    assert [c["ConsumerARN"] for c in listed["Consumers"]] == [consumer_arn]


async def consumer_gone(
    side: Side, stream_arn: str, name: str, *, active_on: str | None = None
) -> None:
    """Wait until ``name`` is gone from ``stream_arn`` (AWS deletes it in the background),
    within a bound far past what any server here takes (kinesis-local: at once), so a consumer
    stuck DELETING fails the test instead of reaching the suite's timeout. ``active_on``: a
    stream whose consumer of that name must stay ACTIVE all along."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        if active_on is not None:
            other = await side.transport.describe_stream_consumer(active_on, name)
            assert other["ConsumerStatus"] == "ACTIVE"
        try:
            described = await side.transport.describe_stream_consumer(stream_arn, name)
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ResourceNotFoundException"
            return
        assert described["ConsumerStatus"] == "DELETING"
        assert asyncio.get_running_loop().time() < deadline, f"{name} still DELETING after 60 s"
        await asyncio.sleep(0.05)


async def test_a_deregistered_consumer_goes(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "consumers")
    await side.create_stream(stream, 1)
    summary = await side.transport.describe_stream_summary(stream)
    arn = summary["StreamDescriptionSummary"]["StreamARN"]
    name = f"reader-{stream}"  # no other stream has one of this name (see the next test)
    await active_consumer(side, arn, name)
    await side.transport.deregister_stream_consumer(arn, name)
    await consumer_gone(side, arn, name)


async def test_a_consumer_deregistered_on_one_stream_stays_on_another(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    """An app registers one consumer name on every stream it reads; deregistering it on one
    stream leaves the others'."""
    side.expect_difference(request, "consumers")
    side.expect_difference(request, "deregister_elsewhere")
    arns = []
    for suffix in ("a", "b"):  # ARNs in this order
        await side.create_stream(f"{stream}-{suffix}", 1)
        summary = await side.transport.describe_stream_summary(f"{stream}-{suffix}")
        arns.append(summary["StreamDescriptionSummary"]["StreamARN"])
    name = f"app-{stream}"
    for arn in arns:
        await active_consumer(side, arn, name)
    await side.transport.deregister_stream_consumer(arns[1], name)
    await consumer_gone(side, arns[1], name, active_on=arns[0])


async def test_registering_a_consumer_twice_is_resource_in_use(
    side: Side, stream: str, request: pytest.FixtureRequest
) -> None:
    side.expect_difference(request, "duplicate_consumer")
    await side.create_stream(stream, 1)
    summary = await side.transport.describe_stream_summary(stream)
    arn = summary["StreamDescriptionSummary"]["StreamARN"]
    await active_consumer(side, arn, "reader-a")
    with pytest.raises(ClientError) as caught:
        await side.transport.register_stream_consumer(arn, "reader-a")
    assert caught.value.response["Error"]["Code"] == "ResourceInUseException"


@pytest.fixture(params=["memory", "kinesis_local"])
async def subscribing_side(request: pytest.FixtureRequest) -> AsyncIterator[Side]:
    """The implementations that serve SubscribeToShard (kinesalite and moto do not)."""
    if request.param == "memory":
        memory = MemoryKinesis()
        yield Side("memory", memory, memory=memory)
        return
    from kinesumer.config import Config
    from kinesumer.kinesis.efo.subscriber import ShardSubscriber

    server = request.getfixturevalue("kinesis_local")
    config = Config(
        app="contract",
        dynamodb_table="contract",
        region="us-east-1",
        kinesis_endpoint=server.url,
        enhanced_fan_out=True,
    )
    subscriber = ShardSubscriber(config, None, RequestStats())
    await subscriber.open()
    try:
        async with aws_client(server.url) as client:
            transport = AwsKinesisTransport(client, subscriptions=subscriber)
            yield Side("kinesis_local", transport, admin=client)
    finally:
        await subscriber.close()


async def test_subscribe_to_shard_delivers_what_is_there_and_what_follows(
    subscribing_side: Side, stream: str
) -> None:
    side = subscribing_side
    await side.create_stream(stream, 1)
    summary = await side.transport.describe_stream_summary(stream)
    consumer_arn = await active_consumer(
        side, summary["StreamDescriptionSummary"]["StreamARN"], "subscriber"
    )
    put = [
        (await side.transport.put_record(stream, f"r{i}".encode(), "k"))["SequenceNumber"]
        for i in range(3)
    ]
    events = side.transport.subscribe_to_shard(
        consumer_arn, "shardId-000000000000", {"Type": "TRIM_HORIZON"}
    )
    seen: list[Any] = []

    async def take(count: int) -> None:
        while len(seen) < count:
            event = await anext(events)
            seen.extend(event.records)
            if event.records:
                assert event.continuation_sequence_number == event.records[-1]["SequenceNumber"]

    try:
        # A bound, not a timing assertion: a subscription that stops answering fails the test
        # instead of hanging it (kinesis-local sends at most an event a second).
        await asyncio.wait_for(take(3), 60)
        assert [r["SequenceNumber"] for r in seen] == put
        assert [r["Data"] for r in seen] == [b"r0", b"r1", b"r2"]
        later = await side.transport.put_record(stream, b"later", "k")
        await asyncio.wait_for(take(4), 60)
        assert seen[3]["SequenceNumber"] == later["SequenceNumber"]
        assert seen[3]["Data"] == b"later"
    finally:
        await events.aclose()  # type: ignore[attr-defined]
