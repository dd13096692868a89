"""The CLI with a DynamoDB table's stream ARN, on moto in server mode (it serves
``dynamodbstreams`` at DynamoDB's endpoint): ``consume`` prints its changes, ``status`` and
``checkpoints list`` show it, ``checkpoints set``/``reset``/``rewind`` move it, ``lag`` measures
it from ``ApproximateCreationDateTime`` by the service's ``Date``.

Timing: moto runs in this process, so its ``Date`` headers and its records' stamps are this
host's clock. The lag figure is bounded by the command's own start and end, as in
``test_cli_lag.py``: never a duration the test waited for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from support.group import make_config, setup_table
from support.table_streams import TableChanges, create_streamed_table, numbered, stream_records
from support.wait import wait_until

from kinesumer import cli
from kinesumer.dynamodb_streams import change

Names = Callable[[str], str]


@pytest.fixture
def g(moto_url: str, unique_name: Names) -> dict[str, Any]:
    table = unique_name("items")
    arn = create_streamed_table(moto_url, table)
    app, state = unique_name("app"), unique_name("state")
    setup_table(make_config(moto_url, moto_url, app, state))
    where = ["--app", app, "--table", state, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", moto_url]
    return {
        "url": moto_url,
        "arn": arn,
        "where": where,
        "kinesis": ["--kinesis-endpoint", moto_url],
        "changes": TableChanges(moto_url, table),
    }


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def consume(capsys: pytest.CaptureFixture[str], g: dict[str, Any], count: int) -> list[Any]:
    """``kinesumer consume --count`` on the table's stream: its JSON lines."""
    start = ["--initial-position", "TRIM_HORIZON", "--count", str(count)]
    out = run(capsys, "consume", *g["where"], *g["kinesis"], *start, g["arn"])
    return [json.loads(line) for line in out.splitlines()]


def put(g: dict[str, Any], items: range) -> None:
    for n in items:
        g["changes"].put(f"k{n}", **numbered(n))


def keys(lines: list[Any]) -> list[str]:
    return [change(line["data"]).keys["pk"] for line in lines]


def test_consume_prints_a_tables_changes_and_status_and_list_show_its_checkpoint(
    capsys: pytest.CaptureFixture[str], g: dict[str, Any]
) -> None:
    put(g, range(5))
    lines = consume(capsys, g, 3)
    assert keys(lines) == ["k0", "k1", "k2"]
    assert {line["stream"] for line in lines} == {g["arn"]}
    assert change(lines[0]["data"]).event_name == "INSERT"
    assert lines[0]["approximate_arrival_timestamp"] is not None

    status = run(capsys, "status", *g["where"])
    listed = run(capsys, "checkpoints", "list", *g["where"], "--stream", g["arn"])
    for out in (status, listed):
        assert f"stream {g['arn']}" in out
        assert lines[-1]["sequence_number"] in out
    assert keys(consume(capsys, g, 2)) == ["k3", "k4"]  # resumed after the checkpoint


def test_checkpoints_set_and_reset_move_a_tables_stream(
    capsys: pytest.CaptureFixture[str], g: dict[str, Any]
) -> None:
    put(g, range(4))
    first = consume(capsys, g, 4)
    shard = first[0]["shard_id"]
    common = [*g["where"], "--stream", g["arn"], "--shard", shard]
    out = run(capsys, "checkpoints", "set", *common, "--sequence", first[1]["sequence_number"])
    assert f"set to {first[1]['sequence_number']}" in out
    assert keys(consume(capsys, g, 2)) == ["k2", "k3"]

    run(capsys, "checkpoints", "reset", *common)
    assert keys(consume(capsys, g, 4)) == ["k0", "k1", "k2", "k3"]  # TRIM_HORIZON again


def test_lag_of_a_tables_stream_is_the_oldest_unread_changes_age_by_the_services_clock(
    capsys: pytest.CaptureFixture[str], g: dict[str, Any]
) -> None:
    put(g, range(4))
    consume(capsys, g, 1)
    unread = stream_records(g["url"], g["arn"])[1]
    created_ms = unread["dynamodb"]["ApproximateCreationDateTime"].timestamp() * 1000
    before = time.time() * 1000
    out = run(capsys, "lag", "--json", *g["where"], *g["kinesis"], "--stream", g["arn"])
    after = time.time() * 1000
    figure = json.loads(out)["streams"][g["arn"]]["max_millis_behind"]
    # The Date's second is taken at its end, the stamp as given: never below the true age, at
    # most a second of the Date (and AWS's rounding of the stamp) above it.
    assert before - created_ms - 1 <= figure <= after - created_ms + 1000 + 1

    consume(capsys, g, 3)
    out = run(capsys, "lag", "--json", *g["where"], *g["kinesis"], "--stream", g["arn"])
    assert json.loads(out)["max_millis_behind"] == 0  # every change checkpointed


def test_rewind_to_a_time_reads_a_tables_stream_from_that_seconds_first_change(
    capsys: pytest.CaptureFixture[str], g: dict[str, Any]
) -> None:
    put(g, range(3))
    consume(capsys, g, 3)
    last = stream_records(g["url"], g["arn"])[-1]["dynamodb"]["ApproximateCreationDateTime"]
    boundary_ms = (int(last.timestamp()) + 1) * 1000  # the next whole second
    wait_until(lambda: time.time() * 1000 >= boundary_ms, 10, "the clock past the boundary")
    put(g, range(3, 6))
    later = stream_records(g["url"], g["arn"])[3:]
    assert all(
        r["dynamodb"]["ApproximateCreationDateTime"].timestamp() * 1000 >= boundary_ms
        for r in later
    )
    # An instant within the second: DynamoDB Streams stamps changes by whole seconds, so the
    # rewind reads from the second's start (a change of that second is never skipped).
    within = datetime.fromtimestamp((boundary_ms + 400) / 1000, timezone.utc).isoformat()
    out = run(
        capsys,
        "checkpoints",
        "rewind",
        *g["where"],
        *g["kinesis"],
        "--stream",
        g["arn"],
        "--to-time",
        within,
    )
    floored = datetime.fromtimestamp(boundary_ms / 1000, timezone.utc)
    assert f"rewind to {floored.isoformat(timespec='milliseconds')}" in out
    assert keys(consume(capsys, g, 3)) == ["k3", "k4", "k5"]


def test_a_missing_tables_stream_is_named_as_such(
    capsys: pytest.CaptureFixture[str], g: dict[str, Any]
) -> None:
    gone = g["arn"].replace(":table/", ":table/gone-")
    code = cli.main(["lag", *g["where"], *g["kinesis"], "--stream", gone])
    _, err = capsys.readouterr()
    assert code != 0
    assert "DynamoDB table stream" in err and "LatestStreamArn" in err
    assert "kinesis_region" not in err
