"""Kinesis streams given by ARN, of several accounts and regions, read by one group (issue 36),
on moto in server mode: it keeps streams per account (by the credentials; an assumed role's
act in the role's account) and per region (by the signature), so three streams named alike
live side by side: account A's (the caller's, 123456789012) in us-east-1 and eu-west-1, and
account B's, read through a role of B assumed with moto's STS.

A member's kill is an in-process crash (``Member.crash``: no handoff, no final checkpoint, no
deregistration), not a SIGKILLed process."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from support.accounts import A, B, arn, role_in_b, three_places
from support.group import Member, make_config, setup_table
from support.moto_reshard import aws_like_splits
from support.wait import eventually

from kinesumer import AccountAccess, AccountAccessError, Config, ConfigError, Kinesumer, Record

Names = Callable[[str], str]

ROLE_B = role_in_b("orders-reader")


def put(client: Any, name: str, tag: str, start: int, count: int) -> list[bytes]:
    """Records ``<tag>:<key>:<n>`` for n in start..start+count-1, keys k0..k7."""
    datas = [f"{tag}:k{n % 8}:{n}".encode() for n in range(start, start + count)]
    for data in datas:  # one by one: a key's records keep their order
        client.put_record(StreamName=name, Data=data, PartitionKey=data.decode().split(":")[1])
    return datas


def split_first_shard(client: Any, name: str) -> None:
    shard = client.list_shards(StreamName=name)["Shards"][0]
    low, high = (int(shard["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=name, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1})


def checkpoint_partitions(config: Config) -> set[str]:
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name=config.region
    )
    items = client.scan(TableName=config.dynamodb_table, ConsistentRead=True)["Items"]
    prefix = f"check_point#{config.app}#"
    return {i["pk"]["S"][len(prefix) :] for i in items if i["pk"]["S"].startswith(prefix)}


@pytest.fixture
def env(moto_url: str, unique_name: Names, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    aws_like_splits(monkeypatch)  # moto's own split moves records and never ends the parent
    name = unique_name("orders")
    clients = three_places(moto_url, name, ROLE_B, shards=2)
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=moto_url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
    )
    setup_table(config)
    arns = {
        "a-us": arn("us-east-1", A, name),
        "a-eu": arn("eu-west-1", A, name),
        "b-us": arn("us-east-1", B, name),
    }
    return {"config": config, "name": name, "clients": clients, "arns": arns}


def first_seen_in_order(got: list[Record]) -> dict[tuple[str, str], list[int]]:
    """Per (stream, key): the numbers in the order first delivered (a replay after a crash
    repeats a tail, never reorders it)."""
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for record in got:
        _, key, n = record.data.decode().split(":")
        if int(n) not in seen[(record.stream, key)]:
            seen[(record.stream, key)].append(int(n))
    return seen


async def test_a_group_reads_one_name_in_two_accounts_and_two_regions_through_kill_join_and_reshard(
    env: dict[str, Any],
) -> None:
    config, clients, arns = env["config"], env["clients"], env["arns"]
    streams = sorted(arns.values())
    sink: list[tuple[str, Record]] = []
    expected: dict[str, set[bytes]] = {
        arns[k]: set(put(c, env["name"], k, 0, 40)) for k, c in clients.items()
    }

    def delivered() -> dict[str, set[bytes]]:
        found: dict[str, set[bytes]] = defaultdict(set)
        for _, record in sink:
            found[record.stream].add(record.data)
        return found

    first = Member(config.replace(client_id="m1"), streams, sink).start()
    second = Member(config.replace(client_id="m2"), streams, sink).start()
    members = [first, second]
    try:
        await eventually(lambda: delivered() == expected, 60, "the first 120 records")
        await eventually(first.flushed, 30, "m1's checkpoints flushed")
        await first.crash()
        third = Member(config.replace(client_id="m3"), streams, sink).start()
        members = [second, third]
        split_first_shard(clients["b-us"], env["name"])  # B's stream reshards
        for key, client in clients.items():
            expected[arns[key]] |= set(put(client, env["name"], key, 40, 40))
        await eventually(
            lambda: delivered() == expected,
            90,
            "every record after the kill, the join and the reshard",
            lambda: f"missing: { {s: len(expected[s] - delivered()[s]) for s in expected} }",
        )
        owned = {shard for m in members for shard in m.owned()}
        assert {s for s, _ in owned} <= set(streams)
    finally:
        await asyncio.gather(*(m.close() for m in members), return_exceptions=True)

    for member in members:
        assert member.error is None
    got = [r for _, r in sink]
    # Records name each stream as the application did; each key's records in order.
    assert {r.stream for r in got} == set(streams)
    for (stream, key), numbers in first_seen_in_order(got).items():
        assert numbers == sorted(numbers), (stream, key)
        tag = next(k for k, a in arns.items() if a == stream)
        assert all(r.data.decode().startswith(f"{tag}:") for r in got if r.stream == stream)
    # No state item shared: the home stream (A, us-east-1) under its plain name, the others
    # under their ARNs.
    assert checkpoint_partitions(config) == {env["name"], arns["a-eu"], arns["b-us"]}


def test_a_stream_named_and_then_given_by_its_home_arn_keeps_its_checkpoints(
    env: dict[str, Any],
) -> None:
    config, name = env["config"], env["name"]
    client = env["clients"]["a-us"]
    put(client, name, "a-us", 0, 10)

    def read(stream: str, count: int) -> list[Record]:
        got: list[Record] = []
        with Kinesumer(config) as consumer:
            for record in consumer.consume([stream]):
                got.append(record)
                if len(got) == count:
                    break
        return got

    by_name = read(name, 10)
    put(client, name, "a-us", 10, 5)
    by_arn = read(env["arns"]["a-us"], 5)

    assert {r.stream for r in by_name} == {name}
    assert {r.stream for r in by_arn} == {env["arns"]["a-us"]}
    assert sorted(int(r.data.split(b":")[2]) for r in by_arn) == list(range(10, 15))
    assert checkpoint_partitions(config) == {name}


def test_a_stream_of_an_account_with_no_access_is_a_named_error_at_subscribe(
    env: dict[str, Any],
) -> None:
    stranger = "222222222222"
    config = env["config"]
    with Kinesumer(config) as consumer, pytest.raises(AccountAccessError, match=stranger) as err:
        consumer.subscribe([env["arns"]["a-us"], arn("us-east-1", stranger, env["name"])])
    assert err.value.account == stranger and err.value.action == "sts:AssumeRole"


def test_a_name_and_arns_of_other_regions_mix_with_a_regional_endpoint(
    env: dict[str, Any], moto_url: str
) -> None:
    config = env["config"].replace(kinesis_endpoints={"eu-west-1": moto_url})
    clients, arns, name = env["clients"], env["arns"], env["name"]
    expected = set(put(clients["a-us"], name, "a-us", 0, 6)) | set(
        put(clients["a-eu"], name, "a-eu", 0, 6)
    )
    got: list[Record] = []
    with Kinesumer(config) as consumer:
        for record in consumer.consume([name, arns["a-eu"]]):
            got.append(record)
            if len(got) == len(expected):
                break
    assert {r.data for r in got} == expected
    assert {r.stream for r in got} == {name, arns["a-eu"]}


async def test_a_member_naming_the_stream_and_one_giving_its_home_arn_share_its_shards(
    env: dict[str, Any],
) -> None:
    """A rolling upgrade from the name to the home ARN: both members read the same items and
    count each other as readers of the stream, so its two shards are split between them."""
    config, name = env["config"], env["name"]
    sink: list[tuple[str, Record]] = []
    old = Member(config.replace(client_id="old"), [name], sink).start()
    new = Member(config.replace(client_id="new"), [env["arns"]["a-us"]], sink).start()
    try:
        await eventually(
            lambda: len(old.owned()) == 1 and len(new.owned()) == 1,
            30,
            "one shard each",
            lambda: f"old {old.owned()}, new {new.owned()}",
        )
        expected = set(put(env["clients"]["a-us"], name, "a-us", 0, 30))
        await eventually(lambda: {r.data for _, r in sink} == expected, 60, "every record")
    finally:
        await asyncio.gather(old.close(), new.close(), return_exceptions=True)
    assert len(sink) == len(expected)  # none twice
    assert {r.stream for c, r in sink if c == "old"} == {name}
    assert {r.stream for c, r in sink if c == "new"} == {env["arns"]["a-us"]}
    assert checkpoint_partitions(config) == {name}


async def test_run_and_an_added_handler_take_arns_of_other_accounts_and_regions(
    env: dict[str, Any],
) -> None:
    from kinesumer import AsyncKinesumer

    arns, clients, name = env["arns"], env["clients"], env["name"]
    expected = set(put(clients["b-us"], name, "b-us", 0, 10)) | set(
        put(clients["a-eu"], name, "a-eu", 0, 10)
    )
    seen: list[Record] = []
    audited: list[Record] = []

    def done() -> bool:
        return {r.data for r in seen} == expected and len(audited) == 10

    async def handle(record: Record) -> None:
        seen.append(record)

    async def audit(record: Record) -> None:
        audited.append(record)

    async with AsyncKinesumer(env["config"]) as consumer:
        consumer.add_handler("audit", audit, streams=[arns["b-us"]])
        running = asyncio.create_task(
            consumer.run([arns["b-us"], arns["a-eu"]], handle, ordering="key")
        )
        await eventually(
            done, 60, "every record handled, B's audited", lambda: f"{len(seen)}, {len(audited)}"
        )
        await consumer.aclose()
        await running
    assert {r.stream for r in audited} == {arns["b-us"]}
    assert {r.data for r in audited} == {d for d in expected if d.startswith(b"b-us:")}


def test_refresh_adds_a_stream_of_another_account_by_arn(env: dict[str, Any]) -> None:
    arns, clients, name = env["arns"], env["clients"], env["name"]
    put(clients["a-us"], name, "a-us", 0, 3)
    put(clients["b-us"], name, "b-us", 0, 3)
    got: list[Record] = []
    with Kinesumer(env["config"]) as consumer:
        for record in consumer.consume([name]):
            got.append(record)
            if len(got) == 3:
                consumer.refresh([name, arns["b-us"]])
            if len(got) == 6:
                break
    assert {r.stream for r in got} == {name, arns["b-us"]}
    assert {r.data for r in got if r.stream == arns["b-us"]} == {
        f"b-us:k{n}:{n}".encode() for n in range(3)
    }


def test_a_stream_given_by_name_and_by_its_home_arn_at_once_is_refused_by_name(
    env: dict[str, Any],
) -> None:
    """Two leases of one shard under two names would fence each other on its one checkpoint
    item every tick: the join, and a refresh, refuse them, naming both."""
    name, home_arn = env["name"], env["arns"]["a-us"]
    with Kinesumer(env["config"]) as consumer, pytest.raises(ConfigError) as err:
        consumer.subscribe([name, home_arn])
    assert repr(name) in str(err.value) and repr(home_arn) in str(err.value)
    with Kinesumer(env["config"]) as consumer:
        consumer.subscribe([name, env["arns"]["b-us"]])  # one name in two accounts: two streams
        with pytest.raises(ConfigError, match="refresh") as err:
            consumer.refresh([name, home_arn])
        assert repr(home_arn) in str(err.value)


async def test_a_broadcast_member_switching_from_the_name_to_its_home_arn_resumes(
    env: dict[str, Any],
) -> None:
    """Broadcast positions are kept under the state key too: a ``broadcast_resume`` member
    that read ``orders`` and now names its home ARN resumes after what it committed, not at
    ``initial_position`` (TRIM_HORIZON here: it would deliver the first records again)."""
    from kinesumer import AsyncKinesumer

    name, home_arn, client = env["name"], env["arns"]["a-us"], env["clients"]["a-us"]
    config = env["config"].replace(
        broadcast=True, broadcast_resume=True, client_id="cache-1", auto_commit=False
    )
    first_batch = set(put(client, name, "a-us", 0, 6))
    first = AsyncKinesumer(config)
    await first.subscribe([name])
    delivered: list[Record] = []
    while len(delivered) < 6:
        delivered += await first.poll(6 - len(delivered), 1.0)
    await first.commit()
    await first.aclose()
    assert {r.data for r in delivered} == first_batch
    later = set(put(client, name, "a-us", 6, 4))
    second = AsyncKinesumer(config.replace(auto_commit=True))
    await second.subscribe([home_arn])
    again: list[Record] = []

    async def read_the_later_ones() -> None:
        while not {r.data for r in again} >= later:
            again.extend(await second.poll(10, 1.0))
            assert not {r.data for r in again} & first_batch, "resumed at initial_position"

    try:
        await asyncio.wait_for(read_the_later_ones(), 60)
    finally:
        await second.aclose()
    assert {r.stream for r in again} == {home_arn}
    assert {r.data for r in again} == later


async def test_group_lag_probes_the_streams_members_give_by_arn_under_their_state_keys(
    env: dict[str, Any],
) -> None:
    """A live member reading the home ARN and B's ARN: the lag covers the home stream once,
    under its plain name (no row for its ARN), and B's stream through B's role (a plain
    Kinesis client sent the ARNs as names: left out on moto, refused on AWS)."""
    from kinesumer import AsyncKinesumer
    from kinesumer.admin import probe_group_lag

    arns, clients, name = env["arns"], env["clients"], env["name"]
    put(clients["b-us"], name, "b-us", 0, 3)
    consumer = AsyncKinesumer(env["config"])
    try:
        await consumer.subscribe([arns["a-us"], arns["b-us"]])
        lag = await probe_group_lag(env["config"])
    finally:
        await consumer.aclose()
    assert set(lag.streams) == {name, arns["b-us"]}
    assert {(row.stream, row.shard_id) for row in lag.shards} == {
        (stream, f"shardId-00000000000{n}") for stream in (name, arns["b-us"]) for n in (0, 1)
    }


def test_status_shows_a_home_stream_given_by_arn_once_under_its_name(
    env: dict[str, Any],
) -> None:
    """A member giving its home stream by ARN announces the ARN and the name its items are kept
    under: ``status`` shows the stream once, under the name (no empty row for the ARN)."""
    from kinesumer.cli.view import collect
    from kinesumer.statestore.group_view import open_table

    config, name = env["config"], env["name"]
    put(env["clients"]["a-us"], name, "a-us", 0, 4)

    async def status() -> Any:
        async with open_table(config) as (_, store):
            return await collect(
                store,
                app=config.app,
                table=config.dynamodb_table,
                client_timeout=config.client_timeout,
            )

    with Kinesumer(config) as consumer:
        consumer.subscribe([env["arns"]["a-us"]])
        got = 0
        while got < 4:
            got += len(consumer.poll(10, 1.0))
        seen = asyncio.run(status())
    assert list(seen.streams) == [name]
    assert {view.owner for view in seen.streams[name]} == {consumer.client_id}
