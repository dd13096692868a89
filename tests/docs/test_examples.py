"""The programs in examples/ run, as a user would run them, against moto in server mode.

Each example is a subprocess (its own interpreter, configured only through the environment
variables its docstring documents, with endpoints given the standard boto3 way), stopped by its
own pid. Assertions are on what it printed and on what a later run sees: a clean stop must leave
checkpoints behind, so the next run delivers only new records.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import Running
from support.examples import EXAMPLES, run_example
from support.group import create_stream, kinesis_in_account_of, make_config, put, setup_table

from kinesumer import cli

DATA = re.compile(r"data=b'(\d+)'")


@pytest.fixture
def env(moto_url: str, unique_name: Callable[[str], str]) -> dict[str, Any]:
    """A stream name, an app and a created table; the environment the examples read."""
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("orders")
    setup_table(make_config(moto_url, moto_url, app, table))
    variables = {
        **os.environ,  # the fake credentials of conftest's session fixture
        "AWS_ENDPOINT_URL_KINESIS": moto_url,
        "AWS_ENDPOINT_URL_DYNAMODB": moto_url,
        "KINESUMER_APP": app,
        "KINESUMER_TABLE": table,
        "KINESUMER_STREAMS": stream,
        "KINESUMER_INITIAL_POSITION": "TRIM_HORIZON",
    }
    return {"url": moto_url, "app": app, "table": table, "stream": stream, "environ": variables}


def numbers(proc: Running) -> list[int]:
    return [int(m.group(1)) for line in proc.lines for m in DATA.finditer(line)]


def test_basic_reads_everything_and_a_break_keeps_the_position(env: dict[str, Any]) -> None:
    create_stream(env["url"], env["stream"], 2)
    put(env["url"], env["stream"], 0, 30)
    first = run_example("basic.py", env["environ"], "30")
    assert sorted(numbers(first)) == list(range(30))
    assert "done: 30 records" in first.output
    put(env["url"], env["stream"], 30, 5)
    second = run_example("basic.py", env["environ"], "5")
    assert sorted(numbers(second)) == list(range(30, 35))  # nothing delivered twice


def test_async_consumer(env: dict[str, Any]) -> None:
    create_stream(env["url"], env["stream"], 2)
    put(env["url"], env["stream"], 0, 20)
    proc = run_example("async_consumer.py", env["environ"], "20")
    assert sorted(numbers(proc)) == list(range(20))
    assert "leader=True" in proc.output  # the only member leads its group
    assert "done: 20 records" in proc.output


def test_manual_commit_commits_batches_and_resumes_after_them(env: dict[str, Any]) -> None:
    create_stream(env["url"], env["stream"], 1)
    put(env["url"], env["stream"], 0, 20)
    environ = {**env["environ"], "KINESUMER_BATCH": "7"}
    first = run_example("manual_commit.py", environ, "20")
    assert numbers(first) == list(range(20))  # one shard: in order
    sizes = [int(m.group(1)) for m in re.finditer(r"committed (\d+) records", first.output)]
    assert sum(sizes) == 20 and max(sizes) <= 7
    put(env["url"], env["stream"], 20, 3)
    second = run_example("manual_commit.py", environ, "3")
    assert numbers(second) == [20, 21, 22]


def test_cross_account_reads_through_the_assumed_role(env: dict[str, Any]) -> None:
    """moto keeps accounts apart by credentials: the stream is created with the role's
    credentials, in its account; the state table is in the caller's."""
    role = "arn:aws:iam::210987654321:role/orders-reader"
    other = kinesis_in_account_of(env["url"], role)
    other.create_stream(StreamName=env["stream"], ShardCount=1)
    other.get_waiter("stream_exists").wait(
        StreamName=env["stream"], WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    for i in range(10):
        other.put_record(StreamName=env["stream"], Data=str(i).encode(), PartitionKey="k")
    environ = {
        **env["environ"],
        "KINESUMER_ROLE_ARN": role,
        "KINESUMER_EXTERNAL_ID": "orders-etl-7f3a",
        "KINESUMER_STS_ENDPOINT": env["url"],
    }
    proc = run_example("cross_account.py", environ, "10")
    assert numbers(proc) == list(range(10))
    assert f"through {role}" in proc.output


def test_graceful_shutdown_on_sigterm_writes_checkpoints(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    create_stream(env["url"], env["stream"], 2)
    put(env["url"], env["stream"], 0, 20)
    script = [sys.executable, str(EXAMPLES / "graceful_shutdown.py")]

    def run_until(expected: set[int]) -> Running:
        proc = Running(script, env=env["environ"])
        try:
            proc.wait_for(lambda: set(numbers(proc)) >= expected, 60, f"records {expected}")
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        finally:
            proc.stop()
        assert code == 0, f"exit {code}:\n{proc.output}\n{proc.errors}"
        assert "stopped cleanly" in proc.output
        return proc

    first = run_until(set(range(20)))
    assert sorted(numbers(first)) == list(range(20))
    # Both shards have a checkpoint (seen through the CLI, as an operator would look).
    argv = ["checkpoints", "list", "--json", "--stream", env["stream"]]
    argv += ["--app", env["app"], "--table", env["table"], "--dynamodb-endpoint", env["url"]]
    assert cli.main(argv) == 0
    shards = json.loads(capsys.readouterr().out)
    assert len(shards) == 2 and all(s["sequence_number"] for s in shards), shards
    put(env["url"], env["stream"], 20, 20)
    second = run_until(set(range(20, 40)))
    assert sorted(numbers(second)) == list(range(20, 40))  # a restart re-delivers nothing


def test_exactly_once_dynamodb_counts_each_order_once(env: dict[str, Any]) -> None:
    """Totals committed with the checkpoint: a second run counts only the new orders."""
    import boto3

    dynamodb = boto3.client("dynamodb", endpoint_url=env["url"], region_name="us-east-1")
    dynamodb.create_table(
        TableName="order-totals",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client = boto3.client("kinesis", endpoint_url=env["url"], region_name="us-east-1")
    create_stream(env["url"], env["stream"], 2)

    def orders(start: int, count: int) -> None:
        for i in range(start, start + count):
            order = {"id": i, "customer": f"c-{i % 3}", "amount": i}
            client.put_record(StreamName=env["stream"], Data=json.dumps(order), PartitionKey=str(i))

    def totals() -> dict[str, tuple[int, int]]:
        items = dynamodb.scan(TableName="order-totals")["Items"]
        return {i["pk"]["S"]: (int(i["total"]["N"]), int(i["orders"]["N"])) for i in items}

    def expected(n: int) -> dict[str, tuple[int, int]]:
        return {f"c-{c}": (sum(range(c, n, 3)), len(range(c, n, 3))) for c in range(3)}

    orders(0, 30)
    first = run_example("exactly_once_dynamodb.py", env["environ"], "30")
    assert "done: 30 orders counted" in first.output
    assert totals() == expected(30)
    orders(30, 15)
    run_example("exactly_once_dynamodb.py", env["environ"], "15")
    assert totals() == expected(45)


def test_quickstart_runs_a_two_member_group_on_its_own_moto_server() -> None:
    """examples/quickstart.py as the README's quick start runs it: it starts its own moto
    server, and a graceful close halfway moves the closed member's shards to the other with
    nothing lost and nothing delivered twice."""
    environ = {**os.environ, "AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"}
    proc = run_example("quickstart.py", environ, "--records", "600", "--shards", "2", timeout=120)
    assert "stopping alpha gracefully" in proc.output
    assert "produced 600, consumed 600, lost 0, duplicates 0" in proc.output, proc.output


def test_every_example_is_run_by_a_test() -> None:
    """Every program in examples/ is named by a test file that runs it (docs/examples.md says
    which): a new example without a test fails here."""
    tests = Path(__file__).resolve().parents[1]
    sources = "\n".join(path.read_text() for path in tests.rglob("test_*.py"))
    for example in sorted(EXAMPLES.glob("*.py")):
        stem = example.stem
        # By file name, or by stem (the testing examples are parametrized so).
        named = f'"{example.name}"' in sources or f'"{stem}"' in sources
        assert named, f"examples/{example.name} is run by no test"
