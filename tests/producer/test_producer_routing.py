"""The producer on kinesalite, where a record goes and how calls are cut: ``put(...,
explicit_hash_key=)`` lands a record on the shard whose hash key range holds that key (not the
one its partition key hashes to), and records too big to share one PutRecords call go out in calls
of at most 5 MiB (Kinesis refuses a larger one), every record arriving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream
from support.produced import kinesis, read_all
from support.standins import NodeStandIn

from kinesumer import AsyncProducer, Producer, PutResult
from kinesumer.kinesis.transport import AwsKinesisTransport
from kinesumer.producer.records import MAX_CALL_BYTES


def hash_ranges(url: str, stream: str) -> dict[str, tuple[int, int]]:
    shards = kinesis(url).list_shards(StreamName=stream)["Shards"]
    return {
        s["ShardId"]: (
            int(s["HashKeyRange"]["StartingHashKey"]),
            int(s["HashKeyRange"]["EndingHashKey"]),
        )
        for s in shards
    }


def probe_keys(ranges: dict[str, tuple[int, int]]) -> dict[int, str]:
    """Each shard's first, middle and last hash key, with the shard that holds it."""
    return {
        key: shard_id
        for shard_id, (low, high) in ranges.items()
        for key in (low, (low + high) // 2, high)
    }


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_explicit_hash_key_lands_the_record_on_the_shard_whose_range_holds_it(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str], face: str
) -> None:
    stream = unique_name("ehk")
    create_stream(kinesalite.url, stream, 4)
    expected = probe_keys(hash_ranges(kinesalite.url, stream))
    assert len(set(expected.values())) == 4
    # One partition key for all: by its MD5 they would all go to one shard.
    puts = [(str(key).encode(), str(key)) for key in expected]

    if face == "sync":
        with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1") as producer:
            futures = [
                producer.put(stream, data, partition_key="same", explicit_hash_key=key)
                for data, key in puts
            ]
            producer.flush()
            results = [f.result() for f in futures]
    else:

        async def main() -> list[PutResult]:
            async with AsyncProducer(kinesis_endpoint=kinesalite.url, region="us-east-1") as p:
                pending = [
                    await p.put(stream, data, partition_key="same", explicit_hash_key=key)
                    for data, key in puts
                ]
                await p.flush()
                return [await f for f in pending]

        results = asyncio.run(main())

    assert [r.shard_id for r in results] == list(expected.values())
    landed = {int(r.data): r.shard_id for r in read_all(kinesalite.url, stream)}
    assert landed == expected


def test_records_too_big_for_one_call_go_out_in_calls_of_at_most_5_mib(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """12 records of ~700 KB (8.4 MB) on 12 shards, one each, so that no shard's pace (1 MiB/s)
    splits the calls: only the 5 MiB limit does, into 7 + 5 records."""
    stream = unique_name("big")
    create_stream(kinesalite.url, stream, 12)
    starts = [low for low, _ in hash_ranges(kinesalite.url, stream).values()]
    call_bytes: list[int] = []
    put_records = AwsKinesisTransport.put_records

    async def counted(transport: Any, name: str, entries: list[Any]) -> Any:
        # Each entry's size as the 5 MiB call limit counts it: data and UTF-8 partition key.
        call_bytes.append(sum(len(e.Data) + len(e.PartitionKey.encode()) for e in entries))
        return await put_records(transport, name, entries)

    monkeypatch.setattr(AwsKinesisTransport, "put_records", counted)
    payloads = [bytes([65 + i]) * 700_000 for i in range(12)]
    # A long linger: the records wait for the 5 MiB of a full call or flush(), not for time.
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1", linger=60) as producer:
        futures = [
            producer.put(stream, data, partition_key=f"k{i}", explicit_hash_key=str(starts[i]))
            for i, data in enumerate(payloads)
        ]
        producer.flush()
        assert all(isinstance(f.result(), PutResult) for f in futures)
        stats = producer.stats()
    assert call_bytes and max(call_bytes) <= MAX_CALL_BYTES == 5 * 1024 * 1024
    assert sum(call_bytes) == sum(len(p) + 2 + (i >= 10) for i, p in enumerate(payloads))
    assert len(call_bytes) == stats.calls == 2  # as few as the limit allows
    assert sorted(r.data for r in read_all(kinesalite.url, stream)) == payloads
