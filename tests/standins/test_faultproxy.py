"""Tests of the fault-injecting proxy (``support/faultproxy.py``).

Why: tests of the library's retry and failover paths are only as good as the faults they inject.
Each fault must reach a plain boto3 client as the exception AWS would cause, rules must fire
exactly as configured (rate, count, filters, seeded), and the proxy must be invisible otherwise:
requests forwarded faithfully, signatures still valid, connections kept alive.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, urlsplit

import aioboto3
import boto3
import botocore.config
import botocore.exceptions
import pytest
from support.faultproxy import (
    Fault,
    FaultKind,
    FaultProxy,
    OpKey,
    identify_operation,
)
from support.standins import LOOPBACK, NodeStandIn, find_free_port
from support.wait import wait_until

ProxyFactory = Callable[[str], FaultProxy]


def config(read_timeout: float = 10.0) -> botocore.config.Config:
    """One attempt only, so each injected fault surfaces as the client's exception."""
    return botocore.config.Config(
        retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=read_timeout
    )


def client(service: str, url: str, read_timeout: float = 10.0) -> Any:
    return boto3.client(service, endpoint_url=url, config=config(read_timeout))


def error_code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response["Error"]["Code"])


def status_code(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


@pytest.fixture
def kinesis_proxy(kinesalite: NodeStandIn, fault_proxy: ProxyFactory) -> FaultProxy:
    return fault_proxy(kinesalite.url)


@pytest.fixture
def kinesis(kinesis_proxy: FaultProxy) -> Any:
    """A boto3 Kinesis client that talks to kinesalite through the proxy."""
    return client("kinesis", kinesis_proxy.url)


@pytest.fixture
def dynamodb_proxy(dynalite: NodeStandIn, fault_proxy: ProxyFactory) -> FaultProxy:
    return fault_proxy(dynalite.url)


@pytest.fixture
def dynamodb(dynamodb_proxy: FaultProxy) -> Any:
    """A boto3 DynamoDB client that talks to dynalite through the proxy."""
    return client("dynamodb", dynamodb_proxy.url)


@pytest.fixture
def stream(kinesalite: NodeStandIn, unique_name: Callable[[str], str]) -> str:
    """A fresh one-shard ACTIVE stream on kinesalite, with one record in it."""
    direct = client("kinesis", kinesalite.url)
    name = unique_name("proxy")
    direct.create_stream(StreamName=name, ShardCount=1)
    wait_until(
        lambda: (
            direct.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"][
                "StreamStatus"
            ]
            == "ACTIVE"
        ),
        timeout=5,
        what="stream ACTIVE",
    )
    direct.put_record(StreamName=name, Data=b"record-0", PartitionKey="pk")
    return name


def trim_horizon(kinesis: Any, stream: str) -> str:
    iterator: str = kinesis.get_shard_iterator(
        StreamName=stream, ShardId="shardId-000000000000", ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    return iterator


# --- pass-through ------------------------------------------------------------------------------


def test_forwards_kinesis_calls_over_one_keepalive_connection(
    kinesis: Any, kinesis_proxy: FaultProxy, stream: str
) -> None:
    kinesis.put_record(StreamName=stream, Data=b"record-1", PartitionKey="pk")
    records = kinesis.get_records(ShardIterator=trim_horizon(kinesis, stream))["Records"]
    assert [r["Data"] for r in records] == [b"record-0", b"record-1"]

    stats = kinesis_proxy.stats()
    for operation in ("PutRecord", "GetShardIterator", "GetRecords"):
        assert stats[OpKey("kinesis", operation)].requests == 1
        assert stats[OpKey("kinesis", operation)].forwarded == 1
        assert not stats[OpKey("kinesis", operation)].faults
    assert kinesis_proxy.connections_accepted == 1


def test_forwards_dynamodb_calls_and_relays_upstream_errors(
    dynamodb: Any, dynamodb_proxy: FaultProxy, unique_name: Callable[[str], str]
) -> None:
    table = unique_name("proxy")
    dynamodb.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    # dynalite makes a table ACTIVE a moment after CreateTable answers (longer on a busy
    # machine), as DynamoDB does: writes before that are ResourceNotFoundException.
    dynamodb.get_waiter("table_exists").wait(
        TableName=table, WaiterConfig={"Delay": 0.1, "MaxAttempts": 600}
    )
    item = {"pk": {"S": "lease"}}
    dynamodb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")
    # dynalite's own error (and its x-amz-crc32 header) must come through untouched.
    with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
        dynamodb.put_item(
            TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)"
        )
    stats = dynamodb_proxy.stats()[OpKey("dynamodb", "PutItem")]
    assert (stats.requests, stats.forwarded) == (2, 2)


def test_forwards_query_protocol_calls_to_moto(moto_url: str, fault_proxy: ProxyFactory) -> None:
    proxy = fault_proxy(moto_url)
    sts = client("sts", proxy.url)
    assert sts.get_caller_identity()["Account"] == "123456789012"
    client("kinesis", proxy.url).create_stream(StreamName="via-proxy", ShardCount=1)
    assert client("kinesis", moto_url).list_streams()["StreamNames"] == ["via-proxy"]

    stats = proxy.stats()
    assert stats[OpKey("sts", "GetCallerIdentity")].forwarded == 1
    assert stats[OpKey("kinesis", "CreateStream")].forwarded == 1


# --- faithful forwarding and SigV4 ------------------------------------------------------------


@dataclass
class Received:
    method: str
    path: str
    headers: Message
    body: bytes


class _RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    received: list[Received]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append(Received(self.command, self.path, self.headers, body))
        payload = b'{"ShardId": "shardId-000000000000", "SequenceNumber": "1"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def recording_upstream() -> Iterator[tuple[str, list[Received]]]:
    """A loopback HTTP server that records every request it gets and answers 200."""
    received: list[Received] = []
    handler = type("Handler", (_RecordingHandler,), {"received": received})
    server = ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def sigv4_signature(received: Received, secret_key: str, host: str | None = None) -> str:
    """Recompute the request's SigV4 signature from what arrived, as AWS would verify it."""
    authorization = received.headers["Authorization"]
    credential = authorization.split("Credential=")[1].split(",")[0]
    signed_headers = authorization.split("SignedHeaders=")[1].split(",")[0]
    _, date, region, service, terminator = credential.split("/")

    def header(name: str) -> str:
        if name == "host" and host is not None:
            return host
        return " ".join(",".join(received.headers.get_all(name) or []).split())

    split = urlsplit(received.path)
    canonical_request = "\n".join(
        [
            received.method,
            quote(split.path or "/", safe="/~"),
            "&".join(sorted(split.query.split("&"))) if split.query else "",
            "".join(f"{name}:{header(name)}\n" for name in signed_headers.split(";")),
            signed_headers,
            hashlib.sha256(received.body).hexdigest(),
        ]
    )
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            received.headers["X-Amz-Date"],
            f"{date}/{region}/{service}/{terminator}",
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (date, region, service, terminator):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def test_forwarding_is_faithful_and_signatures_still_validate(
    recording_upstream: tuple[str, list[Received]], fault_proxy: ProxyFactory
) -> None:
    upstream_url, received = recording_upstream
    proxy = fault_proxy(upstream_url)
    kinesis = client("kinesis", proxy.url)
    kinesis.put_record(StreamName="s", Data=b"\x00\xffbinary", PartitionKey="pk")

    (request,) = received
    assert request.method == "POST"
    assert request.path == "/"
    assert request.headers["Host"] == f"{LOOPBACK}:{proxy.port}"  # what the client signed
    assert request.headers["X-Amz-Target"] == "Kinesis_20131202.PutRecord"
    assert json.loads(request.body)["PartitionKey"] == "pk"
    signature = request.headers["Authorization"].split("Signature=")[1]
    assert sigv4_signature(request, "testing") == signature
    # The check has teeth: a rewritten Host header would break the signature.
    upstream_host = urlsplit(upstream_url).netloc
    assert sigv4_signature(request, "testing", host=upstream_host) != signature


def test_unreachable_upstream_answers_502(fault_proxy: ProxyFactory) -> None:
    proxy = fault_proxy(f"http://{LOOPBACK}:{find_free_port()}")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        client("kinesis", proxy.url).list_streams()
    assert status_code(excinfo.value) == 502
    assert proxy.stats()[OpKey("kinesis", "ListStreams")].upstream_errors == 1


# --- each fault reaches the client as AWS's would ----------------------------------------------


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        (Fault.throttle(), "ProvisionedThroughputExceededException", 400),
        (Fault.expired_iterator(), "ExpiredIteratorException", 400),
        (Fault.http_500(), "InternalFailure", 500),
        (Fault.http_503(), "ServiceUnavailable", 503),
    ],
    ids=lambda value: value.kind.value if isinstance(value, Fault) else None,
)
def test_kinesis_error_faults(
    fault: Fault,
    code: str,
    status: int,
    kinesis: Any,
    kinesis_proxy: FaultProxy,
    stream: str,
) -> None:
    iterator = trim_horizon(kinesis, stream)
    rule = kinesis_proxy.add_rule(fault, service="kinesis", operation="GetRecords", count=1)
    with pytest.raises(kinesis.exceptions.from_code(code)) as excinfo:
        kinesis.get_records(ShardIterator=iterator)
    assert error_code(excinfo.value) == code
    assert status_code(excinfo.value) == status
    assert rule.fired == 1
    # The fault never reached kinesalite: the same iterator still reads the record.
    assert kinesis.get_records(ShardIterator=iterator)["Records"][0]["Data"] == b"record-0"
    stats = kinesis_proxy.stats()[OpKey("kinesis", "GetRecords")]
    assert (stats.requests, stats.forwarded, dict(stats.faults)) == (2, 1, {fault.kind: 1})


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        (Fault.throttle(), "ProvisionedThroughputExceededException", 400),
        (Fault.dynamodb_throttling(), "ThrottlingException", 400),
        (Fault.http_500(), "InternalServerError", 500),
        (Fault.http_503(), "ServiceUnavailable", 503),
    ],
    ids=lambda value: value.kind.value if isinstance(value, Fault) else None,
)
def test_dynamodb_error_faults(
    fault: Fault, code: str, status: int, dynamodb: Any, dynamodb_proxy: FaultProxy
) -> None:
    dynamodb_proxy.add_rule(fault, service="dynamodb", operation="UpdateItem")
    with pytest.raises(dynamodb.exceptions.from_code(code)) as excinfo:
        dynamodb.update_item(
            TableName="not-reached",
            Key={"pk": {"S": "k"}},
            UpdateExpression="SET v = :v",
            ExpressionAttributeValues={":v": {"N": "1"}},
        )
    assert error_code(excinfo.value) == code
    assert status_code(excinfo.value) == status
    # Other operations are not affected by an UpdateItem rule.
    dynamodb.list_tables()


def test_query_protocol_error_fault(moto_url: str, fault_proxy: ProxyFactory) -> None:
    proxy = fault_proxy(moto_url)
    proxy.add_rule(Fault.throttle(), service="sts")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        client("sts", proxy.url).get_caller_identity()
    assert (error_code(excinfo.value), status_code(excinfo.value)) == ("Throttling", 400)


def test_reset_arrives_as_connection_closed(kinesis: Any, kinesis_proxy: FaultProxy) -> None:
    kinesis_proxy.add_rule(Fault.reset(), operation="ListStreams", count=1)
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        kinesis.list_streams()
    kinesis.list_streams()  # the client reconnects; the rule is used up
    stats = kinesis_proxy.stats()[OpKey("kinesis", "ListStreams")]
    assert (stats.forwarded, stats.faults[FaultKind.RESET]) == (1, 1)
    assert kinesis_proxy.connections_accepted == 2


def test_reset_is_a_tcp_rst(kinesis_proxy: FaultProxy) -> None:
    kinesis_proxy.add_rule(Fault.reset())
    request = (
        b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: Kinesis_20131202.ListStreams\r\n"
        b"Content-Type: application/x-amz-json-1.1\r\nContent-Length: 2\r\n\r\n{}"
    )
    with socket.create_connection((LOOPBACK, kinesis_proxy.port), timeout=5) as sock:
        sock.sendall(request)
        # A FIN would read as b""; an RST raises.
        with pytest.raises(ConnectionResetError):
            sock.recv(1024)


def test_delay_forwards_after_the_pause(kinesis: Any, kinesis_proxy: FaultProxy) -> None:
    kinesis_proxy.add_rule(Fault.delay(0.3), operation="ListStreams")
    started = time.monotonic()
    kinesis.list_streams()
    assert time.monotonic() - started >= 0.3
    stats = kinesis_proxy.stats()[OpKey("kinesis", "ListStreams")]
    assert (stats.forwarded, stats.faults[FaultKind.DELAY]) == (1, 1)


def test_delay_beyond_read_timeout_times_out(kinesis_proxy: FaultProxy) -> None:
    kinesis_proxy.add_rule(Fault.delay(1.0))
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        client("kinesis", kinesis_proxy.url, read_timeout=0.3).list_streams()


def test_blackhole_causes_a_read_timeout(kinesis_proxy: FaultProxy) -> None:
    rule = kinesis_proxy.add_rule(Fault.blackhole(), operation="ListStreams")
    kinesis = client("kinesis", kinesis_proxy.url, read_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        kinesis.list_streams()
    assert time.monotonic() - started >= 0.5
    rule.remove()
    kinesis.list_streams()
    stats = kinesis_proxy.stats()[OpKey("kinesis", "ListStreams")]
    assert (stats.forwarded, stats.faults[FaultKind.BLACKHOLE]) == (1, 1)


def test_blackhole_is_released_when_the_rule_is_removed(kinesis_proxy: FaultProxy) -> None:
    rule = kinesis_proxy.add_rule(Fault.blackhole())
    kinesis = client("kinesis", kinesis_proxy.url, read_timeout=30)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            kinesis.list_streams()
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: rule.fired == 1, timeout=5, what="the request to be held")
    started = time.monotonic()
    rule.remove()
    caller.join(5)
    assert not caller.is_alive()
    assert time.monotonic() - started < 2
    assert len(outcome) == 1
    assert isinstance(outcome[0], botocore.exceptions.ConnectionClosedError)


# --- rule semantics ----------------------------------------------------------------------------


def outcomes(kinesis: Any, n: int) -> list[bool]:
    """Call ListStreams ``n`` times; True where the call was throttled."""
    throttled = []
    for _ in range(n):
        try:
            kinesis.list_streams()
            throttled.append(False)
        except kinesis.exceptions.ProvisionedThroughputExceededException:
            throttled.append(True)
    return throttled


def test_count_is_honoured(kinesis: Any, kinesis_proxy: FaultProxy) -> None:
    rule = kinesis_proxy.add_rule(Fault.throttle(), count=3)
    assert outcomes(kinesis, 6) == [True, True, True, False, False, False]
    assert rule.fired == 3
    assert rule.exhausted
    stats = kinesis_proxy.stats()[OpKey("kinesis", "ListStreams")]
    assert (stats.requests, stats.forwarded, stats.faults[FaultKind.THROTTLE]) == (6, 3, 3)


def test_rate_is_honoured_and_seeded(kinesis: Any, kinesis_proxy: FaultProxy) -> None:
    rule = kinesis_proxy.add_rule(Fault.throttle(), rate=0.3, seed=7)
    seen = outcomes(kinesis, 60)
    rng = random.Random(7)
    assert seen == [rng.random() < 0.3 for _ in range(60)]  # same sequence on every run
    assert 8 <= sum(seen) <= 30
    assert rule.fired == sum(seen)
    rule.remove()
    kinesis_proxy.add_rule(Fault.throttle(), rate=0.0)
    assert not any(outcomes(kinesis, 10))


def test_rate_and_count_together(kinesis: Any, kinesis_proxy: FaultProxy) -> None:
    kinesis_proxy.add_rule(Fault.throttle(), rate=0.5, count=4, seed=1)
    seen = outcomes(kinesis, 40)
    assert sum(seen) == 4
    rng = random.Random(1)
    expected, fired = [], 0
    for _ in range(40):
        hit = fired < 4 and rng.random() < 0.5
        fired += hit
        expected.append(hit)
    assert seen == expected


def test_rules_filter_by_service_and_operation(
    kinesis: Any, kinesis_proxy: FaultProxy, stream: str
) -> None:
    kinesis_proxy.add_rule(Fault.throttle(), service="dynamodb")
    kinesis_proxy.add_rule(Fault.throttle(), service="kinesis", operation="GetRecords")
    kinesis.list_streams()
    iterator = trim_horizon(kinesis, stream)
    with pytest.raises(kinesis.exceptions.ProvisionedThroughputExceededException):
        kinesis.get_records(ShardIterator=iterator)


def test_first_firing_rule_wins_and_clear_removes_all(
    kinesis: Any, kinesis_proxy: FaultProxy
) -> None:
    first = kinesis_proxy.add_rule(Fault.http_503(), count=1)
    second = kinesis_proxy.add_rule(Fault.http_500())
    for expected in ("ServiceUnavailable", "InternalFailure"):
        with pytest.raises(botocore.exceptions.ClientError) as excinfo:
            kinesis.list_streams()
        assert error_code(excinfo.value) == expected
    assert (first.fired, second.fired) == (1, 1)
    kinesis_proxy.clear()
    assert kinesis_proxy.rules() == []
    assert first.removed and second.removed
    kinesis.list_streams()


def test_rules_are_thread_safe(kinesis_proxy: FaultProxy) -> None:
    rule = kinesis_proxy.add_rule(Fault.throttle(), count=5)
    throttled: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        count = sum(outcomes(client("kinesis", kinesis_proxy.url), 10))
        with lock:
            throttled.append(count)

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(30)
    assert sum(throttled) == 5 == rule.fired
    stats = kinesis_proxy.stats()[OpKey("kinesis", "ListStreams")]
    assert (stats.requests, stats.forwarded, stats.faults[FaultKind.THROTTLE]) == (40, 35, 5)


def test_fault_parameters_are_validated(kinesis_proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="delay"):
        Fault.delay(-1)
    with pytest.raises(ValueError, match="seconds"):
        Fault(FaultKind.THROTTLE, 2.0)
    with pytest.raises(ValueError, match="rate"):
        kinesis_proxy.add_rule(Fault.throttle(), rate=1.5)
    with pytest.raises(ValueError, match="count"):
        kinesis_proxy.add_rule(Fault.throttle(), count=-1)
    # A parameterless kind may be given directly.
    assert kinesis_proxy.add_rule(FaultKind.RESET).fault == Fault.reset()


def _headers(**values: str) -> Message:
    message = Message()
    for name, value in values.items():
        message[name.replace("_", "-")] = value
    return message


def test_identify_operation() -> None:
    auth = (
        "AWS4-HMAC-SHA256 Credential=testing/20240101/us-east-1/{}/aws4_request, "
        "SignedHeaders=host, Signature=00"
    )
    assert identify_operation(
        "POST", "/", _headers(X_Amz_Target="Kinesis_20131202.GetRecords"), b"{}"
    ) == OpKey("kinesis", "GetRecords")
    assert identify_operation(
        "POST", "/", _headers(X_Amz_Target="DynamoDB_20120810.UpdateItem"), b"{}"
    ) == OpKey("dynamodb", "UpdateItem")
    query = _headers(
        Content_Type="application/x-www-form-urlencoded; charset=utf-8",
        Authorization=auth.format("sts"),
    )
    assert identify_operation("POST", "/", query, b"Action=AssumeRole&Version=2011-06-15") == OpKey(
        "sts", "AssumeRole"
    )
    assert identify_operation("POST", "/moto-api/reset", _headers(), b"") == OpKey(
        "unknown", "POST /moto-api/reset"
    )


# --- lifecycle ---------------------------------------------------------------------------------


def test_stop_closes_sockets_and_joins_threads(kinesalite: NodeStandIn) -> None:
    proxy = FaultProxy(kinesalite.url)
    try:
        idle = client("kinesis", proxy.url)
        idle.list_streams()  # leaves an idle keep-alive connection open
        rule = proxy.add_rule(Fault.blackhole())
        held: list[BaseException] = []

        def call() -> None:
            try:
                client("kinesis", proxy.url, read_timeout=30).list_streams()
            except BaseException as exc:
                held.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        wait_until(lambda: rule.fired == 1, timeout=5, what="the request to be held")
    finally:
        started = time.monotonic()
        proxy.stop()
    assert time.monotonic() - started < 2
    caller.join(5)
    assert held and isinstance(held[0], botocore.exceptions.ConnectionClosedError)
    alive = [t.name for t in threading.enumerate() if t.name.startswith(f"faultproxy-{proxy.port}")]
    assert alive == []
    with pytest.raises(OSError):
        socket.create_connection((LOOPBACK, proxy.port), timeout=1).close()
    proxy.stop()  # idempotent


# --- aioboto3 ----------------------------------------------------------------------------------


async def test_aioboto3_client_through_the_proxy(kinesis_proxy: FaultProxy) -> None:
    from aiobotocore.config import AioConfig

    session = aioboto3.Session()
    aio_config = AioConfig(retries={"total_max_attempts": 1}, read_timeout=0.5)
    async with session.client("kinesis", endpoint_url=kinesis_proxy.url, config=aio_config) as kc:
        await kc.list_streams()
        kinesis_proxy.add_rule(Fault.throttle(), count=1)
        with pytest.raises(kc.exceptions.ProvisionedThroughputExceededException):
            await kc.list_streams()
        kinesis_proxy.add_rule(Fault.blackhole(), count=1)
        with pytest.raises(botocore.exceptions.ReadTimeoutError):
            await kc.list_streams()
        await kc.list_streams()
    stats = kinesis_proxy.stats()[OpKey("kinesis", "ListStreams")]
    assert (stats.requests, stats.forwarded) == (4, 2)
