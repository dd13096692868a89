"""Enhanced fan-out transport: stream consumers and SubscribeToShard over HTTP/2, on
kinesis-local (the real protocol as kinesis-mock serves it) and on tests/support/efo_standin.py
(what kinesis-local does not do: initial-response, child shards, expiry, takeover, resets, errors,
flow control)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from support.efo_standin import EfoStandIn, ScriptedShard
from support.standins import KinesisLocalStandIn, find_free_port
from support.wait import eventually

from kinesumer import Config
from kinesumer.aws import RequestStats
from kinesumer.aws.clients import ClientFactory
from kinesumer.errors import (
    AccessDeniedError,
    EnhancedFanOutNotInstalledError,
    StreamNotFoundError,
    TransientAWSError,
)
from kinesumer.kinesis.efo.consumers import deregister_consumer, register_consumer, stream_arn
from kinesumer.kinesis.efo.errors import (
    SubscribeRetryable,
    SubscribeTargetNotFound,
    SubscribeThrottled,
    SubscriptionInUse,
    SubscriptionReset,
)
from kinesumer.kinesis.efo.subscriber import (
    ShardSubscriber,
    SubscribeEvent,
    SubscriptionEnded,
)

CONSUMER = "arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1"


def efo_config(endpoint: str) -> Config:
    return Config(
        app="efo-transport",
        dynamodb_table="efo-table",
        region="us-east-1",
        kinesis_endpoint=endpoint,
        enhanced_fan_out=True,
    )


@contextlib.asynccontextmanager
async def subscriber(endpoint: str, stats: RequestStats | None = None) -> AsyncIterator[Any]:
    sub = ShardSubscriber(efo_config(endpoint), None, stats or RequestStats())
    await sub.open()
    try:
        yield sub
    finally:
        await sub.close()


async def take(events: AsyncIterator[SubscribeEvent], count: int) -> list[SubscribeEvent]:
    """The next ``count`` events that carry records (empty heartbeats skipped)."""
    taken: list[SubscribeEvent] = []
    while len(taken) < count:
        event = await anext(events)
        if event.records:
            taken.append(event)
    return taken


def sequences(events: list[SubscribeEvent]) -> list[int]:
    return [int(r["SequenceNumber"]) for e in events for r in e.records]


# -- kinesis-local ---------------------------------------------------------------------------


async def test_kinesis_local_registers_once_and_pushes_records_over_http2(
    kinesis_local: KinesisLocalStandIn, unique_name: Any
) -> None:
    stream = unique_name("efo")
    setup = boto3.client("kinesis", endpoint_url=kinesis_local.url, region_name="us-east-1")
    setup.create_stream(StreamName=stream, ShardCount=1)

    def active() -> bool:
        summary = setup.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
        return bool(summary["StreamStatus"] == "ACTIVE")

    await eventually(active, 10, "the stream ACTIVE")
    put = [setup.put_record(StreamName=stream, Data=b"r%d" % i, PartitionKey="p") for i in range(3)]
    stats = RequestStats()
    config = efo_config(kinesis_local.url)
    async with ClientFactory(config, stats).kinesis() as client:
        arn = await stream_arn(client, stream, stats=stats)
        with pytest.raises(StreamNotFoundError):
            await stream_arn(client, unique_name("missing"), stats=stats)
        # Members of one app racing at start-up all end with the same consumer.
        arns = await asyncio.gather(
            *(register_consumer(client, arn, "app", stats=stats) for _ in range(3))
        )
        assert len(set(arns)) == 1
        assert await register_consumer(client, arn, "app", stats=stats) == arns[0]
        async with subscriber(kinesis_local.url, stats) as sub:
            shard = put[0]["ShardId"]
            events = sub.subscribe(arns[0], shard, {"Type": "TRIM_HORIZON"})
            async with contextlib.aclosing(events):
                (first,) = await take(events, 1)
                assert [r["Data"] for r in first.records] == [b"r0", b"r1", b"r2"]
                assert [r["SequenceNumber"] for r in first.records] == [
                    p["SequenceNumber"] for p in put
                ]
                assert first.continuation_sequence_number == put[-1]["SequenceNumber"]
                assert first.records[0]["ApproximateArrivalTimestamp"].tzinfo is not None
                # kinesis-local refuses a second subscription while one is open.
                second = sub.subscribe(arns[0], shard, {"Type": "LATEST"})
                with pytest.raises(SubscriptionInUse) as refused:
                    await anext(second)
                assert refused.value.code == "ResourceInUseException"
                # Unlike AWS, kinesis-local never ends a closed shard's subscription: after a
                # split the parent's events stay empty, with a continuation and no children.
                # The engine must find SHARD_END by listing shards there.
                setup.split_shard(
                    StreamName=stream, ShardToSplit=shard, NewStartingHashKey=str(2**127)
                )
                await eventually(active, 10, "the split done")
                for _ in range(2):
                    later = await anext(events)
                    assert not later.records and later.child_shards is None
                    assert later.continuation_sequence_number == put[-1]["SequenceNumber"]
        assert await deregister_consumer(client, arn, "app", stats=stats)
        # Registering again after a deregistration waits out DELETING if it must.
        again = await register_consumer(client, arn, "app", stats=stats)
        assert again.startswith(arn + "/consumer/app:")
    assert stats.counts()["requests"]["kinesis:SubscribeToShard"] == 2


# -- the HTTP/2 stand-in ---------------------------------------------------------------------


async def test_signed_request_initial_response_records_and_shard_end_with_children() -> None:
    children = [{"ShardId": "shardId-1", "ParentShards": ["shardId-0"], "HashKeyRange": {}}]
    async with EfoStandIn(initial_response=True, batch_size=2) as server:
        shard = server.shards["shardId-0"] = ScriptedShard(closed=True, child_shards=children)
        numbers = [shard.put(b"x%d" % i) for i in range(5)]
        async with subscriber(server.url) as sub:
            events = [
                e async for e in sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
            ]
    assert sequences(events) == numbers
    assert [r["Data"] for e in events for r in e.records] == [b"x%d" % i for i in range(5)]
    stamp = events[0].records[0]["ApproximateArrivalTimestamp"]
    assert stamp == datetime.fromtimestamp(1_700_000_000.5, timezone.utc)
    assert events[-1].continuation_sequence_number is None
    assert events[-1].child_shards == children
    assert all(e.continuation_sequence_number for e in events[:-1])
    # The request was signed with SigV4 for kinesis with the session's credentials.
    (request,) = server.requests
    headers = request["headers"]
    assert headers["x-amz-target"] == "Kinesis_20131202.SubscribeToShard"
    assert headers["x-amz-security-token"] == "testing"
    signed = headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    unsigned = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=request["body"],
        headers={k: v for k, v in headers.items() if k in signed and k != "host"},
    )
    unsigned.context["timestamp"] = headers["x-amz-date"]
    auth = SigV4Auth(Credentials("testing", "testing", "testing"), "kinesis", "us-east-1")
    signature = auth.signature(
        auth.string_to_sign(unsigned, auth.canonical_request(unsigned)), unsigned
    )
    assert headers["authorization"].endswith(f"Signature={signature}")


async def test_expiry_then_resubscribe_after_continuation_has_no_gap_and_no_replay() -> None:
    async with EfoStandIn(expire_after=0.3, batch_size=4) as server:
        shard = server.shards["shardId-0"] = ScriptedShard()
        numbers = [shard.put(b"a") for _ in range(9)]
        got: list[SubscribeEvent] = []
        async with subscriber(server.url) as sub:
            with pytest.raises(SubscriptionEnded):
                async for event in sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"}):
                    got.append(event)
            numbers += [shard.put(b"b") for _ in range(6)]
            position = {
                "Type": "AFTER_SEQUENCE_NUMBER",
                "SequenceNumber": got[-1].continuation_sequence_number,
            }
            events = sub.subscribe(CONSUMER, "shardId-0", position)
            async with contextlib.aclosing(events):
                got += await take(events, 2)
    assert sequences(got) == numbers
    assert got[0].millis_behind_latest is not None


async def test_takeover_refused_early_then_takes_over_and_the_first_is_told() -> None:
    async with EfoStandIn(takeover_after=0.3, initial_response=False) as server:
        shard = server.shards["shardId-0"] = ScriptedShard()
        shard.put(b"a")
        async with subscriber(server.url) as sub:
            first = sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
            async with contextlib.aclosing(first):
                await take(first, 1)
                with pytest.raises(SubscriptionInUse):
                    await anext(sub.subscribe(CONSUMER, "shardId-0", {"Type": "LATEST"}))
                started = server.subscriptions[0].started
                await eventually(lambda: time.monotonic() - started >= 0.3, 5, "takeover age")
                second = sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
                async with contextlib.aclosing(second):
                    assert sequences(await take(second, 1)) == [shard.records[0]["SequenceNumber"]]
                    with pytest.raises(SubscriptionInUse):
                        while True:
                            await anext(first)


async def test_reset_mid_stream_and_refused_connection_are_retryable() -> None:
    async with EfoStandIn(reset_after_events=2, batch_size=1) as server:
        shard = server.shards["shardId-0"] = ScriptedShard()
        for _ in range(5):
            shard.put(b"a")
        got: list[SubscribeEvent] = []
        async with subscriber(server.url) as sub:
            with pytest.raises(SubscriptionReset) as reset:
                async for event in sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"}):
                    got.append(event)
    assert len(got) == 2
    assert isinstance(reset.value, TransientAWSError)
    assert reset.value.code == "RemoteProtocolError"
    async with subscriber(f"http://127.0.0.1:{find_free_port()}") as sub:
        with pytest.raises(SubscriptionReset) as refused:
            await anext(sub.subscribe(CONSUMER, "shardId-0", {"Type": "LATEST"}))
    assert refused.value.code == "ConnectError"


@pytest.mark.parametrize(
    ("status", "code", "raised"),
    [
        (400, "LimitExceededException", SubscribeThrottled),
        (500, "InternalFailure", SubscriptionReset),
        (503, "ServiceUnavailable", SubscriptionReset),
        # The consumer or the stream is gone: the fetcher finds out which (test_efo_deregistered).
        (400, "ResourceNotFoundException", SubscribeTargetNotFound),
        (400, "AccessDeniedException", AccessDeniedError),
    ],
)
async def test_error_answers_become_the_library_errors(
    status: int, code: str, raised: type[Exception]
) -> None:
    stats = RequestStats()
    async with EfoStandIn() as server:
        server.shards["shardId-0"] = ScriptedShard()
        server.fail_with.append((status, code))
        async with subscriber(server.url, stats) as sub:
            with pytest.raises(raised) as error:
                await anext(sub.subscribe(CONSUMER, "shardId-0", {"Type": "LATEST"}))
    assert isinstance(error.value, SubscribeRetryable) == issubclass(raised, SubscribeRetryable)
    if isinstance(error.value, SubscribeRetryable):
        assert error.value.code == code
    assert stats.counts()["requests"] == {"kinesis:SubscribeToShard": 1}
    throttled = stats.counts()["throttles"]
    assert throttled == ({"kinesis:SubscribeToShard": 1} if raised is SubscribeThrottled else {})


async def test_a_slow_reader_stops_the_server_through_http2_flow_control() -> None:
    megabyte = b"m" * (1 << 20)
    async with EfoStandIn(batch_size=1, initial_response=False) as server:
        shard = server.shards["shardId-0"] = ScriptedShard(closed=True)
        for _ in range(24):
            shard.put(megabyte)
        async with subscriber(server.url) as sub:
            events = sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
            async with contextlib.aclosing(events):
                got = await take(events, 1)
                # Not reading: the server runs out of HTTP/2 window and waits.
                await eventually(lambda: server.flow_blocked > 0, 20, "the server blocked")
                sent = server.subscriptions[0].sent_bytes
                wire_total = 24 * len(megabyte) * 4 // 3
                assert sent < wire_total * 3 // 4
                got += [e async for e in events]
    assert len([r for e in got for r in e.records]) == 24
    assert server.subscriptions[0].sent_bytes > sent


async def test_closing_the_iterator_early_closes_its_connection() -> None:
    """An abandoned subscription must not hold a connection other shards need: its unread data
    would use up a shared connection's HTTP/2 window."""
    megabyte = b"m" * (1 << 20)
    async with EfoStandIn(initial_response=False, batch_size=1) as server:
        busy = server.shards["shardId-0"] = ScriptedShard()
        for _ in range(4):
            busy.put(megabyte)
        quiet = server.shards["shardId-1"] = ScriptedShard(closed=True)
        quiet.put(b"q")
        async with subscriber(server.url) as sub:
            events = sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
            await take(events, 1)
            assert server.open_subscriptions("shardId-0")
            await events.aclose()
            await eventually(lambda: not server.open_subscriptions("shardId-0"), 5, "closed")
            other = [e async for e in sub.subscribe(CONSUMER, "shardId-1", {"Type": "LATEST"})]
            assert other[-1].continuation_sequence_number is None
            # close() ends the subscriptions still open: their iterators raise a reset.
            events = sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
            await take(events, 1)
            await sub.close()
            with pytest.raises(SubscriptionReset):
                while True:
                    await anext(events)


async def test_role_arn_signs_with_the_assumed_roles_credentials(moto_url: str) -> None:
    """Cross-account: the subscription is signed with credentials from sts:AssumeRole on
    role_arn (moto's STS), as the engine's Kinesis client is, not with the caller's own."""
    config = efo_config("http://127.0.0.1:1").replace(
        role_arn="arn:aws:iam::210987654321:role/stream-reader", sts_endpoint=moto_url
    )
    async with EfoStandIn(initial_response=False) as server:
        server.shards["shardId-0"] = ScriptedShard()
        server.shards["shardId-0"].put(b"a")
        sub = ShardSubscriber(config.replace(kinesis_endpoint=server.url), None, RequestStats())
        await sub.open()
        events = sub.subscribe(CONSUMER, "shardId-0", {"Type": "TRIM_HORIZON"})
        async with contextlib.aclosing(events):
            await take(events, 1)
        await sub.close()
    authorization = server.requests[0]["headers"]["authorization"]
    assert "Credential=testing/" not in authorization
    assert server.requests[0]["headers"]["x-amz-security-token"] != "testing"


def test_without_the_extra_the_subscriber_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "httpx", None)
    monkeypatch.delitem(sys.modules, "kinesumer.kinesis.efo.subscriber")
    with pytest.raises(EnhancedFanOutNotInstalledError, match=r"kinesumer\[efo\]"):
        importlib.import_module("kinesumer.kinesis.efo.subscriber")
    assert issubclass(EnhancedFanOutNotInstalledError, ImportError)


async def test_at_timestamp_goes_out_as_epoch_seconds() -> None:
    async with EfoStandIn(initial_response=False) as server:
        server.shards["shardId-0"] = ScriptedShard()
        server.shards["shardId-0"].put(b"a")
        when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
        async with subscriber(server.url) as sub:
            position = {"Type": "AT_TIMESTAMP", "Timestamp": when}
            events = sub.subscribe(CONSUMER, "shardId-0", position)
            async with contextlib.aclosing(events):
                await take(events, 1)
    sent = json.loads(server.requests[0]["body"])["StartingPosition"]
    assert sent == {"Type": "AT_TIMESTAMP", "Timestamp": when.timestamp()}


class FakeConsumers:
    """A Kinesis client's consumer calls, answering from scripts: a losing registration race,
    then CREATING until ``active_after`` descriptions."""

    def __init__(self, active_after: int) -> None:
        self.active_after = active_after
        self.calls: list[str] = []

    async def describe_stream_consumer(self, **_: Any) -> dict[str, Any]:
        self.calls.append("describe")
        if self.calls.count("describe") == 1:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "Describe")
        status = "ACTIVE" if self.calls.count("describe") > self.active_after else "CREATING"
        return {"ConsumerDescription": {"ConsumerARN": CONSUMER, "ConsumerStatus": status}}

    async def register_stream_consumer(self, **_: Any) -> dict[str, Any]:
        self.calls.append("register")
        raise ClientError({"Error": {"Code": "ResourceInUseException"}}, "Register")


async def test_register_after_a_lost_race_waits_for_active_or_times_out() -> None:
    stats = RequestStats()
    fake = FakeConsumers(active_after=3)
    assert await register_consumer(fake, "arn:stream", "app", stats=stats) == CONSUMER
    assert fake.calls == ["describe", "register", "describe", "describe", "describe"]
    never = FakeConsumers(active_after=10**6)
    with pytest.raises(TransientAWSError, match="not ACTIVE"):
        await register_consumer(never, "arn:stream", "app", stats=stats, timeout=0.3)


class FakeDeregistration:
    """A Kinesis client's consumer calls for a deregistration: DescribeStreamConsumer answers
    ``status``, or fails with ``denied``; DeregisterStreamConsumer is recorded."""

    def __init__(self, status: str = "ACTIVE", denied: str | None = None) -> None:
        self.status, self.denied = status, denied
        self.deregistered: list[str] = []

    async def describe_stream_consumer(self, **_: Any) -> dict[str, Any]:
        if self.denied is not None:
            raise ClientError({"Error": {"Code": self.denied}}, "DescribeStreamConsumer")
        return {"ConsumerDescription": {"ConsumerARN": CONSUMER, "ConsumerStatus": self.status}}

    async def deregister_stream_consumer(self, **kwargs: Any) -> dict[str, Any]:
        self.deregistered.append(kwargs["ConsumerARN"])
        return {}


async def test_deregistering_names_the_describe_it_needs_and_skips_a_consumer_being_deleted() -> (
    None
):
    stats = RequestStats()
    active = FakeDeregistration()
    assert await deregister_consumer(active, "arn:stream", "app", stats=stats)
    assert active.deregistered == [CONSUMER]
    # Deregistered already, AWS still deleting it: nothing to do, nothing sent.
    deleting = FakeDeregistration(status="DELETING")
    assert not await deregister_consumer(deleting, "arn:stream", "app", stats=stats)
    assert deleting.deregistered == []
    # A role without DescribeStreamConsumer is told that action, not the deregistration.
    denied = FakeDeregistration(denied="AccessDeniedException")
    with pytest.raises(AccessDeniedError, match="kinesis:DescribeStreamConsumer"):
        await deregister_consumer(denied, "arn:stream", "app", stats=stats)
    assert denied.deregistered == []
