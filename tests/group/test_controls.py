"""Operator controls: properties of the pure application of pins and step-downs, the item codec
and its version condition, and a real group on kinesalite + dynalite driven by the library calls
and the ``kinesumer`` command (pin, unpin, pins, step-down, rebalance, status)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st
from support.group import Member, create_stream, make_config, setup_table
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import admin
from kinesumer.cli import main
from kinesumer.core import assign, sticky_assign
from kinesumer.core.controls import (
    Controls,
    StepDown,
    controlled_leader,
    merge,
    split_pins,
)
from kinesumer.group import controls as engine_controls
from kinesumer.statestore.dynamodb.controls import (
    controls_condition,
    controls_item,
    decode_controls,
)

NOW = 1_000_000


@st.composite
def controlled_groups(
    draw: st.DrawFn,
) -> tuple[dict[str, frozenset[str]], dict[str, list[str]], Controls]:
    ids = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=6, unique=True))
    shards = {"s": [f"sh{i}" for i in range(draw(st.integers(0, 20)))], "t": ["t0", "t1"]}
    members = {c: frozenset(draw(st.sampled_from([("s",), ("s", "t"), ("t",)]))) for c in ids}
    targets = st.sampled_from([*ids, "dead"])
    pins = {
        (stream, sid): draw(targets)
        for stream, sids in shards.items()
        for sid in sids
        if draw(st.integers(0, 3)) == 0
    }
    steps = {
        c: StepDown(NOW + draw(st.sampled_from([-1, 1000])), draw(st.booleans()))
        for c in ids
        if draw(st.booleans())
    }
    return members, shards, Controls(1, pins, steps)


def full_assignment(
    members: dict[str, frozenset[str]], shards: dict[str, list[str]], controls: Controls, mode: str
) -> dict[str, dict[str, tuple[str, ...]]]:
    split = split_pins(members, shards, controls, NOW)
    auto = (
        assign(split.members, split.shards)
        if mode == "range"
        else sticky_assign(split.members, split.shards, {})
    )
    return {c: merge(auto.get(c, {}), split.pinned.get(c, {})) for c in members}


@pytest.mark.parametrize("mode", ["range", "sticky"])
@given(group=controlled_groups())
def test_every_shard_once_pins_honoured_when_their_member_is_live(
    mode: str, group: tuple[dict[str, frozenset[str]], dict[str, list[str]], Controls]
) -> None:
    members, shards, controls = group
    result = full_assignment(members, shards, controls, mode)
    for stream, ids in shards.items():
        assigned = sorted(sid for c in result for sid in result[c].get(stream, ()))
        if any(stream in s for s in members.values()):
            assert assigned == sorted(ids)
    for (stream, sid), target in controls.pins.items():
        if target in members and stream in members[target]:
            assert sid in result[target].get(stream, ())
    drained = controls.stepped_down(NOW, drained=True)
    for client in drained & set(members):  # it reads only pins and streams nobody else reads
        for stream, ids in result[client].items():
            others = [c for c in members if c not in drained and stream in members[c]]
            assert not others or all(controls.pins.get((stream, sid)) == client for sid in ids)


@given(group=controlled_groups())
def test_leader_is_the_lowest_live_id_not_stepped_down(
    group: tuple[dict[str, frozenset[str]], dict[str, list[str]], Controls],
) -> None:
    members, _, controls = group
    live = sorted(members)
    leader = controlled_leader(live, controls, NOW)
    down = controls.stepped_down(NOW)
    candidates = [c for c in live if c not in down] or live
    assert leader == candidates[0]
    assert controlled_leader(list(reversed(live)), controls, NOW) == leader


def test_pin_to_a_dead_member_falls_back_and_is_named() -> None:
    controls = Controls(1, {("s", "s1"): "c", ("s", "s2"): "z"}, {"a": StepDown(NOW + 1, True)})
    members = {c: frozenset({"s"}) for c in "abc"}
    split = split_pins(members, {"s": ["s0", "s1", "s2", "s3"]}, controls, NOW)
    assert split.pinned == {"c": {"s": ("s1",)}}
    assert split.fallen_back == (("s", "s2", "z"),)
    assert split.shards == {"s": ["s0", "s2", "s3"]} and split.members["a"] == frozenset()
    assert controlled_leader(["a", "b", "c"], controls, NOW) == "b"
    assert controlled_leader(["a", "b", "c"], controls, NOW + 1) == "a"  # expired


def test_codec_round_trip_and_version_condition() -> None:
    controls = Controls(3, {("s", "sh/x".replace("/", "-")): "b"}, {"a": StepDown(5, True)}, 2)
    item = controls_item("app", controls)
    decoded = decode_controls(item)
    assert decoded.version == 4 and decoded.pins == controls.pins
    assert decoded.step_downs == controls.step_downs and decoded.rebalance == 2
    assert controls_condition(3)["ExpressionAttributeValues"][":v"] == {"N": "3"}
    assert decode_controls(None) == Controls()


# -- a real group ------------------------------------------------------------------------------
@pytest.fixture
def quick_controls() -> Iterator[None]:
    """Members read the controls every 0.5 s instead of 5 s, so the test waits less."""
    saved = engine_controls.READ_EVERY
    engine_controls.READ_EVERY = 0.5
    yield
    engine_controls.READ_EVERY = saved


async def cli(config: object, *args: str) -> int:
    """The command line on the group's table, in a thread (it runs its own event loop)."""
    c = config
    return await asyncio.to_thread(
        main,
        [
            args[0],
            "--app",
            c.app,  # type: ignore[attr-defined]
            "--table",
            c.dynamodb_table,  # type: ignore[attr-defined]
            "--region",
            "us-east-1",
            "--dynamodb-endpoint",
            c.dynamodb_endpoint,  # type: ignore[attr-defined]
            *args[1:],
        ],
    )


@pytest.mark.timeout(60)
async def test_a_group_obeys_pins_step_downs_and_rebalances(
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name,
    quick_controls: None,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO, logger="kinesumer")
    stream, app, table = unique_name("controls"), unique_name("app"), unique_name("table")
    create_stream(kinesalite.url, stream, 4)
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    sink: list = []
    a = Member(config.replace(client_id="m-a"), [stream], sink).start()
    b = Member(config.replace(client_id="m-b"), [stream], sink).start()
    members = (a, b)
    await eventually(lambda: len(a.owned()) == len(b.owned()) == 2, what="two shards each")
    assert a.consumer.stats().leader
    shard = sorted(sid for _, sid in a.owned())[0]

    # Pin one of a's shards to b (the library call): b owns it, a does not.
    controls = await asyncio.to_thread(admin.pin_shard, config, stream, shard, "m-b")
    assert controls.pins == {(stream, shard): "m-b"}
    await eventually(
        lambda: (stream, shard) in b.owned() and (stream, shard) not in a.owned(),
        what="the pinned shard on m-b",
    )
    assert admin.list_pins(config) == {(stream, shard): "m-b"}
    assert await cli(config, "pins") == 0 and f"{stream}/{shard} -> m-b" in capsys.readouterr().out
    assert await cli(config, "status") == 0
    assert f"pin {stream}/{shard} -> m-b" in capsys.readouterr().out

    # Unpin (the command line): the shard goes back to a.
    assert await cli(config, "unpin", "--stream", stream, "--shard", shard) == 0
    await eventually(lambda: (stream, shard) in a.owned(), what="the shard back on m-a")

    # A pin to a dead member falls back (logged); the shard stays read.
    await asyncio.to_thread(admin.pin_shard, config, stream, shard, "m-gone")
    await eventually(
        lambda: "pinned to m-gone" in caplog.text and (stream, shard) in a.owned(),
        what="the fallback logged",
    )
    await asyncio.to_thread(admin.unpin_shard, config, stream, shard)

    # Step-down of the leader moves leadership; status shows it.
    assert await cli(config, "step-down", "m-a", "--seconds", "60") == 0
    await eventually(
        lambda: b.consumer.stats().leader and not a.consumer.stats().leader,
        what="m-b leads",
    )
    capsys.readouterr()
    assert await cli(config, "status", "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["leader"] == "m-b"
    assert [s["client_id"] for s in document["controls"]["step_downs"]] == ["m-a"]
    await asyncio.to_thread(admin.step_down, config, "m-a", 0)
    await eventually(lambda: a.consumer.stats().leader, what="m-a leads again")

    # Forced rebalance: every member sees it.
    assert await cli(config, "rebalance") == 0
    await eventually(
        lambda: caplog.text.count("forced rebalance #1") >= 2, what="both members rebalance"
    )
    await eventually(lambda: len(a.owned()) == len(b.owned()) == 2, what="two each again")
    for member in members:
        await member.close()
        assert member.error is None


def test_a_stale_version_is_refused(dynalite: NodeStandIn, unique_name) -> None:
    config = make_config("http://127.0.0.1:1", dynalite.url, unique_name("app"), unique_name("t"))
    setup_table(config)
    stale = admin.read_controls(config)
    admin.force_rebalance(config)
    client = boto3.client("dynamodb", endpoint_url=dynalite.url, region_name="us-east-1")
    with pytest.raises(ClientError) as refused:
        client.put_item(
            TableName=config.dynamodb_table,
            Item=controls_item(config.app, stale),
            **controls_condition(stale.version),
        )
    assert refused.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    # The library's read-modify-write retries instead: both changes land.
    admin.pin_shard(config, "s", "x", "m")
    assert admin.read_controls(config).rebalance == 1
    assert admin.list_pins(config) == {("s", "x"): "m"}


@pytest.mark.timeout(60)
async def test_a_member_without_controls_suspends_them_for_the_group(
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name,
    quick_controls: None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rolling upgrade: m-z behaves as an older version (it ignores the controls). A pin of
    one of its shards to m-a must not make m-a take it: the leader (m-a) names m-z legacy and
    every new member suspends pins and step-downs while m-z is live."""
    caplog.set_level(logging.INFO, logger="kinesumer")
    monkeypatch.setenv(engine_controls.LEGACY_ENV, "m-z")
    stream, app, table = unique_name("mixed"), unique_name("app"), unique_name("table")
    create_stream(kinesalite.url, stream, 4)
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    sink: list = []
    a = Member(config.replace(client_id="m-a"), [stream], sink).start()
    z = Member(config.replace(client_id="m-z"), [stream], sink).start()
    await eventually(lambda: len(a.owned()) == len(z.owned()) == 2, what="two shards each")
    shard = sorted(sid for _, sid in z.owned())[0]
    await asyncio.to_thread(admin.pin_shard, config, stream, shard, "m-a")
    await asyncio.to_thread(admin.step_down, config, "m-a", 60)
    await eventually(
        lambda: "pins and step-downs suspended: members m-z" in caplog.text,
        what="m-a suspends the controls",
    )
    assert (stream, shard) in z.owned() and (stream, shard) not in a.owned()
    assert a.consumer.stats().leader  # the step-down is suspended too: m-a leads, as m-z thinks
    await z.close()  # the old member left: m-a reads everything
    await eventually(lambda: len(a.owned()) == 4, what="m-a takes every shard")
    await a.close()
    assert a.error is None and z.error is None


@pytest.mark.timeout(60)
async def test_a_forced_rebalance_lays_a_sticky_group_out_afresh(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name, quick_controls: None
) -> None:
    """m-b starts alone; m-a joins and sticky hands it m-b's upper half. A forced rebalance
    lays the shards out as if nobody owned any: m-a (first by id) takes the lower half."""
    stream, app, table = unique_name("fresh"), unique_name("app"), unique_name("table")
    create_stream(kinesalite.url, stream, 4)
    config = make_config(kinesalite.url, dynalite.url, app, table, assignment="sticky")
    setup_table(config)
    sink: list = []
    ids = [(stream, f"shardId-{i:012d}") for i in range(4)]
    b = Member(config.replace(client_id="m-b"), [stream], sink).start()
    await eventually(lambda: len(b.owned()) == 4, what="m-b holds every shard")
    a = Member(config.replace(client_id="m-a"), [stream], sink).start()
    await eventually(lambda: a.owned() == set(ids[2:]), what="sticky: m-a gets the upper half")
    await asyncio.to_thread(admin.force_rebalance, config)
    await eventually(
        lambda: a.owned() == set(ids[:2]) and b.owned() == set(ids[2:]),
        what="the layout from scratch",
        diagnose=lambda: f"a={sorted(a.owned())} b={sorted(b.owned())}",
    )
    for member in (a, b):
        await member.close()
        assert member.error is None


def test_library_calls_check_their_arguments() -> None:
    from kinesumer import Config, ConfigError

    config = Config(app="a", dynamodb_table="table")
    for seconds in (-1, float("inf"), float("nan"), True):
        with pytest.raises(ConfigError):
            admin.step_down(config, "m", seconds)
    with pytest.raises(ConfigError):
        admin.pin_shard(config, "s/x", "shard", "m")
    with pytest.raises(ConfigError):
        admin.pin_shard(config, "s", "shard/x", "m")


def test_a_shard_of_a_tables_stream_is_pinned_by_its_arn(
    dynalite: NodeStandIn, unique_name
) -> None:
    """A DynamoDB stream's ARN has '/'s: the pin is kept under it, and read back whole."""
    config = make_config("http://127.0.0.1:1", dynalite.url, unique_name("app"), unique_name("t"))
    setup_table(config)
    arn = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-12-07T19:17:42.834"
    admin.pin_shard(config, arn, "shardId-00000001", "m")
    assert admin.list_pins(config) == {(arn, "shardId-00000001"): "m"}
    admin.unpin_shard(config, arn, "shardId-00000001")
    assert admin.list_pins(config) == {}


def test_a_pin_by_kinesis_arn_is_one_pin_with_its_name_and_another_accounts_its_own(
    dynalite: NodeStandIn, unique_name
) -> None:
    """``admin.pin_shard`` takes a Kinesis stream ARN as members are given it. ``orders`` and
    its home ARN (the role's account, the Kinesis region: no STS call) are one stream: a pin by
    one replaces the other's and an unpin by either removes it; another account's ``orders``
    keeps its own pin."""
    config = make_config(
        "http://127.0.0.1:1",
        dynalite.url,
        unique_name("app"),
        unique_name("t"),
        role_arn="arn:aws:iam::111111111111:role/reader",
        kinesis_region="eu-west-1",
    )
    setup_table(config)
    home = "arn:aws:kinesis:eu-west-1:111111111111:stream/orders"
    other = "arn:aws:kinesis:eu-west-1:222222222222:stream/orders"
    shard = "shardId-000000000000"
    admin.pin_shard(config, "orders", shard, "m1")
    admin.pin_shard(config, home, shard, "m2")
    admin.pin_shard(config, other, shard, "m3")
    assert admin.list_pins(config) == {(home, shard): "m2", (other, shard): "m3"}
    admin.unpin_shard(config, "orders", shard)
    assert admin.list_pins(config) == {(other, shard): "m3"}
    admin.unpin_shard(config, other, shard)
    assert admin.list_pins(config) == {}


async def test_pins_by_arn_from_a_coroutine_with_and_without_the_roles_account(
    moto_url: str, unique_name
) -> None:
    """Called from a coroutine (a notebook cell, an async service), ``pin_shard`` still works
    when it must compare ARNs: with ``role_arn`` the home is known without I/O; without it the
    caller's account is asked of STS (moto's: 123456789012) from a thread of its own, not by
    an event loop inside the running one."""
    shard = "shardId-000000000000"
    for role_arn, account in (("arn:aws:iam::111111111111:role/r", "111111111111"), (None, None)):
        account = account or "123456789012"
        config = make_config(
            moto_url, moto_url, unique_name("app"), unique_name("t"), sts_endpoint=moto_url
        )
        if role_arn:
            config = config.replace(role_arn=role_arn)
        setup_table(config)
        home = f"arn:aws:kinesis:us-east-1:{account}:stream/orders"
        admin.pin_shard(config, home, shard, "m1")
        admin.pin_shard(config, "orders", shard, "m2")  # replaces the ARN's pin: one stream
        assert admin.list_pins(config) == {("orders", shard): "m2"}
        admin.unpin_shard(config, home, shard)
        assert admin.list_pins(config) == {}
