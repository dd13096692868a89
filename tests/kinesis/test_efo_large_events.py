"""SubscribeToShard events bigger than one HTTP/2 window (64 KiB): our subscriber receives
1 MB events whole on the HTTP/2 stand-in, and kinesis-local's own flow-control bug (which stalls
any event over 64 KiB for every standard client) is pinned with a raw ``h2`` client.

kinesis-local (http4s ember's HTTP/2 server) drops a connection-level WINDOW_UPDATE that arrives
right after the client's preface and SETTINGS, which is where httpcore and Go's client send
it. Its connection send window then stays at 65,535 bytes while the client, which has granted
16 MiB, sees no reason to send another: the stream stalls after 64 KiB until the read times out.
The same WINDOW_UPDATE sent after the response headers is honoured. AWS is not affected.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import boto3
import h2.config
import h2.connection
import h2.events
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from support.efo_standin import EfoStandIn, ScriptedShard
from support.standins import KinesisLocalStandIn
from support.wait import wait_until

from kinesumer import Config
from kinesumer.aws import RequestStats
from kinesumer.kinesis.efo.subscriber import ShardSubscriber

CONSUMER = "arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1"
#: 768 KiB of data is a 1 MiB JSON event once base64-encoded.
BIG_RECORD = 768 * 1024
#: 24 such events: more than httpcore's first window grant.
EVENTS = 24
#: httpcore's connection window increment (it sends it right after the preface).
HTTPCORE_INCREMENT = 2**24


async def test_one_megabyte_events_arrive_whole_on_the_http2_standin() -> None:
    shard = ScriptedShard()
    sent = [shard.put(bytes([i]) * BIG_RECORD, f"k{i}") for i in range(EVENTS)]
    async with EfoStandIn(batch_size=1) as server:
        server.shards["shardId-000000000000"] = shard
        config = Config(
            app="efo-big",
            dynamodb_table="efo-table",
            region="us-east-1",
            kinesis_endpoint=server.url,
            enhanced_fan_out=True,
        )
        sub = ShardSubscriber(config, Credentials("x", "x"), RequestStats())
        await sub.open()
        got: list[dict[str, Any]] = []
        try:
            events = sub.subscribe(CONSUMER, "shardId-000000000000", {"Type": "TRIM_HORIZON"})
            async for event in events:
                got.extend(event.records)
                if len(got) >= len(sent):
                    break
            await events.aclose()
        finally:
            await sub.close()
    assert [int(r["SequenceNumber"]) for r in got] == sent
    assert [r["Data"] for r in got] == [bytes([i]) * BIG_RECORD for i in range(EVENTS)]
    # More than httpcore's first grant (64 KiB + 16 MiB) went through a server that keeps to
    # flow control (h2 refuses to send past the window): our WINDOW_UPDATEs reached it.
    assert sum(s.sent_bytes for s in server.subscriptions) > HTTPCORE_INCREMENT + 65_535


def _subscribe_raw(url: str, consumer_arn: str, *, late_window_update: bool, enough: int) -> int:
    """SubscribeToShard with a bare ``h2`` client granting a 16 MiB connection window either
    right after the preface (as httpcore does) or after the response headers; acknowledges all
    data as it arrives. Returns the bytes received once ``enough`` arrived or after 3 s without
    any (kinesis-local sends an empty event each second once the backlog is through)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "ConsumerARN": consumer_arn,
            "ShardId": "shardId-000000000000",
            "StartingPosition": {"Type": "TRIM_HORIZON"},
        }
    ).encode()
    headers = {
        "X-Amz-Target": "Kinesis_20131202.SubscribeToShard",
        "Content-Type": "application/x-amz-json-1.1",
    }
    request = AWSRequest(method="POST", url=url + "/", data=body, headers=headers)
    SigV4Auth(Credentials("x", "x"), "kinesis", "us-east-1").add_auth(request)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    if not late_window_update:
        conn.increment_flow_control_window(HTTPCORE_INCREMENT)
    stream_id = conn.get_next_available_stream_id()
    pseudo = [(":method", "POST"), (":scheme", "http"), (":authority", f"{host}:{port}")]
    fields = [(k.lower(), str(v)) for k, v in request.headers.items()]
    conn.send_headers(stream_id, [*pseudo, (":path", "/"), *fields], end_stream=False)
    conn.send_data(stream_id, body, end_stream=True)
    received = 0
    with socket.create_connection((host, int(port)), timeout=3.0) as sock:
        sock.sendall(conn.data_to_send())
        while received < enough:
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                return received
            if not data:
                return received
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and late_window_update:
                    conn.increment_flow_control_window(HTTPCORE_INCREMENT)
                elif isinstance(event, h2.events.DataReceived):
                    received += len(event.data)
                    conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
            sock.sendall(conn.data_to_send())
    return received


@pytest.mark.timeout(40)
def test_kinesis_local_drops_a_window_update_sent_with_the_preface(
    kinesis_local: KinesisLocalStandIn, unique_name: Any
) -> None:
    """Pins kinesis-local's bug: when it is fixed, the early case gets the whole event too and
    this test fails (then drop the caveat in STANDINS.md and bench_efo.py)."""
    url = kinesis_local.url
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    stream = unique_name("big")
    client.create_stream(StreamName=stream, ShardCount=1)
    arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    records = [{"Data": b"x" * 100, "PartitionKey": str(i)} for i in range(500)]
    client.put_records(StreamName=stream, Records=records)
    wanted: dict[str, str] = {}
    for name in ("early", "late"):
        consumer = client.register_stream_consumer(StreamARN=arn, ConsumerName=name)
        wanted[name] = consumer["Consumer"]["ConsumerARN"]

    def active(consumer_arn: str) -> bool:
        described = client.describe_stream_consumer(ConsumerARN=consumer_arn)
        return bool(described["ConsumerDescription"]["ConsumerStatus"] == "ACTIVE")

    for consumer_arn in wanted.values():
        wait_until(lambda a=consumer_arn: active(a), 10, "consumer ACTIVE")  # type: ignore[misc]
    started = time.monotonic()
    # 500 records of 100 B make one event of about 158 KB.
    early = _subscribe_raw(url, wanted["early"], late_window_update=False, enough=150_000)
    late = _subscribe_raw(url, wanted["late"], late_window_update=True, enough=150_000)
    assert late >= 150_000, f"late WINDOW_UPDATE: {late} bytes"
    assert early == 65_535, f"early WINDOW_UPDATE: {early} bytes after {time.monotonic() - started}"


@pytest.mark.timeout(90)
async def test_our_subscriber_gets_events_over_64_kib_from_kinesis_local(
    kinesis_local: KinesisLocalStandIn, unique_name: Any
) -> None:
    """The fix for the bug pinned above: our transport grants the connection window after the
    response headers, so kinesis-local's events of any size arrive (before: the first event
    over 64 KiB stalled until the read timed out). 4 records of 768 KiB: one 4 MiB event."""
    url = kinesis_local.url
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    stream = unique_name("big")
    client.create_stream(StreamName=stream, ShardCount=1)
    wait_until(
        lambda: (
            client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
                "StreamStatus"
            ]
            == "ACTIVE"
        ),
        10,
        "stream ACTIVE",
    )
    arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    sent = [bytes([i]) * BIG_RECORD for i in range(4)]
    for i, data in enumerate(sent):
        client.put_record(StreamName=stream, Data=data, PartitionKey=str(i))
    consumer_arn = client.register_stream_consumer(StreamARN=arn, ConsumerName="big")["Consumer"][
        "ConsumerARN"
    ]
    wait_until(
        lambda: (
            client.describe_stream_consumer(ConsumerARN=consumer_arn)["ConsumerDescription"][
                "ConsumerStatus"
            ]
            == "ACTIVE"
        ),
        10,
        "consumer ACTIVE",
    )
    config = Config(
        app="efo-big",
        dynamodb_table="efo-table",
        region="us-east-1",
        kinesis_endpoint=url,
        enhanced_fan_out=True,
    )
    sub = ShardSubscriber(config, Credentials("x", "x"), RequestStats())
    await sub.open()
    got: list[dict[str, Any]] = []
    try:
        events = sub.subscribe(consumer_arn, "shardId-000000000000", {"Type": "TRIM_HORIZON"})
        async for event in events:
            got.extend(event.records)
            if len(got) >= len(sent):
                break
        await events.aclose()
    finally:
        await sub.close()
    assert [r["Data"] for r in got] == sent
