"""The command line's home made the members' home (``--role-arn``, ``--kinesis-region``), on
moto in server mode (tests/support/accounts.py). A group whose members read ``orders`` by name
through ``Config(role_arn=<a role of account B>)`` keeps its checkpoints under the plain name;
so does a group reading it in ``Config(kinesis_region=...)``. The command line given the same
role or region shows and moves those checkpoints by the name and by the stream's ARN (kept under
the plain name), and reads the stream by name where the members read it, not the caller's own
stream of that name (a decoy with another shard count here)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from support.accounts import A, B, arn, client_of, create, role_in_b
from support.faultproxy import Fault, FaultProxy
from support.group import Member, make_config, setup_table
from support.wait import eventually

from kinesumer import Config, Record, cli

ROLE_B = role_in_b("orders-reader")
RECORDS = 12


@pytest.fixture
def env(moto_url: str, unique_name: Callable[[str], str]) -> dict[str, Any]:
    """``orders`` in B's us-east-1 (2 shards), A's eu-west-1 (1 shard) and, as a decoy, A's
    us-east-1 (3 shards: the caller's own stream of that name)."""
    name = unique_name("orders")
    clients = {
        "b-us": client_of(moto_url, "us-east-1", ROLE_B),
        "a-eu": client_of(moto_url, "eu-west-1"),
        "a-us": client_of(moto_url, "us-east-1"),
    }
    for place, shards in (("b-us", 2), ("a-eu", 1), ("a-us", 3)):
        create(clients[place], name, shards)
    return {
        "url": moto_url,
        "name": name,
        "app": unique_name("app"),
        "table": unique_name("state"),
        "clients": clients,
        "arns": {
            "b-us": arn("us-east-1", B, name),
            "a-eu": arn("eu-west-1", A, name),
        },
    }


def put(client: Any, name: str, tag: str) -> set[bytes]:
    datas = {f"{tag}:{n}".encode() for n in range(RECORDS)}
    for data in sorted(datas):
        client.put_record(StreamName=name, Data=data, PartitionKey=data.decode())
    return datas


def read_by_name(config: Config, name: str, expected: set[bytes]) -> list[Record]:
    """One member of ``config`` reads ``name`` until it has delivered ``expected`` and
    checkpointed it, then closes (its final checkpoints written)."""

    async def go() -> list[Record]:
        sink: list[tuple[str, Record]] = []
        member = Member(config, [name], sink).start()
        try:
            await eventually(
                lambda: expected <= {r.data for _, r in sink} and member.flushed(),
                what="the member read and checkpointed every record",
                diagnose=lambda: f"error={member.error!r} got={len(sink)}",
            )
        finally:
            await member.close()
        return [record for _, record in sink]

    return asyncio.run(go())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def where(env: dict[str, Any]) -> list[str]:
    url = env["url"]
    return [
        *("--app", env["app"], "--table", env["table"], "--region", "us-east-1"),
        *("--dynamodb-endpoint", url, "--kinesis-endpoint", url, "--sts-endpoint", url),
    ]


def listed(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str], stream: str, *home: str
) -> dict[str, dict[str, Any]]:
    code, out, err = run(
        capsys, "checkpoints", "list", "--stream", stream, "--json", *where(env), *home
    )
    assert code == 0, err
    return {shard["shard_id"]: shard for shard in json.loads(out)}


def kept_under(env: dict[str, Any]) -> set[str]:
    """The streams the table keeps checkpoint items under, for the app."""
    client = boto3.client("dynamodb", endpoint_url=env["url"], region_name="us-east-1")
    items = client.scan(TableName=env["table"], ConsistentRead=True)["Items"]
    prefix = f"check_point#{env['app']}#"
    return {i["pk"]["S"][len(prefix) :] for i in items if i["pk"]["S"].startswith(prefix)}


def last_by_shard(records: list[Record]) -> dict[str, str]:
    last: dict[str, str] = {}
    for record in records:
        last[record.shard_id] = record.sequence_number
    return last


def check_home(
    env: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    config: Config,
    place: str,
    home: list[str],
    shards: int,
) -> None:
    """What the command line given the members' home (``home``) shows and moves, for the
    stream the members read by name: the one of ``place`` (with ``shards`` shards)."""
    name, stream_arn = env["name"], env["arns"][place]
    records = read_by_name(config, name, put(env["clients"][place], name, place))
    assert {r.data.decode().split(":")[0] for r in records} == {place}
    checkpointed = last_by_shard(records)
    assert len(checkpointed) == shards
    assert kept_under(env) == {name}

    # Without the members' home, the command line takes the stream's ARN for another
    # account's or region's: kept under the ARN, where nothing is.
    code, _, err = run(capsys, "checkpoints", "list", "--stream", stream_arn, *where(env))
    assert code == 1 and "no checkpoints or shards known" in err, err

    # With it: by the name and by the ARN, the members' checkpoints, shown as given.
    for given in (name, stream_arn):
        shown = listed(env, capsys, given, *home)
        assert {s: v["sequence_number"] for s, v in shown.items()} == checkpointed
        assert {v["stream"] for v in shown.values()} == {given}
    code, out, err = run(capsys, "status", "--stream", stream_arn, "--json", *where(env), *home)
    assert code == 0, err
    (status,) = json.loads(out)["streams"]
    assert status["stream"] == stream_arn
    assert {s["shard_id"]: s["sequence_number"] for s in status["shards"]} == checkpointed

    # The name read where the members read it: that stream's shards (not the decoy's 3), all
    # read to their end.
    for given in (name, stream_arn):
        code, out, err = run(capsys, "lag", "--stream", given, "--json", *where(env), *home)
        assert code == 0, err
        lag = json.loads(out)
        assert sorted(row["shard_id"] for row in lag["shards"]) == sorted(checkpointed)
        assert {row["stream"] for row in lag["shards"]} == {given}
        assert lag["max_millis_behind"] == 0

    # Moved by the ARN: written under the plain name, which the members read. One shard is
    # set back to its first record, every other reset (read again from TRIM_HORIZON).
    first = {}
    for record in records:
        first.setdefault(record.shard_id, record)
    moved, *others = sorted(checkpointed)
    code, out, err = run(
        capsys,
        "checkpoints",
        "set",
        "--stream",
        stream_arn,
        "--shard",
        moved,
        "--sequence",
        first[moved].sequence_number,
        *where(env),
        *home,
    )
    assert code == 0, err
    assert out.startswith(f"{stream_arn}/{moved}: set to {first[moved].sequence_number}")
    for shard in others:
        code, _, err = run(
            capsys,
            "checkpoints",
            "reset",
            "--stream",
            stream_arn,
            "--shard",
            shard,
            "--force",
            *where(env),
            *home,
        )
        assert code == 0, err
    assert kept_under(env) == {name}
    shown = listed(env, capsys, name)
    assert shown[moved]["sequence_number"] == first[moved].sequence_number
    assert all(shown[s]["sequence_number"] is None for s in others)

    # The members read from there: the moved shard after its first record, the others whole.
    again = {
        r.data
        for r in records
        if r.shard_id in others or (r.shard_id == moved and r != first[moved])
    }
    reread = read_by_name(config, name, again)
    assert {r.data for r in reread} == again


def test_a_group_reading_through_role_arn_is_shown_and_moved_with_role_arn(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(
        env["url"], env["url"], env["app"], env["table"], role_arn=ROLE_B, sts_endpoint=env["url"]
    )
    setup_table(config)
    check_home(env, capsys, config, "b-us", ["--role-arn", ROLE_B], shards=2)


def test_a_group_reading_in_kinesis_region_is_shown_and_moved_with_kinesis_region(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(
        env["url"], env["url"], env["app"], env["table"], kinesis_region="eu-west-1"
    )
    setup_table(config)
    check_home(env, capsys, config, "a-eu", ["--kinesis-region", "eu-west-1"], shards=1)


def test_the_role_and_region_come_from_the_environment(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$KINESUMER_ROLE_ARN`` is ``--role-arn`` (what a deployment sets once beside
    ``$KINESUMER_APP``): the CLI then finds B's stream by its ARN under the plain name."""
    config = make_config(
        env["url"], env["url"], env["app"], env["table"], role_arn=ROLE_B, sts_endpoint=env["url"]
    )
    setup_table(config)
    name = env["name"]
    records = read_by_name(config, name, put(env["clients"]["b-us"], name, "b-us"))
    monkeypatch.setenv("KINESUMER_ROLE_ARN", ROLE_B)
    shown = listed(env, capsys, env["arns"]["b-us"])
    assert {s: v["sequence_number"] for s, v in shown.items()} == last_by_shard(records)


@pytest.mark.parametrize("given", ["role-arn", "account"])
def test_a_refused_role_is_told_in_the_option_that_gave_it(
    env: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    fault_proxy: Callable[[str], FaultProxy],
    given: str,
) -> None:
    """STS refuses the role (its trust policy changed): one line naming the account, the role
    and the option to check, not a Config field the user never set."""
    setup_table(make_config(env["url"], env["url"], env["app"], env["table"]))
    proxy = fault_proxy(env["url"])
    proxy.add_rule(Fault.landed_then_refused(), service="sts", operation="AssumeRole")
    if given == "role-arn":
        argv = ["--stream", env["name"], "--role-arn", ROLE_B]
        option = "check --role-arn"
    else:
        argv = ["--stream", env["arns"]["b-us"], "--account", f"{B}={ROLE_B}"]
        option = f"check --account {B}="
    code, _, err = run(capsys, "lag", *argv, *where(env), "--sts-endpoint", proxy.url)
    assert code == 1, err
    assert "Traceback" not in err and "Config." not in err
    assert f"cannot read the Kinesis streams of account {B}: sts:AssumeRole on {ROLE_B}" in err
    assert option in err
