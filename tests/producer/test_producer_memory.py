"""Producer and AsyncProducer on ``MemoryKinesis`` (``kinesis=memory``), through the public API
only: where records land and in what order, throttling retried, a split met while producing, a
missing stream, large records checked against the stream's limit, and a closed producer. No AWS
client is opened and no server runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib

import pytest

from kinesumer import AsyncProducer, Producer, PutResult, Topic
from kinesumer.aws.clients import ClientFactory
from kinesumer.errors import (
    ConfigError,
    FlushError,
    ProducerClosedError,
    ReadOnlyStreamError,
    RecordTooLargeError,
    StreamNotFoundError,
)
from kinesumer.models import Record
from kinesumer.testing import MemoryKinesis

STREAM = "orders"
KEYS = [f"key-{n}" for n in range(40)]
#: Shard ids as Kinesis (and MemoryKinesis) number them: the four first, then children.
FIRST_SHARDS = [f"shardId-{n:012d}" for n in range(4)]


@pytest.fixture(autouse=True)
def no_aws_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer given ``kinesis=`` must never open an AWS client."""

    def refused(self: ClientFactory) -> None:
        raise AssertionError("a producer given kinesis= opened an AWS Kinesis client")

    monkeypatch.setattr(ClientFactory, "kinesis", refused)


@pytest.fixture
def memory() -> MemoryKinesis:
    memory = MemoryKinesis()
    memory.create_stream(STREAM, shards=4)
    return memory


def hash_key(partition_key: str) -> int:
    """Kinesis' routing: the MD5 of the partition key as a 128-bit number."""
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


def first_shard_of(partition_key: str) -> str:
    """The shard of a 4-shard stream whose (even) hash key range holds the key."""
    return FIRST_SHARDS[hash_key(partition_key) // (2**128 // 4)]


def payloads(key: str, numbers: range) -> list[bytes]:
    return [f"{key}:{n}".encode() for n in numbers]


def by_key(records: list[Record]) -> dict[str, list[bytes]]:
    """Each key's payloads in the order a reader meets them: shard by shard as made (parents
    before children), in sequence order within a shard."""
    keyed: dict[str, list[bytes]] = {}
    for record in records:
        keyed.setdefault(record.partition_key, []).append(record.data)
    return keyed


def put_rounds(producer: Producer, rounds: range) -> list[concurrent.futures.Future[PutResult]]:
    """Round by round, one record of every key."""
    futures: list[concurrent.futures.Future[PutResult]] = []
    for n in rounds:
        for key in KEYS:
            futures.append(producer.put(STREAM, f"{key}:{n}".encode(), partition_key=key))
    return futures


def test_records_land_on_the_shard_their_key_hashes_to_in_put_order(
    memory: MemoryKinesis,
) -> None:
    with Producer(region="eu-west-1", kinesis=memory) as producer:
        futures = {
            (key, n): producer.put(STREAM, f"{key}:{n}".encode(), partition_key=key)
            for n in range(10)
            for key in KEYS
        }
        producer.flush()
        stats = producer.stats()
    records = memory.records(STREAM)
    assert len(records) == len(futures) == stats.records_put
    for record in records:
        assert record.shard_id == first_shard_of(record.partition_key), record
    assert by_key(records) == {key: payloads(key, range(10)) for key in KEYS}
    stored = {(r.shard_id, r.sequence_number): r.data for r in records}
    for (key, n), future in futures.items():
        result = future.result(timeout=0)
        assert isinstance(result, PutResult)
        assert stored[(result.shard_id, result.sequence_number)] == f"{key}:{n}".encode()


def test_the_async_producer_writes_to_the_memory_stream(memory: MemoryKinesis) -> None:
    async def main() -> list[PutResult]:
        async with AsyncProducer(region="eu-west-1", kinesis=memory) as producer:
            futures = [await producer.put(STREAM, b"%d" % n, partition_key="k") for n in range(20)]
            await producer.flush()
            return [await future for future in futures]

    results = asyncio.run(main())
    assert [r.data for r in memory.records(STREAM)] == [b"%d" % n for n in range(20)]
    assert {r.shard_id for r in results} == {first_shard_of("k")}
    assert [int(r.sequence_number) for r in results] == sorted(
        int(r.sequence_number) for r in results
    )


def test_throttled_entries_are_retried_and_land_once_in_put_order(memory: MemoryKinesis) -> None:
    # A long linger: nothing goes before flush(), so the refused entries are first records of
    # their keys, with later records of those keys waiting behind them.
    with Producer(region="eu-west-1", kinesis=memory, linger=60) as producer:
        memory.fail_next_entries(times=15)
        put_rounds(producer, range(5))
        producer.flush()
        stats = producer.stats()
    records = memory.records(STREAM)
    assert by_key(records) == {key: payloads(key, range(5)) for key in KEYS}
    assert stats.throttled_entries == 15
    assert stats.retries >= 15
    assert stats.records_put == len(KEYS) * 5 and stats.records_failed == 0


def test_whole_calls_throttled_or_failing_are_retried(memory: MemoryKinesis) -> None:
    memory.fail_next("ListShards", times=2)
    memory.fail_next("PutRecords", times=2)
    memory.fail_next("PutRecords", code="InternalFailure", times=1)
    with Producer(region="eu-west-1", kinesis=memory) as producer:
        put_rounds(producer, range(3))
        producer.flush()
        stats = producer.stats()
    assert by_key(memory.records(STREAM)) == {key: payloads(key, range(3)) for key in KEYS}
    assert stats.records_failed == 0 and stats.retries >= 3


def test_after_a_split_records_land_on_the_children_each_key_in_put_order(
    memory: MemoryKinesis,
) -> None:
    parent = FIRST_SHARDS[0]
    middle = (2**128 // 4) // 2
    children = {"shardId-000000000004", "shardId-000000000005"}
    with Producer(region="eu-west-1", kinesis=memory) as producer:
        put_rounds(producer, range(5))
        producer.flush()
        memory.split_shard(STREAM, parent, middle)
        after = put_rounds(producer, range(5, 10))
        producer.flush()
        # Once more: the answers naming the children made the producer list the shards again.
        later = put_rounds(producer, range(10, 15))
        producer.flush()
    records = memory.records(STREAM)
    assert by_key(records) == {key: payloads(key, range(15)) for key in KEYS}
    parent_keys = [key for key in KEYS if first_shard_of(key) == parent]
    assert parent_keys, "no key of the test hashes to the split shard"
    for key in parent_keys:
        child = "shardId-000000000004" if hash_key(key) < middle else "shardId-000000000005"
        landed = [r.shard_id for r in records if r.partition_key == key]
        assert landed == [parent] * 5 + [child] * 10, key
    for future in [*after, *later]:
        assert future.result(timeout=0).shard_id != parent
    assert {r.shard_id for r in records} == {*FIRST_SHARDS, *children}


def test_a_missing_stream_fails_the_records_with_stream_not_found(memory: MemoryKinesis) -> None:
    producer = Producer(region="eu-west-1", kinesis=memory)
    future = producer.put("missing", b"x", partition_key="k")
    with pytest.raises(FlushError) as raised:
        producer.flush()
    assert raised.value.failures == {"StreamNotFoundError": 1}
    with pytest.raises(StreamNotFoundError, match="'missing' does not exist"):
        future.result(timeout=0)
    producer.put(STREAM, b"y", partition_key="k")  # other streams are written still
    producer.close()
    assert [r.data for r in memory.records(STREAM)] == [b"y"]
    assert memory.stream_names() == [STREAM]


def test_a_record_over_the_streams_limit_is_refused_at_put(memory: MemoryKinesis) -> None:
    """MemoryKinesis' streams take 1 MiB records, as a Kinesis stream never raised: the limit
    comes from its DescribeStreamSummary, through the transport."""
    with Producer(region="eu-west-1", kinesis=memory) as producer:
        with pytest.raises(RecordTooLargeError, match="1 MiB"):
            producer.put(STREAM, b"x" * (1024 * 1024), partition_key="k")
        producer.put(STREAM, b"x" * (1024 * 1024 - 1), partition_key="k")
    assert [len(r.data) for r in memory.records(STREAM)] == [1024 * 1024 - 1]


def test_a_closed_producer_refuses_puts_and_flushes_and_closes_again_quietly(
    memory: MemoryKinesis,
) -> None:
    producer = Producer(region="eu-west-1", kinesis=memory, linger=60)
    future = producer.put(STREAM, b"held", partition_key="k")
    producer.close()  # flushes what it held
    assert future.result(timeout=0).shard_id == first_shard_of("k")
    with pytest.raises(ProducerClosedError):
        producer.put(STREAM, b"x", partition_key="k")
    with pytest.raises(ProducerClosedError):
        producer.flush()
    producer.close()
    assert [r.data for r in memory.records(STREAM)] == [b"held"]
    # The memory stream outlives the producer: another one writes to it.
    with Producer(region="eu-west-1", kinesis=memory) as again:
        again.put(STREAM, b"again", partition_key="k")
    assert [r.data for r in memory.records(STREAM)] == [b"held", b"again"]


def test_a_closed_async_producer_refuses_puts(memory: MemoryKinesis) -> None:
    async def main() -> None:
        producer = AsyncProducer(region="eu-west-1", kinesis=memory, linger=60)
        future = await producer.put(STREAM, b"held", partition_key="k")
        await producer.close()
        assert future.done() and future.result().shard_id == first_shard_of("k")
        with pytest.raises(ProducerClosedError):
            await producer.put(STREAM, b"x", partition_key="k")
        await producer.close()

    asyncio.run(main())
    assert [r.data for r in memory.records(STREAM)] == [b"held"]


def test_kinesis_must_be_a_kinesis_transport() -> None:
    with pytest.raises(ConfigError, match=r"Producer\(kinesis\): .* is not a Kinesis transport"):
        Producer(region="eu-west-1", kinesis=object())  # type: ignore[arg-type]


TABLE_STREAM = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000"


def test_a_tables_stream_is_refused_by_name_at_put_and_in_topics(memory: MemoryKinesis) -> None:
    """A DynamoDB table's stream is read like a Kinesis stream (a Topic may name it) but never
    written: a put to it, or a producer listing it, says it is written through its table."""
    topic = Topic(TABLE_STREAM)
    with Producer(region="eu-west-1", kinesis=memory) as producer:
        for stream in (TABLE_STREAM, topic):
            with pytest.raises(ReadOnlyStreamError, match="which only its table writes"):
                producer.put(stream, b"{}", partition_key="k")
    with pytest.raises(ConfigError, match=r"^Producer\(topics\): .*written through its table"):
        Producer(region="eu-west-1", kinesis=memory, topics=[topic])
    with pytest.raises(ConfigError, match=r"^Topic\(stream\): a Kinesis stream name .* or a "):
        Topic("orders!")
