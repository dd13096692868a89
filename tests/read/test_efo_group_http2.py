"""Enhanced fan-out end to end on the real transport: a group member whose subscriptions go
through ``ShardSubscriber`` over HTTP/2 to tests/support/efo_standin.py, while shards, leases and
checkpoints live on kinesalite + dynalite.

The stand-in serves each shard's real records (read back from kinesalite with their 56-digit
sequence numbers), so a resubscription from a continuation is checked against the same numbers
the engine checkpoints. Subscriptions that expire every few milliseconds and streams reset
mid-stream must still deliver every record exactly once, in shard order.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.credentials import Credentials
from support.efo_standin import EfoStandIn, ScriptedShard
from support.group import Member, create_stream, duplicates, kinesis, make_config, put
from support.group import setup_table as create_table
from support.wait import eventually

from kinesumer import Config, Record
from kinesumer.aws import RequestStats
from kinesumer.consumer.base import engine_of
from kinesumer.kinesis.efo.subscriber import ShardSubscriber
from kinesumer.read.efo_session import EfoTransport

RECORDS = 300


@pytest.fixture
def env(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        enhanced_fan_out=True,
    )
    create_table(config)
    return {"url": kinesalite.url, "config": config, "stream": unique_name("s")}


def shard_records(url: str, stream: str) -> dict[str, list[dict[str, Any]]]:
    """Every record of every shard, from TRIM_HORIZON, as kinesalite stores them."""
    client = kinesis(url)
    out: dict[str, list[dict[str, Any]]] = {}
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records: list[dict[str, Any]] = []
        while True:
            page = client.get_records(ShardIterator=iterator, Limit=1000)
            records += page["Records"]
            if not page["Records"]:
                break
            iterator = page["NextShardIterator"]
        out[shard["ShardId"]] = records
    return out


def http2_transport(config: Config, url: str) -> EfoTransport:
    """Stream and consumer ARNs made up (the stand-in checks neither); subscriptions on the real
    ShardSubscriber against the stand-in at ``url``."""

    async def stream_arn(client: Any, stream: str) -> str:
        return f"arn:aws:kinesis:us-east-1:000000000000:stream/{stream}"

    async def register(client: Any, arn: str, name: str) -> str:
        return f"{arn}/consumer/{name}:1"

    subscriber_config = config.replace(kinesis_endpoint=url)
    credentials = Credentials("x", "x")
    return EfoTransport(
        stream_arn,
        register,
        lambda: ShardSubscriber(subscriber_config, credentials, RequestStats()),
    )


async def consume_through_standin(env: dict[str, Any], **standin: Any) -> EfoStandIn:
    """Put RECORDS on a 2-shard stream, serve them from the stand-in, consume them with one
    member; check every record once and in shard order. Returns the stand-in (closed)."""
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 2)
    put(url, stream, 0, RECORDS)
    stored = shard_records(url, stream)
    sink: list[tuple[str, Record]] = []
    async with EfoStandIn(takeover_after=0.0, batch_size=25, **standin) as server:
        for shard_id, records in stored.items():
            scripted = server.shards[shard_id] = ScriptedShard()
            for r in records:
                scripted.records.append(
                    {
                        "SequenceNumber": int(r["SequenceNumber"]),
                        "Data": r["Data"],
                        "PartitionKey": r["PartitionKey"],
                    }
                )
        member = Member(config.replace(client_id="m1"), [stream], sink)
        engine_of(member.consumer).efo_transport = http2_transport(config, server.url)
        member.start()
        try:
            await eventually(
                lambda: len(sink) >= RECORDS or member.error is not None,
                30,
                f"{RECORDS} records through HTTP/2",
                lambda: f"{len(sink)} delivered, {len(server.subscriptions)} subscriptions",
            )
        finally:
            await member.close()
    assert member.error is None
    assert duplicates(sink) == {}
    for shard_id, records in stored.items():
        got = [(r.sequence_number, r.data) for _, r in sink if r.shard_id == shard_id]
        assert got == [(r["SequenceNumber"], r["Data"]) for r in records], shard_id
    assert len(sink) == RECORDS
    return server


async def test_expiring_subscriptions_resume_after_the_continuation_over_http2(
    env: dict[str, Any],
) -> None:
    server = await consume_through_standin(env, expire_after_events=2)
    # Expiry ended subscriptions mid-stream: each shard was subscribed more than once, and
    # the resubscriptions started AFTER a sequence number (the checks above: no gap, no replay).
    for shard_id in server.shards:
        assert len([s for s in server.subscriptions if s.shard_id == shard_id]) > 1
    kinds = [json_position(r)["Type"] for r in server.requests]
    assert kinds.count("AFTER_SEQUENCE_NUMBER") >= len(server.shards)


async def test_streams_reset_mid_stream_resubscribe_without_gap_or_replay(
    env: dict[str, Any],
) -> None:
    server = await consume_through_standin(env, reset_after_events=2)
    for shard_id in server.shards:
        assert len([s for s in server.subscriptions if s.shard_id == shard_id]) > 1


def json_position(request: dict[str, Any]) -> dict[str, Any]:
    position: dict[str, Any] = json.loads(request["body"])["StartingPosition"]
    return position
