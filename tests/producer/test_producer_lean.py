"""The producer's lean PutRecords (``AwsKinesisTransport.put_records``) on kinesalite: the body
it builds is the one sent and signed, the answer it reads is the one Kinesis gave, errors still
go through botocore, and what lands is exactly what was put (binary data, non-ASCII keys,
explicit hash keys)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ClientError
from support.group import create_stream
from support.produced import kinesis, read_all
from support.standins import NodeStandIn

from kinesumer.kinesis.transport import AwsKinesisTransport
from kinesumer.producer.batching import Entry, Lane, fill_call, hold_back
from kinesumer.producer.options import ProducerOptions
from kinesumer.producer.records import PendingRecord
from kinesumer.producer.shards import ShardMap, ShardPacer


def _entries(n: int) -> list[Entry]:
    entries = []
    for i in range(n):
        key = f"clé-{i % 7}-✓"
        explicit = str(2**127 + i) if i % 3 == 0 else None
        record = PendingRecord("s", bytes(range(256))[i % 200 :] + b"%d" % i, key, explicit, None)
        entries.append(Entry([record], "unused", False))
    return entries


async def _put(url: str, stream: str, entries: list[Entry], seen: dict[str, Any]) -> Any:
    session = get_session()
    async with session.create_client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as client:
        transport = AwsKinesisTransport(client, lean=True)
        assert transport.lean

        def serialized(params: dict[str, Any], **_: Any) -> None:
            seen.setdefault("serialized", len(params["Records"]))

        def sent(params: dict[str, Any], **_: Any) -> None:
            seen.setdefault("sent", len(json.loads(params["body"])["Records"]))

        client.meta.events.register("before-parameter-build.kinesis.PutRecords", serialized)
        client.meta.events.register_last("before-call.kinesis.PutRecords", sent)
        response = await transport.put_records(stream, [e.wire() for e in entries])
        with pytest.raises(ClientError) as missing:
            await transport.put_records(stream + "-missing", [e.wire() for e in entries[:2]])
        seen["missing"] = missing.value.response["Error"]["Code"]
        return response


def test_lean_put_records_sends_its_own_body_and_reads_the_answer(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("lean")
    create_stream(kinesalite.url, stream, 3)
    entries = _entries(300)
    seen: dict[str, Any] = {}
    response = asyncio.run(_put(kinesalite.url, stream, entries, seen))
    # botocore validated and serialized one entry; the call carried all of them.
    assert seen["serialized"] == 1 and seen["sent"] == 300
    assert seen["missing"] == "ResourceNotFoundException"
    assert response["FailedRecordCount"] == 0 and len(response["Records"]) == 300
    landed = {
        (r.shard_id, r.sequence_number): (r.data, r.partition_key)
        for r in read_all(kinesalite.url, stream)
    }
    assert len(landed) == 300
    shards = ShardMap(kinesis(kinesalite.url).list_shards(StreamName=stream)["Shards"])
    for entry, result in zip(entries, response["Records"], strict=True):
        assert landed[(result["ShardId"], result["SequenceNumber"])] == (
            entry.data,
            entry.partition_key,
        )
        hash_key = entry.records[0].hash_key
        assert result["ShardId"] == shards.shard_for(hash_key)


def _lane(records: int, room: float) -> Lane:
    pacer = ShardPacer(1000, None, 0.0)
    pacer.take(int(1000 - room), 0)  # ``room`` records of the pace left at time 0
    lane = Lane("shard-0", pacer)
    for i in range(records):
        record = PendingRecord("s", b"x" * 100, f"k{i}", None, None)
        record.seq = i + 1
        lane.queue.append(record)
    return lane


def test_a_paced_shard_with_a_backlog_waits_for_a_batch_not_a_trickle() -> None:
    # 200 records queued, room for 10 of the pace: a call of 10 would cost a call's CPU for
    # 10 records; the lane waits for min_batch (50) of room instead: 40 ms at 1,000/s.
    lane = _lane(200, 10)
    entries, wake = fill_call([lane], 0.0, by_key=True, busy=set(), aggregate=False, min_batch=50)
    assert entries == [] and wake == pytest.approx(0.040)
    entries, _ = fill_call([lane], 0.0405, by_key=True, busy=set(), aggregate=False, min_batch=50)
    assert [e.records[0].seq for e in entries] == list(range(1, 51))
    # A backlog smaller than a batch goes as soon as it fits.
    small = _lane(5, 10)
    entries, _ = fill_call([small], 0.0, by_key=True, busy=set(), aggregate=False, min_batch=50)
    assert len(entries) == 5


def test_a_small_call_is_held_back_while_another_is_in_flight_in_key_order() -> None:
    lane = _lane(5, 1000)
    before = list(lane.queue)
    room_before = lane.pacer.room(0.0)
    busy: set[str] = set()
    entries, _ = fill_call([lane], 0.0, by_key=True, busy=busy, aggregate=False)
    assert len(entries) == 5 and busy and not lane.queue
    # 5 entries < min_call_entries (500 // 8 // 2): back where they were, pace and keys freed.
    assert hold_back(entries, {"shard-0": lane}, busy, ProducerOptions())
    assert list(lane.queue) == before and busy == set()
    assert lane.pacer.room(0.0) == room_before
    # A call big enough goes (hold_back leaves it alone).
    entries, _ = fill_call([_lane(40, 1000)], 0.0, by_key=True, busy=set(), aggregate=False)
    assert not hold_back(entries, {}, set(), ProducerOptions())


def test_sessions_share_one_data_loader() -> None:
    """Every client session kinesumer makes reads botocore's service models once per process:
    a fresh loader per session re-read and re-parsed them (~30 ms of CPU per client, most of a
    Producer's start)."""
    from kinesumer.aws import botocore_session

    first, second = botocore_session(), botocore_session()
    assert first.get_component("data_loader") is second.get_component("data_loader")
