"""The command line on Kinesis streams given by ARN, in two accounts and two regions of moto in
server mode (tests/support/accounts.py): three streams named alike, account A's (the
caller's) in us-east-1 and eu-west-1 and account B's through a role given with ``--account``.
Each command runs in this process through :func:`kinesumer.cli.main`, as a user types it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from support.accounts import A, B, arn, role_in_b, three_places
from support.group import make_config, setup_table

from kinesumer import cli

Names = Callable[[str], str]

ROLE_B = role_in_b("orders-reader")
PER_STREAM = 6


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    name, app, table = unique_name("orders"), unique_name("app"), unique_name("state")
    clients = three_places(moto_url, name, ROLE_B)
    setup_table(make_config(moto_url, moto_url, app, table))
    arns = {
        "a-us": arn("us-east-1", A, name),
        "a-eu": arn("eu-west-1", A, name),
        "b-us": arn("us-east-1", B, name),
    }
    put: dict[str, set[str]] = {}
    for place, client in clients.items():
        put[place] = {f"{place}:{n}" for n in range(PER_STREAM)}
        for data in sorted(put[place]):
            client.put_record(StreamName=name, Data=data.encode(), PartitionKey=data)
    where = ["--app", app, "--table", table, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", moto_url, "--kinesis-endpoint", moto_url]
    access = ["--sts-endpoint", moto_url, "--account", f"{B}={ROLE_B}"]
    return {
        "name": name,
        "app": app,
        "table": table,
        "url": moto_url,
        "clients": clients,
        "arns": arns,
        "put": put,
        "where": where,
        "access": access,
    }


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def consume_all(env: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    streams = list(env["arns"].values())
    count = str(PER_STREAM * len(streams))
    code, out, err = run(
        capsys,
        "consume",
        *streams,
        *env["where"],
        *env["access"],
        "--initial-position",
        "TRIM_HORIZON",
        "--count",
        count,
    )
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def checkpoints(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str], stream: str
) -> dict[str, Any]:
    code, out, err = run(
        capsys, "checkpoints", "list", "--stream", stream, "--json", *env["where"], *env["access"]
    )
    assert code == 0, err
    return {shard["shard_id"]: shard for shard in json.loads(out)}


def test_consume_status_lag_and_checkpoints_name_each_stream_as_given(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    arns = env["arns"]
    records = consume_all(env, capsys)
    by_stream: dict[str, set[str]] = {}
    for record in records:
        by_stream.setdefault(record["stream"], set()).add(record["data"])
    assert by_stream == {arns[place]: env["put"][place] for place in arns}

    # The home stream (A's us-east-1) is kept under its name, the others under their ARNs.
    client = boto3.client("dynamodb", endpoint_url=env["url"], region_name="us-east-1")
    items = client.scan(TableName=env["table"], ConsistentRead=True)["Items"]
    prefix = f"check_point#{env['app']}#"
    kept = {i["pk"]["S"][len(prefix) :] for i in items if i["pk"]["S"].startswith(prefix)}
    assert kept == {env["name"], arns["a-eu"], arns["b-us"]}

    given = sorted(arns.values())
    streams = [flag for stream in given for flag in ("--stream", stream)]
    code, out, err = run(capsys, "status", *streams, "--json", *env["where"], *env["access"])
    assert code == 0, err
    status = json.loads(out)
    assert [s["stream"] for s in status["streams"]] == given
    for entry in status["streams"]:
        assert entry["shards"] and all(s["sequence_number"] for s in entry["shards"])
        assert {s["stream"] for s in entry["shards"]} == {entry["stream"]}

    code, out, err = run(capsys, "lag", *streams, "--json", *env["where"], *env["access"])
    assert code == 0, err
    lag = json.loads(out)
    assert sorted(lag["streams"]) == given
    assert lag["max_millis_behind"] == 0
    assert {row["stream"] for row in lag["shards"]} == set(given)

    code, out, err = run(capsys, "lag", *streams, *env["where"], *env["access"])
    assert code == 0, err
    assert all(f"stream {stream}: lag 0 ms" in out for stream in given)

    for stream in given:
        code, out, err = run(
            capsys, "checkpoints", "list", "--stream", stream, *env["where"], *env["access"]
        )
        assert code == 0, err
        assert out.startswith(f"stream {stream}\n")
    # The home stream by name finds the same checkpoints as by its ARN.
    by_name = checkpoints(env, capsys, env["name"])
    by_arn = checkpoints(env, capsys, arns["a-us"])
    assert {k: v["sequence_number"] for k, v in by_name.items()} == {
        k: v["sequence_number"] for k, v in by_arn.items()
    }
    assert {v["stream"] for v in by_arn.values()} == {arns["a-us"]}


def test_rewind_and_set_by_arn_move_that_streams_shards_only(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    arns = env["arns"]
    consume_all(env, capsys)
    before = {place: checkpoints(env, capsys, stream) for place, stream in arns.items()}
    assert all(s["sequence_number"] for shards in before.values() for s in shards.values())

    code, out, err = run(
        capsys,
        "checkpoints",
        "rewind",
        "--stream",
        arns["b-us"],
        "--to",
        "trim-horizon",
        "--json",
        *env["where"],
        *env["access"],
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["stream"] == arns["b-us"]
    assert [s["shard_id"] for s in result["shards"] if s["moved"]] == sorted(before["b-us"])

    after = {place: checkpoints(env, capsys, stream) for place, stream in arns.items()}
    assert all(s["sequence_number"] is None for s in after["b-us"].values())
    for place in ("a-us", "a-eu"):
        assert {k: v["sequence_number"] for k, v in after[place].items()} == {
            k: v["sequence_number"] for k, v in before[place].items()
        }

    # And a set by the home ARN moves the checkpoint kept under the name.
    shard, seen = next(iter(before["a-us"].items()))
    code, out, err = run(
        capsys,
        "checkpoints",
        "set",
        "--stream",
        arns["a-us"],
        "--shard",
        shard,
        "--sequence",
        "1",
        *env["where"],
        *env["access"],
    )
    assert code == 0, err
    assert out.startswith(f"{arns['a-us']}/{shard}: set to 1 (was {seen['sequence_number']})")
    assert checkpoints(env, capsys, env["name"])[shard]["sequence_number"] == "1"


def test_deregister_consumer_by_arn_removes_only_that_streams_consumer(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    arns, clients, app = env["arns"], env["clients"], env["app"]
    for place in ("a-us", "b-us"):  # one name, two streams: only B's must go
        clients[place].register_stream_consumer(StreamARN=arns[place], ConsumerName=app)

    def consumers(place: str) -> list[str]:
        listed = clients[place].list_stream_consumers(StreamARN=arns[place])["Consumers"]
        return [c["ConsumerName"] for c in listed if c["ConsumerStatus"] != "DELETING"]

    assert consumers("b-us") == [app]
    code, out, err = run(
        capsys, "deregister-consumer", "--stream", arns["b-us"], *env["where"], *env["access"]
    )
    assert code == 0, err
    assert out.strip() == f"deregistered consumer {app!r} of stream {arns['b-us']!r}"
    assert consumers("b-us") == []
    assert consumers("a-us") == [app]


@pytest.mark.parametrize("command", ["consume", "lag", "deregister-consumer", "rewind"])
def test_an_account_without_access_is_a_named_error(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    stream = env["arns"]["b-us"]
    argv = {
        "consume": ["consume", stream, "--count", "1"],
        "lag": ["lag", "--stream", stream],
        "deregister-consumer": ["deregister-consumer", "--stream", stream],
        "rewind": ["checkpoints", "rewind", "--stream", stream, "--to", "latest"],
    }[command]
    # No --account: B is neither the caller's account nor given a role.
    code, _, err = run(capsys, *argv, *env["where"], "--sts-endpoint", env["url"])
    assert code == 1
    assert "Traceback" not in err
    assert f"cannot read the Kinesis streams of account {B}" in err
    assert f"--account {B}=arn:aws:iam::{B}:role/" in err


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("123=arn:aws:iam::123:role/r", "'123' is not a 12-digit account id"),
        (f"{B}", "expected ACCOUNT_ID=ROLE_ARN"),
        (f"{B}=arn:aws:iam::{A}:role/r", f"the role arn:aws:iam::{A}:role/r is in account {A};"),
        (f"{B}=not-a-role", "role_arn must be arn:aws:iam::"),
        (f"{B}={ROLE_B},external-id=!", "external_id must be"),
    ],
)
def test_a_bad_account_is_one_usage_message(
    capsys: pytest.CaptureFixture[str], value: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", "--app", "a", "--table", "tbl", "--account", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --account: " in err and says in err


def test_a_bad_endpoint_or_accounts_file_is_one_usage_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["lag", "--app", "a", "--table", "tbl", "--kinesis-endpoint-for", "eu=x"])
    assert "argument --kinesis-endpoint-for: expected REGION=URL" in capsys.readouterr().err
    bad = tmp_path / "accounts.json"
    bad.write_text(json.dumps({B: {"role": ROLE_B}}))
    with pytest.raises(SystemExit):
        cli.main(["lag", "--app", "a", "--table", "tbl", "--accounts-file", str(bad)])
    assert f"argument --accounts-file: {str(bad)!r}: account {B}" in capsys.readouterr().err


def test_accounts_file_and_external_id_reach_the_config(tmp_path: Any) -> None:
    from kinesumer.cli.options import group_config

    path = tmp_path / "accounts.json"
    path.write_text(json.dumps({B: {"role_arn": ROLE_B, "external_id": "from-file"}}))
    args = cli.build_parser().parse_args(
        [
            "consume",
            "orders",
            "--app",
            "a",
            "--table",
            "tbl",
            "--accounts-file",
            str(path),
            "--account",
            f"{A}=arn:aws:iam::{A}:role/r,external-id=xyz",
            "--kinesis-endpoint-for",
            "eu-west-1=http://127.0.0.1:4568",
        ]
    )
    config = group_config(args)
    assert config.accounts is not None
    assert {k: (v.role_arn, v.external_id) for k, v in config.accounts.items()} == {
        B: (ROLE_B, "from-file"),
        A: (f"arn:aws:iam::{A}:role/r", "xyz"),
    }
    assert config.kinesis_endpoints == {"eu-west-1": "http://127.0.0.1:4568"}


def test_lag_serve_probe_names_each_stream_as_given(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``lag --serve``'s probe (what /lag.json and /metrics show) on the three ARNs."""
    import asyncio

    from kinesumer.cli.lag_serve import GroupProbe
    from kinesumer.cli.options import group_config

    consume_all(env, capsys)
    given = sorted(env["arns"].values())
    streams = [flag for stream in given for flag in ("--stream", stream)]
    args = cli.build_parser().parse_args(["lag", *streams, *env["where"], *env["access"]])
    probe = GroupProbe(group_config(args), args.stream)

    async def once() -> Any:
        try:
            return await probe()
        finally:
            await probe.aclose()

    snapshot = asyncio.run(once())
    assert sorted(snapshot.figure.streams) == given
    assert snapshot.figure.max_millis_behind == 0


def pins(env: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> list[tuple[str, str, str]]:
    code, out, err = run(capsys, "pins", "--json", *env["where"][:8])
    assert code == 0, err
    return sorted((p["stream"], p["shard_id"], p["client_id"]) for p in json.loads(out))


def test_pin_and_unpin_take_a_home_arn_and_its_name_for_one_stream(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``orders`` and its home ARN are one stream (one state key): an unpin by either removes
    the pin made by the other, and a pin by one replaces the other's, never two pins of one
    shard to two members (which one the members obeyed would be an accident of order)."""
    name, home_arn = env["name"], env["arns"]["a-us"]
    shard = "shardId-000000000000"
    common = [*env["where"], *env["access"]]
    assert run(capsys, "pin", "--stream", name, "--shard", shard, "m1", *common)[0] == 0
    code, _, err = run(capsys, "unpin", "--stream", home_arn, "--shard", shard, *common)
    assert code == 0, err
    assert pins(env, capsys) == []

    assert run(capsys, "pin", "--stream", home_arn, "--shard", shard, "m1", *common)[0] == 0
    assert run(capsys, "pin", "--stream", name, "--shard", shard, "m2", *common)[0] == 0
    assert [(s, c) for _, s, c in pins(env, capsys)] == [(shard, "m2")]
    assert run(capsys, "unpin", "--stream", name, "--shard", shard, *common)[0] == 0
    assert pins(env, capsys) == []

    # Another account's stream of the same name is another stream: its pin stays.
    b_arn = env["arns"]["b-us"]
    assert run(capsys, "pin", "--stream", b_arn, "--shard", shard, "m3", *common)[0] == 0
    assert run(capsys, "unpin", "--stream", name, "--shard", shard, *common)[0] == 0
    assert pins(env, capsys) == [(b_arn, shard, "m3")]


@pytest.mark.parametrize("fault", ["given-twice", "no-access"])
def test_lag_serve_refuses_at_once_what_every_probe_would_fail_on(
    env: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    """A stream given twice (its name and its home ARN) or of an account with no access fails
    every probe alike: ``lag --serve`` says so and exits, as ``lag`` does, instead of serving
    a failed probe every interval."""
    from kinesumer.cli import lag_serve

    def started(*_: Any, **__: Any) -> Any:
        raise AssertionError("the server was started")

    monkeypatch.setattr(lag_serve, "LagServer", started)
    if fault == "given-twice":
        streams = ["--stream", env["name"], "--stream", env["arns"]["a-us"]]
        access, code, says = env["access"], 2, "are one stream"
    else:
        streams = ["--stream", env["arns"]["b-us"]]
        access, code, says = ["--sts-endpoint", env["url"]], 1, f"account {B}"
    got, _, err = run(capsys, "lag", "--serve", *streams, *env["where"], *access)
    assert (got, "Traceback" in err) == (code, False), err
    assert says in err
