"""Enhanced fan-out on a stream given by ARN in another region, end to end: the real subscriber
(HTTP/2 SubscribeToShard, botocore's signer) on kinesis-local, which keeps streams and their
consumers per region, the region taken from each request's signature (its account is always
000000000000). A member whose home is us-east-1 reads its home stream by name and a stream of
eu-west-1 by ARN, eu-west-1 served by a kinesis-local of its own (``kinesis_endpoints``): the
consumer must be registered there, in eu-west-1, and the subscriptions to it sent there, or no
server has that consumer. (kinesis-local finds a consumer by its ARN whatever region a
subscription is signed for: the signing region is not pinned here.)

The home account is a role's (``role_arn`` of account 000000000000, assumed through moto's
STS; kinesis-local takes any credentials), so the ARN's account is the config's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from support.group import Member, create_stream, make_config, setup_table
from support.standins import start_kinesis_local
from support.wait import eventually

from kinesumer import AccountAccess, Record

Names = Callable[[str], str]

ACCOUNT = "000000000000"  # kinesis-local's


def client(url: str, region: str) -> Any:
    return boto3.client("kinesis", endpoint_url=url, region_name=region)


def consumers(url: str, region: str, stream: str) -> list[str]:
    arn = f"arn:aws:kinesis:{region}:{ACCOUNT}:stream/{stream}"
    listed = client(url, region).list_stream_consumers(StreamARN=arn)["Consumers"]
    return [c["ConsumerName"] for c in listed if c["ConsumerStatus"] != "DELETING"]


def put(url: str, region: str, stream: str, tag: str, count: int) -> set[bytes]:
    kinesis = client(url, region)
    datas = [f"{tag}:k{n % 4}:{n}".encode() for n in range(count)]
    for data in datas:
        kinesis.put_record(StreamName=stream, Data=data, PartitionKey=data.decode().split(":")[1])
    return set(datas)


@pytest.fixture(scope="module")
def eu_server() -> Iterator[Any]:
    """eu-west-1's own kinesis-local."""
    server = start_kinesis_local()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def env(
    kinesis_local: Any, eu_server: Any, dynalite: Any, moto_url: str, unique_name: Names
) -> dict[str, Any]:
    url, eu_url = kinesis_local.url, eu_server.url
    config = make_config(
        url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        kinesis_endpoints={"eu-west-1": eu_url},
        enhanced_fan_out=True,
        consumer_name=unique_name("efo"),
        role_arn=f"arn:aws:iam::{ACCOUNT}:role/reader",
        sts_endpoint=moto_url,
    )
    setup_table(config)
    home, far = unique_name("home"), unique_name("far")
    create_stream(url, home, 1)  # us-east-1
    eu = client(eu_url, "eu-west-1")
    eu.create_stream(StreamName=far, ShardCount=1)
    eu.get_waiter("stream_exists").wait(StreamName=far, WaiterConfig={"Delay": 0.1})
    return {"url": url, "eu_url": eu_url, "config": config, "home": home, "far": far}


async def test_a_stream_of_another_region_is_read_through_a_subscription_signed_for_it(
    env: dict[str, Any],
) -> None:
    url, eu_url, config = env["url"], env["eu_url"], env["config"]
    home, far = env["home"], env["far"]
    far_arn = f"arn:aws:kinesis:eu-west-1:{ACCOUNT}:stream/{far}"
    expected = put(url, "us-east-1", home, "home", 20) | put(eu_url, "eu-west-1", far, "far", 20)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="m1"), [home, far_arn], sink).start()
    try:
        await eventually(
            lambda: {r.data for _, r in sink} >= expected,
            120,
            "every record of both regions",
            lambda: f"{len(sink)} of {len(expected)}; error: {member.error!r}",
        )
        assert not any(s.efo_polling for s in member.consumer.stats().shards)
    finally:
        await member.close()
    assert member.error is None
    assert {r.stream for _, r in sink} == {home, far_arn}
    assert all(r.data.startswith(b"far:") for _, r in sink if r.stream == far_arn)
    # The consumer lives on each stream in its own region.
    assert consumers(url, "us-east-1", home) == [config.consumer_name]
    assert consumers(eu_url, "eu-west-1", far) == [config.consumer_name]


async def test_a_group_reading_names_only_never_asks_sts(
    kinesis_local: Any, dynalite: Any, unique_name: Names
) -> None:
    """Consumers registered and subscribed to through the routing transport and the subscriber
    of every place, yet a group given names only (no role_arn, other accounts configured)
    never needs its account: its STS endpoint answers nothing, and reading goes on."""
    url = kinesis_local.url
    config = make_config(
        url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        enhanced_fan_out=True,
        consumer_name=unique_name("efo"),
        sts_endpoint="http://127.0.0.1:9",  # discard: nothing listens there
        accounts={"111111111111": AccountAccess(role_arn="arn:aws:iam::111111111111:role/r")},
    )
    setup_table(config)
    home = unique_name("home")
    create_stream(url, home, 1)
    expected = put(url, "us-east-1", home, "home", 10)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="m1"), [home], sink).start()
    try:
        await eventually(
            lambda: {r.data for _, r in sink} >= expected,
            120,
            "every record",
            lambda: f"{len(sink)} of {len(expected)}; error: {member.error!r}",
        )
        assert not any(s.efo_polling for s in member.consumer.stats().shards)
    finally:
        await member.close()
    assert member.error is None
    assert consumers(url, "us-east-1", home) == [config.consumer_name]
