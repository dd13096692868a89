"""``MemoryKinesis`` where no stand-in can be compared with it: its clock (iterator expiry,
retention, lag), failures on demand, resharding to a shard count, threads; and the reader over it
(retries and error mapping above the transport run as they do over AWS)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from botocore.exceptions import ClientError

from kinesumer.aws import RequestStats
from kinesumer.errors import StreamNotFoundError
from kinesumer.kinesis.lean import PutEntry
from kinesumer.kinesis.reader import IteratorExpired, KinesisReader
from kinesumer.testing import MemoryKinesis

SHARD = "shardId-000000000000"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def code_of(exc: ClientError) -> str:
    return str(exc.response["Error"]["Code"])


async def test_an_iterator_expires_after_five_minutes_of_its_clock() -> None:
    clock = Clock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream("s")
    iterator = (await memory.get_shard_iterator("s", SHARD, "TRIM_HORIZON")).iterator
    clock.now += 299
    answer = await memory.get_records(iterator, 10)
    assert answer.NextShardIterator is not None
    clock.now += 301
    with pytest.raises(ClientError) as caught:
        await memory.get_records(answer.NextShardIterator, 10)
    assert code_of(caught.value) == "ExpiredIteratorException"
    reader = KinesisReader(memory, RequestStats(), "us-east-1")
    with pytest.raises(IteratorExpired):
        await reader.get_records("s", SHARD, answer.NextShardIterator, 10, None)


async def test_records_older_than_the_retention_are_gone() -> None:
    clock = Clock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream("s", retention_hours=24)
    memory.put("s", b"old", "k")
    clock.now += 23 * 3600
    memory.put("s", b"new", "k")
    assert [r.data for r in memory.records("s")] == [b"old", b"new"]
    clock.now += 2 * 3600
    iterator = (await memory.get_shard_iterator("s", SHARD, "TRIM_HORIZON")).iterator
    answer = await memory.get_records(iterator, 10)
    assert [r.Data for r in answer.Records] == [b"new"]


async def test_a_closed_shard_ages_out_with_the_retention() -> None:
    clock = Clock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream("s", retention_hours=24)
    memory.split_shard("s", SHARD, 2**127)
    listed = await memory.list_shards("s")
    assert SHARD in [s["ShardId"] for s in listed["Shards"]]
    clock.now += 25 * 3600
    listed = await memory.list_shards("s")
    assert SHARD not in [s["ShardId"] for s in listed["Shards"]]
    # The children still name it: the reader's lineage treats an unlisted parent as aged out.
    assert {s.get("ParentShardId") for s in listed["Shards"]} == {SHARD}


async def test_lag_and_limit() -> None:
    clock = Clock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream("s")
    for i in range(5):
        memory.put("s", f"{i}".encode(), "k")
        clock.now += 1
    iterator = (await memory.get_shard_iterator("s", SHARD, "TRIM_HORIZON")).iterator
    first = await memory.get_records(iterator, 2)
    assert [r.Data for r in first.Records] == [b"0", b"1"]
    assert first.MillisBehindLatest == 3000  # the next unread record arrived 3 s ago
    assert first.NextShardIterator is not None
    rest = await memory.get_records(first.NextShardIterator, 10)
    assert [r.Data for r in rest.Records] == [b"2", b"3", b"4"]
    assert rest.MillisBehindLatest == 0
    with pytest.raises(ClientError) as caught:
        await memory.get_records(iterator, 10_001)
    assert code_of(caught.value) == "InvalidArgumentException"


async def test_injected_throttling_is_retried_by_the_reader() -> None:
    memory = MemoryKinesis()
    memory.create_stream("s")
    memory.put("s", b"x", "k")
    stats = RequestStats()
    reader = KinesisReader(memory, stats, "us-east-1")
    iterator = await reader.shard_iterator("s", SHARD, None, "TRIM_HORIZON")
    memory.fail_next("GetRecords", code="ProvisionedThroughputExceededException", times=2)
    batch = await reader.get_records("s", SHARD, iterator, 10, None)
    assert [r.data for r in batch.records] == [b"x"]
    assert sum(stats.retries.values()) == 2


async def test_injected_failures_carry_aws_code_and_status_and_run_out() -> None:
    memory = MemoryKinesis()
    memory.create_stream("s")
    memory.fail_next("ListShards", code="InternalFailure")
    with pytest.raises(ClientError) as caught:
        await memory.list_shards("s")
    assert code_of(caught.value) == "InternalFailure"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert len((await memory.list_shards("s"))["Shards"]) == 1


async def test_a_missing_stream_reaches_the_reader_as_stream_not_found() -> None:
    reader = KinesisReader(MemoryKinesis(), RequestStats(), "us-east-1")
    with pytest.raises(StreamNotFoundError):
        await reader.check_stream("absent")


async def test_throttled_entries_fail_inside_a_successful_put_records() -> None:
    memory = MemoryKinesis()
    memory.create_stream("s")
    memory.fail_next_entries(2)
    answer = await memory.put_records("s", [PutEntry(f"{i}".encode(), "k") for i in range(4)])
    assert answer["FailedRecordCount"] == 2
    assert [e.get("ErrorCode") for e in answer["Records"]] == [
        "ProvisionedThroughputExceededException",
        "ProvisionedThroughputExceededException",
        None,
        None,
    ]
    assert [r.data for r in memory.records("s")] == [b"2", b"3"]


async def test_update_shard_count_keeps_lineage() -> None:
    memory = MemoryKinesis()
    memory.create_stream("s", shards=2)
    memory.update_shard_count("s", 4)
    reader = KinesisReader(memory, RequestStats(), "us-east-1")
    shards = await reader.list_shards("s")
    open_shards = [s for s in shards if not s.closed]
    assert len(open_shards) == 4
    assert all(
        s.parent_shard_id in {"shardId-000000000000", "shardId-000000000001"} for s in open_shards
    )
    memory.update_shard_count("s", 1)
    shards = await reader.list_shards("s")
    (last,) = [s for s in shards if not s.closed]
    assert last.parent_shard_id is not None and last.adjacent_parent_shard_id is not None
    page = await memory.list_shards("s")
    ranges = [
        (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in page["Shards"]
        if s["ShardId"] == last.shard_id
    ]
    assert ranges == [(0, 2**128 - 1)]


def test_puts_from_many_threads_keep_every_record_and_their_order() -> None:
    memory = MemoryKinesis()
    memory.create_stream("s", shards=2)

    def put(thread: int) -> None:
        for i in range(200):
            memory.put("s", f"{thread}-{i}".encode(), f"key-{thread}")

    threads = [threading.Thread(target=put, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = memory.records("s")
    assert len(records) == 1600
    numbers = [int(r.sequence_number) for r in records]
    assert len(set(numbers)) == 1600
    for t in range(8):
        mine = [r.data for r in records if r.partition_key == f"key-{t}"]
        assert mine == [f"{t}-{i}".encode() for i in range(200)]


async def test_subscribe_to_shard_follows_puts_to_the_shards_end() -> None:
    memory = MemoryKinesis()
    memory.create_stream("s")
    arn = (await memory.describe_stream_summary("s"))["StreamDescriptionSummary"]["StreamARN"]
    consumer = await memory.register_stream_consumer(arn, "c")
    memory.put("s", b"first", "k")
    events = memory.subscribe_to_shard(consumer["ConsumerARN"], SHARD, {"Type": "TRIM_HORIZON"})
    first = await anext(events)
    assert [r["Data"] for r in first.records] == [b"first"]
    assert first.continuation_sequence_number == first.records[-1]["SequenceNumber"]
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0)
    assert not waiting.done()  # nothing new: the subscription waits for a put
    await memory.put_record("s", b"second", "k")
    second = await waiting
    assert [r["Data"] for r in second.records] == [b"second"]
    memory.split_shard("s", SHARD, 2**127)
    last = await anext(events)
    assert last.continuation_sequence_number is None
    assert sorted(c["ShardId"] for c in last.child_shards or []) == [
        "shardId-000000000001",
        "shardId-000000000002",
    ]
    with pytest.raises(StopAsyncIteration):
        await anext(events)
