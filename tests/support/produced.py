"""Reading back what a producer wrote, for the producer tests: every record of a stream, by
shard in sequence order, aggregates unpacked by kinesumer's own reader."""

from __future__ import annotations

from typing import Any

import boto3

from kinesumer.kinesis.kpl import to_records
from kinesumer.models import Record


def kinesis(url: str) -> Any:
    return boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")


def read_all(url: str, stream: str) -> list[Record]:
    """Every record of ``stream`` (all shards, parents before children as listed), unpacked."""
    client = kinesis(url)
    out: list[Record] = []
    shards = client.list_shards(StreamName=stream)["Shards"]
    for shard in shards:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            response = client.get_records(ShardIterator=iterator, Limit=10000)
            out.extend(to_records(stream, shard["ShardId"], response["Records"], None))
            if not response["Records"] and response.get("MillisBehindLatest", 0) == 0:
                break
            iterator = response.get("NextShardIterator")
    return out


def by_key(records: list[Record]) -> dict[str, list[bytes]]:
    """Each partition key's payloads in the order a reader meets them (per shard, by
    sequence and sub-sequence number; a key's shards in lineage order as listed)."""
    keyed: dict[str, list[bytes]] = {}
    for record in records:
        keyed.setdefault(record.partition_key, []).append(record.data)
    return keyed
