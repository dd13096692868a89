"""An account's role refused, or STS throttled, when a running member renews the role's
credentials, on moto in server mode.

moto's STS lets anyone assume any role (deleting the role or changing its trust policy does
not make it refuse), so a fault proxy stands in front of it as ``sts_endpoint``: it answers
AssumeRole with credentials moto issued for account B's role but an expiry 9 minutes away,
inside botocore's mandatory refresh window (10 minutes), so every Kinesis call of B renews
them first (no real hours waited); then it refuses AssumeRole, or throttles it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from support.accounts import A, B, arn, client_of, create, role_in_b
from support.faultproxy import Fault, FaultProxy, OpKey
from support.group import Member, make_config, setup_table
from support.wait import eventually

from kinesumer import (
    AccountAccess,
    AccountAccessError,
    AsyncKinesumer,
    Config,
    ConfigError,
    Kinesumer,
    Record,
)
from kinesumer.admin import rewind_group

ROLE_B = role_in_b("orders-reader")


def renewing_answer(moto_url: str) -> bytes:
    """An AssumeRole answer holding moto's credentials for B's role, expiring in 9 minutes."""
    sts = boto3.client("sts", endpoint_url=moto_url, region_name="us-east-1")
    creds = sts.assume_role(RoleArn=ROLE_B, RoleSessionName="renewing")["Credentials"]
    expiry = datetime.now(timezone.utc) + timedelta(minutes=9)
    return (
        '<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult>'
        f"<Credentials><AccessKeyId>{creds['AccessKeyId']}</AccessKeyId>"
        f"<SecretAccessKey>{creds['SecretAccessKey']}</SecretAccessKey>"
        f"<SessionToken>{creds['SessionToken']}</SessionToken>"
        f"<Expiration>{expiry.strftime('%Y-%m-%dT%H:%M:%SZ')}</Expiration></Credentials>"
        f"<AssumedRoleUser><AssumedRoleId>AROA:renewing</AssumedRoleId>"
        f"<Arn>arn:aws:sts::{B}:assumed-role/orders-reader/renewing</Arn></AssumedRoleUser>"
        "</AssumeRoleResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata>"
        "</AssumeRoleResponse>"
    ).encode()


class Sts:
    """The proxy in front of moto's STS: AssumeRole answered with short-lived credentials until
    :attr:`refused` is set (then AccessDenied), throttled first while :attr:`throttling`."""

    def __init__(self, proxy: FaultProxy, moto_url: str) -> None:
        self.proxy = proxy
        self.refused = threading.Event()
        self.throttling = threading.Event()
        # Rules match in the order added: the throttle, then the refusal, then the answer.
        self.throttle = proxy.add_rule(
            Fault.throttle(),
            service="sts",
            operation="AssumeRole",
            count=8,  # more than one renewal's tries: the readers' own pauses carry on
            when=lambda _: self.throttling.is_set(),
        )
        proxy.add_rule(
            Fault.landed_then_refused(),
            service="sts",
            operation="AssumeRole",
            when=lambda _: self.refused.is_set(),
        )
        proxy.add_rule(
            Fault.answer(renewing_answer(moto_url), "text/xml"),
            service="sts",
            operation="AssumeRole",
        )

    def assumed(self) -> int:
        found = self.proxy.stats().get(OpKey("sts", "AssumeRole"))
        return 0 if found is None else found.requests


@pytest.fixture
def env(
    moto_url: str, unique_name: Callable[[str], str], fault_proxy: Callable[[str], FaultProxy]
) -> dict[str, Any]:
    name = unique_name("orders")
    home, b = client_of(moto_url, "us-east-1"), client_of(moto_url, "us-east-1", ROLE_B)
    create(home, name)
    create(b, name, 2)
    proxy = fault_proxy(moto_url)
    sts = Sts(proxy, moto_url)
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=proxy.url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
    )
    setup_table(config)
    return {"config": config, "name": name, "home": home, "b": b, "sts": sts}


def put(client: Any, name: str, tag: str, start: int, count: int) -> set[bytes]:
    datas = [f"{tag}:{n}".encode() for n in range(start, start + count)]
    for data in datas:
        client.put_record(StreamName=name, Data=data, PartitionKey=str(data))
    return set(datas)


def datas(sink: list[tuple[str, Record]]) -> set[bytes]:
    return {record.data for _, record in sink}


async def test_a_role_refused_at_a_renewal_fails_the_member_naming_the_account_and_the_role(
    env: dict[str, Any],
) -> None:
    config, name, sts = env["config"], env["name"], env["sts"]
    b_arn = arn("us-east-1", B, name)
    expected = put(env["home"], name, "a", 0, 5) | put(env["b"], name, "b", 0, 5)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="m1"), [name, b_arn], sink).start()
    members = [member]
    try:
        await eventually(lambda: datas(sink) == expected, 60, "A's and B's first records")
        renewals = sts.assumed()
        await eventually(lambda: sts.assumed() > renewals, 30, "B's credentials renewed again")
        sts.refused.set()  # the trust policy changed: the next renewal is refused
        await eventually(lambda: member.error is not None, 60, "the member failing")
        # It failed as a whole (A's shard too), looking dead to the others: once the role is
        # trusted again, another member takes every shard over from the checkpoints.
        sts.refused.clear()
        later = put(env["home"], name, "a", 5, 5) | put(env["b"], name, "b", 5, 5)
        after = Member(config.replace(client_id="m2"), [name, b_arn], sink).start()
        members.append(after)
        await eventually(lambda: datas(sink) >= later, 60, "A's and B's later records")
        assert {c for c, r in sink if r.data in later} == {"m2"}
        assert after.error is None
    finally:
        await asyncio.gather(*(m.close() for m in members), return_exceptions=True)
    error = member.error
    assert isinstance(error, AccountAccessError), repr(error)
    assert (error.account, error.role_arn, error.action) == (B, ROLE_B, "sts:AssumeRole")
    assert B in str(error) and ROLE_B in str(error) and f"Config.accounts['{B}']" in str(error)
    assert A not in str(error)


async def test_a_throttled_sts_at_a_renewal_is_retried_and_reading_goes_on(
    env: dict[str, Any],
) -> None:
    config, name, sts = env["config"], env["name"], env["sts"]
    b_arn = arn("us-east-1", B, name)
    expected = put(env["b"], name, "b", 0, 5)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="m1"), [b_arn], sink).start()
    try:
        await eventually(lambda: datas(sink) == expected, 60, "B's first records")
        sts.throttling.set()
        await eventually(lambda: sts.throttle.exhausted, 60, "eight renewals throttled")
        expected |= put(env["b"], name, "b", 5, 5)
        await eventually(lambda: datas(sink) == expected, 60, "B's records after the throttling")
        stats = member.consumer.stats()
    finally:
        await asyncio.gather(member.close(), return_exceptions=True)
    assert member.error is None
    assert stats.retries.get("sts.AssumeRole:Throttling", 0) >= 1, stats.retries


def read(config: Config, streams: list[str], count: int) -> list[Record]:
    got: list[Record] = []
    with Kinesumer(config) as consumer:
        for record in consumer.consume(streams):
            got.append(record)
            if len(got) == count:
                break
    return got


def test_moving_from_role_arn_and_names_to_accounts_and_arns_keeps_or_names_the_checkpoints(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """The caller is in A; the stream in B. The old configuration read it by name through
    ``role_arn`` (B is then home: kept under the plain name); the new one gives its ARN with
    B in ``accounts`` (A is home: kept under the ARN). The new one is refused, naming both keys
    and the way to keep the checkpoints, which works: ``role_arn`` again, with the ARN."""
    name = unique_name("orders")
    b = client_of(moto_url, "us-east-1", ROLE_B)
    create(b, name)
    b_arn = arn("us-east-1", B, name)
    first = put(b, name, "b", 0, 5)
    old = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=moto_url,
        role_arn=ROLE_B,
    )
    setup_table(old)
    assert {r.data for r in read(old, [name], 5)} == first

    new = old.replace(role_arn=None, accounts={B: AccountAccess(role_arn=ROLE_B)})
    with Kinesumer(new) as consumer, pytest.raises(ConfigError) as err:
        consumer.subscribe([b_arn])
    message = str(err.value)
    assert repr(b_arn) in message and repr(name) in message
    assert f"arn:aws:iam::{B}:role/" in message
    assert f"kinesumer checkpoints rewind --stream {b_arn} --to trim-horizon" in message

    # The way kept: role_arn's account is home again, its ARN kept under the plain name.
    later = put(b, name, "b", 5, 3)
    kept = new.replace(role_arn=ROLE_B)
    got = read(kept, [b_arn], 3)
    assert {r.data for r in got} == later and {r.stream for r in got} == {b_arn}


def test_an_arn_of_another_account_beside_a_home_stream_of_the_same_name_is_not_refused(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """Two streams named alike, the home one by name: the ARN's fresh key is no migration."""
    name = unique_name("orders")
    home, b = client_of(moto_url, "us-east-1"), client_of(moto_url, "us-east-1", ROLE_B)
    create(home, name)
    create(b, name)
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=moto_url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
    )
    setup_table(config)
    at_home = put(home, name, "a", 0, 3)
    assert {r.data for r in read(config, [name], 3)} == at_home
    in_b = put(b, name, "b", 0, 3)
    got = read(config, [name, arn("us-east-1", B, name)], 3)
    assert {r.data for r in got} == in_b


def two_streams_named_alike(moto_url: str, unique_name: Callable[[str], str]) -> dict[str, Any]:
    """The home ``orders`` (A) and B's, and a group that has read the home one by name."""
    name = unique_name("orders")
    home, b = client_of(moto_url, "us-east-1"), client_of(moto_url, "us-east-1", ROLE_B)
    create(home, name)
    create(b, name)
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=moto_url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
    )
    setup_table(config)
    at_home = put(home, name, "a", 0, 3)
    assert {r.data for r in read(config, [name], 3)} == at_home
    return {"config": config, "name": name, "home": home, "b": b}


async def test_a_member_reading_only_the_other_accounts_stream_beside_one_reading_the_home_one(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """Members of one group may read different streams: one reads the home ``orders``, a new
    one only B's ``orders`` by ARN. The home one's checkpoints are its reader's, not a
    migration: the new member is not refused."""
    env = two_streams_named_alike(moto_url, unique_name)
    config, name = env["config"], env["name"]
    b_arn = arn("us-east-1", B, name)
    home_sink: list[tuple[str, Record]] = []
    b_sink: list[tuple[str, Record]] = []
    at_home = Member(config.replace(client_id="home-reader"), [name], home_sink).start()
    in_b: Member | None = None
    try:
        expected_home = put(env["home"], name, "a", 3, 3)
        await eventually(lambda: datas(home_sink) == expected_home, 60, "the home reader")
        in_b = Member(config.replace(client_id="b-reader"), [b_arn], b_sink).start()
        expected_b = put(env["b"], name, "b", 0, 3)
        await eventually(lambda: datas(b_sink) == expected_b, 60, "B's records by ARN")
    finally:
        await asyncio.gather(
            at_home.close(), *([in_b.close()] if in_b else []), return_exceptions=True
        )
    assert at_home.error is None and in_b is not None and in_b.error is None


def test_a_stream_read_after_a_same_named_home_one_starts_afresh_through_a_rewind(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """The group read the home ``orders``, stopped, and now reads only B's: refused as a
    possible migration; the way the message gives (a rewind of B's ARN) starts it under its
    own key and leaves the home stream's checkpoints as they were."""
    env = two_streams_named_alike(moto_url, unique_name)
    config, name = env["config"], env["name"]
    b_arn = arn("us-east-1", B, name)
    home_before = checkpoints_of(config, name)
    assert home_before
    in_b = put(env["b"], name, "b", 0, 4)
    with Kinesumer(config) as consumer, pytest.raises(ConfigError, match="checkpoints rewind"):
        consumer.subscribe([b_arn])
    rewind_group(config, b_arn, to="trim-horizon")
    assert {r.data for r in read(config, [b_arn], 4)} == in_b
    assert checkpoints_of(config, name) == home_before


def checkpoints_of(config: Config, stream: str) -> dict[str, Any]:
    """The stream's checkpoint items as the table holds them."""
    table = boto3.client("dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1")
    found = table.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
        ConsistentRead=True,
    )["Items"]
    return {item["sk"]["S"]: item for item in found}


async def test_a_move_to_accounts_is_refused_while_members_of_the_old_configuration_run(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """A rolling move: members configured ``role_arn=<B's role>`` read B's stream by name (B is
    their home, their client items say so) while a member configured ``accounts`` joins with
    its ARN. It is the same stream: refused, not read afresh beside them."""
    name = unique_name("orders")
    b = client_of(moto_url, "us-east-1", ROLE_B)
    create(b, name)
    old = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=moto_url,
        role_arn=ROLE_B,
    )
    setup_table(old)
    sink: list[tuple[str, Record]] = []
    running = Member(old.replace(client_id="old-member"), [name], sink).start()
    try:
        expected = put(b, name, "b", 0, 3)
        await eventually(lambda: datas(sink) == expected, 60, "the old member's records")
        await eventually(
            lambda: any("sequence_number" in i for i in checkpoints_of(old, name).values()),
            60,
            "its checkpoints",
        )
        new = old.replace(role_arn=None, accounts={B: AccountAccess(role_arn=ROLE_B)})
        with pytest.raises(ConfigError, match="checkpoint"):
            async with AsyncKinesumer(new.replace(client_id="new-member")) as consumer:
                await consumer.subscribe([arn("us-east-1", B, name)])
    finally:
        await asyncio.gather(running.close(), return_exceptions=True)
    assert running.error is None


def test_a_member_of_an_older_version_naming_the_stream_counts_as_its_reader(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """An older version's client item says nothing of its home: its ``orders`` may be B's read
    through ``role_arn``, so a member joining with B's ARN only is refused."""
    env = two_streams_named_alike(moto_url, unique_name)
    config, name = env["config"], env["name"]
    table = boto3.client("dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1")
    table.put_item(
        TableName=config.dynamodb_table,
        Item={
            "pk": {"S": f"client#{config.app}"},
            "sk": {"S": "older-member"},
            "last_update": {"N": "1"},
            "expires_at": {"N": "4102444800"},
            "streams": {"L": [{"S": name}]},
            "version": {"S": "0.9.0"},
        },
    )
    with Kinesumer(config) as consumer, pytest.raises(ConfigError, match="checkpoint"):
        consumer.subscribe([arn("us-east-1", B, name)])
