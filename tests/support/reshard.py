"""Resharding on kinesalite while a group reads: a split then a merge, and the per-key order
every reshard must keep (the reshard and broadcast tests)."""

from __future__ import annotations

from collections import defaultdict

from kinesumer import Record
from support.group import (
    kinesis,
)

KEYS = 24


def key_of(i: int) -> str:
    return f"key-{i % KEYS}"


def split_and_merge(url: str, stream: str) -> None:
    """Split shard 0 at the middle of its hash range; merge shards 1 and 2."""
    client = kinesis(url)
    shards = client.list_shards(StreamName=stream)["Shards"]
    first = shards[0]
    low, high = (int(first["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream,
        ShardToSplit=first["ShardId"],
        NewStartingHashKey=str((low + high) // 2),
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    client.merge_shards(
        StreamName=stream,
        ShardToMerge=shards[1]["ShardId"],
        AdjacentShardToMerge=shards[2]["ShardId"],
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})


def assert_per_key_order(sink: list[tuple[str, Record]]) -> None:
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, record in sink:
        by_key[record.partition_key].append(int(record.data))
    for key, numbers in by_key.items():
        assert numbers == sorted(numbers), f"{key} delivered out of order"
