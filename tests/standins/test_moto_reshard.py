"""moto's SplitShard with :func:`support.moto_reshard.aws_like_splits`: the split of Kinesis
(the parent keeps its records and ends; new records go to the children), which the reshard
tests on moto rely on. Without the patch moto fails each of these."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from support.moto_reshard import aws_like_splits


def read_shard(client: Any, name: str, shard_id: str) -> tuple[list[bytes], bool]:
    """Every record of the shard from TRIM_HORIZON, and whether GetRecords ended it (a null
    ``NextShardIterator``) within a few calls."""
    iterator = client.get_shard_iterator(
        StreamName=name, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    found: list[bytes] = []
    for _ in range(5):
        answer = client.get_records(ShardIterator=iterator)
        found += [r["Data"] for r in answer["Records"]]
        iterator = answer.get("NextShardIterator")
        if iterator is None:
            return found, True
    return found, False


def test_a_split_keeps_the_parents_records_ends_it_and_routes_new_records_to_the_children(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws_like_splits(monkeypatch)
    client = boto3.client("kinesis", endpoint_url=moto_url, region_name="us-east-1")
    client.create_stream(StreamName="s", ShardCount=1)
    client.get_waiter("stream_exists").wait(StreamName="s", WaiterConfig={"Delay": 0.1})
    before = [f"before-{n}".encode() for n in range(20)]
    for data in before:
        client.put_record(StreamName="s", Data=data, PartitionKey=data.decode())
    parent = client.list_shards(StreamName="s")["Shards"][0]
    high = int(parent["HashKeyRange"]["EndingHashKey"])
    client.split_shard(
        StreamName="s", ShardToSplit=parent["ShardId"], NewStartingHashKey=str(high // 2)
    )
    after = [f"after-{n}".encode() for n in range(20)]
    for data in after:
        client.put_record(StreamName="s", Data=data, PartitionKey=data.decode())

    shards = client.list_shards(StreamName="s")["Shards"]
    closed = next(s for s in shards if s["ShardId"] == parent["ShardId"])
    assert closed["SequenceNumberRange"]["EndingSequenceNumber"] == "20"
    assert read_shard(client, "s", parent["ShardId"]) == (before, True)
    children = [s["ShardId"] for s in shards if s.get("ParentShardId") == parent["ShardId"]]
    assert len(children) == 2
    read = [read_shard(client, "s", c) for c in children]
    assert sorted(d for datas, _ in read for d in datas) == sorted(after)
    assert not any(ended for _, ended in read)  # open shards never end
