"""Tests of the stand-in launchers (``support/standins.py``) and of the stand-in facts the library
uses.

Why: every other test trusts these servers to be local-only, to answer boto3 like AWS for the
calls the library makes, and to go away when stopped. Some behaviour is pinned here because the
library depends on it and a kinesalite upgrade could change it (SHARD_END after a split).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from support.standins import (
    LOOPBACK,
    MotoStandIn,
    NodeStandIn,
    StandInError,
    find_free_port,
    start_dynalite,
    start_kinesalite,
    start_moto,
)

ONE_ATTEMPT = botocore.config.Config(
    retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=10
)


def client(service: str, url: str, **kwargs: Any) -> Any:
    """A boto3 client for ``service`` at ``url`` that never retries (so failures show at once)."""
    return boto3.client(service, endpoint_url=url, config=ONE_ATTEMPT, **kwargs)


def poll_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Bounded polling: wait for ``condition`` or fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.01)


def wait_stream_active(kinesis: Any, name: str) -> None:
    def active() -> bool:
        summary = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        return bool(summary["StreamStatus"] == "ACTIVE")

    poll_until(active, what=f"stream {name} to become ACTIVE")


# --- which addresses a process listens on ---------------------------------------------------


def _decode_proc_address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state owned by ``pid`` (same as ss -ltnp)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux /proc to inspect listening sockets")
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:
            continue
        if match:
            inodes.add(match.group(1))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = TCP_LISTEN
                address, port = local.split(":")
                found.add((_decode_proc_address(address), int(port, 16)))
    return found


def port_refuses(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1):
            return False
    except OSError:
        return True


# --- isolation --------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["kinesalite", "dynalite"])
def test_node_server_listens_on_loopback_only(fixture: str, request: pytest.FixtureRequest) -> None:
    server: NodeStandIn = request.getfixturevalue(fixture)
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert listening_addresses(server.pid) == {(LOOPBACK, server.port)}


def test_moto_listens_on_loopback_only(moto_server: MotoStandIn) -> None:
    on_port = {addr for addr in listening_addresses(os.getpid()) if addr[1] == moto_server.port}
    assert on_port == {(LOOPBACK, moto_server.port)}
    assert moto_server.pid == os.getpid()


def test_environment_has_only_fake_credentials() -> None:
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "testing"
    assert os.environ["AWS_SESSION_TOKEN"] == "testing"
    assert os.environ["AWS_DEFAULT_REGION"] == "us-east-1"
    assert "AWS_PROFILE" not in os.environ
    assert not [name for name in os.environ if name.startswith("AWS_ENDPOINT_URL")]
    credentials = boto3.Session().get_credentials()
    assert credentials is not None
    assert credentials.access_key == "testing"
    assert boto3.Session().region_name == "us-east-1"


def test_unique_name_gives_distinct_valid_names(unique_name: Callable[[str], str]) -> None:
    names = {unique_name("kinesumer-test") for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert re.fullmatch(r"kinesumer-test-[0-9a-f]{8}", name)
    with pytest.raises(ValueError, match="prefix"):
        unique_name("bad prefix!")


# --- the servers answer boto3 ---------------------------------------------------------------


def test_kinesalite_create_put_get(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    kinesis = client("kinesis", kinesalite.url)
    stream = unique_name("standin")
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis, stream)

    put = kinesis.put_record(StreamName=stream, Data=b"hello", PartitionKey="pk")
    # Realistic sequence numbers (56 digits) are one reason to test on kinesalite, not moto.
    assert re.fullmatch(r"\d{56}", put["SequenceNumber"])

    iterator = kinesis.get_shard_iterator(
        StreamName=stream, ShardId=put["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = kinesis.get_records(ShardIterator=iterator)["Records"]
    assert [(r["Data"], r["PartitionKey"]) for r in records] == [(b"hello", "pk")]
    assert records[0]["SequenceNumber"] == put["SequenceNumber"]


def test_kinesalite_drained_closed_shard_has_no_next_iterator(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """After a split, reading the parent to its end yields no NextShardIterator (SHARD_END).

    The library relies on this to finish a parent shard and move on to its children; moto never
    does it (STANDINS.md), so this fact is pinned on kinesalite.
    """
    kinesis = client("kinesis", kinesalite.url)
    stream = unique_name("split")
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis, stream)
    parent = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    sent = [f"before-split-{i}".encode() for i in range(5)]
    for data in sent:
        kinesis.put_record(StreamName=stream, Data=data, PartitionKey=data.decode())

    kinesis.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(2**127))
    wait_stream_active(kinesis, stream)

    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    children = [s for s in shards if s.get("ParentShardId") == parent]
    assert len(children) == 2
    closed = next(s for s in shards if s["ShardId"] == parent)
    assert "EndingSequenceNumber" in closed["SequenceNumberRange"]

    iterator: str | None = kinesis.get_shard_iterator(
        StreamName=stream, ShardId=parent, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    received: list[bytes] = []
    for _ in range(10):
        assert iterator is not None
        response = kinesis.get_records(ShardIterator=iterator)
        received.extend(r["Data"] for r in response["Records"])
        iterator = response.get("NextShardIterator")
        if iterator is None:
            break
    assert iterator is None, "a drained closed shard must not return a NextShardIterator"
    assert received == sent


def test_dynalite_create_table_and_conditional_put(
    dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    dynamodb = client("dynamodb", dynalite.url)
    table = unique_name("standin")
    dynamodb.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    poll_until(
        lambda: dynamodb.describe_table(TableName=table)["Table"]["TableStatus"] == "ACTIVE",
        what="table ACTIVE",
    )
    item = {"pk": {"S": "shard-0"}, "owner": {"S": "worker-a"}}
    dynamodb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")
    with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
        dynamodb.put_item(
            TableName=table,
            Item={**item, "owner": {"S": "worker-b"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    stored = dynamodb.get_item(TableName=table, Key={"pk": {"S": "shard-0"}}, ConsistentRead=True)
    assert stored["Item"]["owner"] == {"S": "worker-a"}


def test_moto_reset_empties_state(moto_server: MotoStandIn) -> None:
    moto_server.reset()  # the session's server holds whatever earlier tests left behind
    kinesis = client("kinesis", moto_server.url)
    dynamodb = client("dynamodb", moto_server.url)
    kinesis.create_stream(StreamName="before-reset", ShardCount=1)
    dynamodb.create_table(
        TableName="before-reset",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    assert kinesis.list_streams()["StreamNames"] == ["before-reset"]

    moto_server.reset()

    assert kinesis.list_streams()["StreamNames"] == []
    assert dynamodb.list_tables()["TableNames"] == []


def test_moto_url_fixture_starts_from_empty_state(moto_url: str) -> None:
    kinesis = client("kinesis", moto_url)
    # test_moto_reset_empties_state may have left streams behind; moto_url must have reset them.
    assert kinesis.list_streams()["StreamNames"] == []
    kinesis.create_stream(StreamName="left-behind", ShardCount=1)
    sts = client("sts", moto_url)
    assert sts.get_caller_identity()["Account"] == "123456789012"


@pytest.mark.parametrize(
    ("fixture", "service"),
    [
        ("kinesalite", "kinesis"),
        ("dynalite", "dynamodb"),
        ("moto_server", "kinesis"),
        ("moto_server", "dynamodb"),
        ("moto_server", "sts"),
    ],
)
def test_standins_do_not_verify_signatures(
    fixture: str, service: str, request: pytest.FixtureRequest
) -> None:
    """None of the stand-ins checks SigV4 signatures: a wrong secret key is accepted.

    So a test can never prove a signing problem against them; the fault proxy's own test checks
    that signatures still validate after proxying.
    """
    server = request.getfixturevalue(fixture)
    wrong = client(
        service,
        server.url,
        aws_access_key_id="testing",
        aws_secret_access_key="not-the-secret",
    )
    if service == "kinesis":
        wrong.list_streams()
    elif service == "dynamodb":
        wrong.list_tables()
    else:
        wrong.get_caller_identity()


# --- lifecycle ---------------------------------------------------------------------------------


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def own_servers() -> Iterator[list[NodeStandIn]]:
    """Servers a test starts itself; stopped even if the test fails before it stops them."""
    servers: list[NodeStandIn] = []
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize(
    "start", [start_kinesalite, start_dynalite], ids=["kinesalite", "dynalite"]
)
def test_stop_ends_the_process(
    start: Callable[[], NodeStandIn], own_servers: list[NodeStandIn]
) -> None:
    server = start()
    own_servers.append(server)
    assert server.running and pid_exists(server.pid)

    server.stop()

    assert not server.running
    assert server.process.returncode is not None  # reaped: no zombie left behind
    assert not pid_exists(server.pid)
    assert port_refuses(server.port)
    server.stop()  # idempotent


def test_moto_stop_releases_the_port() -> None:
    server = start_moto()
    try:
        assert client("sts", server.url).get_caller_identity()["Account"]
    finally:
        server.stop()
    assert not server.running
    assert port_refuses(server.port)


def test_missing_node_modules_tells_to_run_npm_ci(tmp_path: Path) -> None:
    with pytest.raises(StandInError, match="npm ci"):
        start_kinesalite(root=tmp_path)
    with pytest.raises(StandInError, match="npm ci"):
        start_dynalite(root=tmp_path)


def test_startup_failure_reports_the_servers_stderr(own_servers: list[NodeStandIn]) -> None:
    with socket.socket() as squatter:
        squatter.bind((LOOPBACK, find_free_port()))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(StandInError, match="EADDRINUSE") as excinfo:
            own_servers.append(start_kinesalite(port=port))
    assert "stderr" in str(excinfo.value)
