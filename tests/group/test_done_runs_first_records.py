"""A new owner whose first records after the checkpoint are all inside the done runs it
inherited (issue 17 review): through ``consume()``, at the default ``LATEST``, a closed parent
shard must still be finished, so its children are read (kinesalite + dynalite).

The item is what an owner writes when its mark stopped inside a run it had inherited (the run is
cut to start at the mark, :func:`kinesumer.core.done_ranges.above`): every record after the
checkpoint is done. The next owner skips them all and delivers nothing from the parent; its mark
must still move over them, or the parent is never drained and its children never read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import boto3
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.core import done_ranges
from kinesumer.models import Position


async def test_consume_finishes_a_parent_whose_records_were_all_done_before(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
    )
    setup_table(config)
    stream, url = unique_name("s"), kinesalite.url
    create_stream(url, stream, 1)
    put(url, stream, 0, 6)
    client = kinesis(url)
    parent = client.list_shards(StreamName=stream)["Shards"][0]
    parent_id = parent["ShardId"]
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=parent_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    seqs = [r["SequenceNumber"] for r in client.get_records(ShardIterator=iterator)["Records"]]
    assert len(seqs) == 6
    low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=parent_id, NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    children = put(url, stream, 6, 4)
    # Checkpoint after record 0; records 1..5 done above it (the run starts at the mark).
    base = Position(seqs[0])
    blob, kept = done_ranges.encode(base, [((int(seqs[0]), 0), (int(seqs[5]), 0))])
    assert kept == 1
    boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    ).put_item(
        TableName=config.dynamodb_table,
        Item={
            "pk": {"S": f"check_point#{config.app}#{stream}"},
            "sk": {"S": parent_id},
            "sequence_number": {"S": seqs[0]},
            "sub_sequence_number": {"N": "0"},
            "lease": {"N": "3"},
            "last_update": {"N": "1"},
            "done": {"B": blob},
        },
    )
    consumer = AsyncKinesumer(config.replace(client_id="c"))
    sink: list[Record] = []

    async def run() -> None:
        async for record in consumer.consume([stream]):
            sink.append(record)

    task = asyncio.create_task(run())
    try:
        await eventually(
            lambda: len(sink) >= len(children),
            what="the children's records (the parent finished)",
            diagnose=lambda: repr(consumer.stats().shards),
        )
    finally:
        await consumer.aclose()
        await asyncio.wait_for(task, 10)
    assert sorted(r.data for r in sink) == sorted(children)
