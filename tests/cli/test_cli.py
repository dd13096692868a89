"""The ``kinesumer`` command against moto in server mode.

Most commands run in-process through :func:`kinesumer.cli.main` (fast, and their output is
captured); what depends on signals and process boundaries (consume stopped by SIGTERM, the
demo and its Ctrl-C) runs as subprocesses, each stopped by its own pid.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import boto3
import pytest
from support.cli import Running
from support.group import (
    create_stream,
    kinesis,
    make_config,
    put,
    recorded_starts,
    setup_table,
    state_store,
)
from support.signals import as_a_background_job, sigint_ignored, sigint_raises

from kinesumer import Kinesumer, cli
from kinesumer.aws import AwsClients, RequestStats
from kinesumer.cli import view
from kinesumer.kinesis.reader import SERVER_CLOCK_MARGIN_MS, KinesisReader
from kinesumer.models import ClientInfo
from kinesumer.signals import interrupt_on_sigterm, signals_ignored, stop_on_signals
from kinesumer.spark.source.driver.pins import LatestPins, local_now_ms
from kinesumer.statestore.dynamodb import DynamoDBStateStore, client_item

Names = Callable[[str], str]


@pytest.fixture
def g(moto_url: str, unique_name: Names) -> dict[str, Any]:
    """Names for one test's group, and the options every command needs to reach it."""
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("s")
    where = ["--app", app, "--table", table, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", moto_url]
    return {
        "url": moto_url,
        "app": app,
        "table": table,
        "stream": stream,
        "where": where,
        "consume": ["consume", *where, "--kinesis-endpoint", moto_url],
        "config": make_config(moto_url, moto_url, app, table),
    }


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def status_json(capsys: pytest.CaptureFixture[str], g: dict[str, Any]) -> dict[str, Any]:
    code, out, err = run(capsys, "status", "--json", *g["where"])
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


@pytest.fixture
def member(g: dict[str, Any]) -> Iterator[Callable[..., Kinesumer]]:
    """``member(client_id)``: a live group member in this process (its engine runs on its own
    thread), subscribed to the test's stream; closed gracefully at teardown."""
    started: list[Kinesumer] = []

    def start(client_id: str, **overrides: Any) -> Kinesumer:
        consumer = Kinesumer(g["config"].replace(client_id=client_id, **overrides))
        consumer.subscribe([g["stream"]])
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.close()


def poll_until(check: Callable[[], bool], timeout: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# -- consume ----------------------------------------------------------------------------------
def test_consume_prints_json_lines_with_text_or_base64_and_stops_after_count(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    client = kinesis(g["url"])
    payloads = [b"hello", "h\u00e9llo \u2603".encode(), b"\xff\xfe\x00binary"]
    for index, data in enumerate(payloads):
        client.put_record(StreamName=g["stream"], Data=data, PartitionKey=f"key-{index}")
    argv = [*g["consume"], "--initial-position", "TRIM_HORIZON", "--count", "3", g["stream"]]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line.get("data") for line in lines] == ["hello", "h\u00e9llo \u2603", None]
    assert base64.b64decode(lines[2]["data_b64"]) == payloads[2]
    assert "data" not in lines[2]
    first = lines[0]
    assert first["stream"] == g["stream"] and first["shard_id"] == "shardId-000000000000"
    assert first["partition_key"] == "key-0" and first["sub_sequence_number"] == 0
    assert first["sequence_number"].isdigit()
    assert datetime.fromisoformat(first["approximate_arrival_timestamp"]).tzinfo is not None
    # --count stopped cleanly: the three are checkpointed, the next run starts after them.
    client.put_record(StreamName=g["stream"], Data=b"fourth", PartitionKey="k")
    code, out, err = run(capsys, *argv[:-2], "1", g["stream"])
    assert code == 0, err
    assert [json.loads(line)["data"] for line in out.splitlines()] == ["fourth"]


def test_consume_stops_cleanly_on_sigterm(g: dict[str, Any]) -> None:
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 2)
    put(g["url"], g["stream"], 0, 10)
    argv = [sys.executable, "-m", "kinesumer.cli", *g["consume"], "--client-id", "cli-member"]
    proc = Running([*argv, "--initial-position", "TRIM_HORIZON", g["stream"]])
    try:
        proc.wait_for(lambda: len(proc.lines) >= 10, 60, "10 records")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.errors
    finally:
        proc.stop()
    printed = [json.loads(line) for line in proc.lines]
    assert sorted(int(r["data"]) for r in printed) == list(range(10))
    assert proc.errors == ""
    # The checkpoints are exactly the last record printed of each shard.
    last: dict[str, str] = {}
    for record in printed:
        last[record["shard_id"]] = record["sequence_number"]
    store = boto3.client("dynamodb", endpoint_url=g["url"], region_name="us-east-1")
    items = store.query(
        TableName=g["table"],
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{g['app']}#{g['stream']}"}},
    )["Items"]
    assert {i["sk"]["S"]: i["sequence_number"]["S"] for i in items} == last
    # ... and the member left the group.
    clients = store.query(
        TableName=g["table"],
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"client#{g['app']}"}},
    )["Items"]
    assert clients == []


# -- status -----------------------------------------------------------------------------------
def test_status_shows_leader_owned_shards_and_lag(
    g: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    member: Callable[..., Kinesumer],
) -> None:
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 2)
    put(g["url"], g["stream"], 0, 20)
    # The leader prunes dead members when it syncs shards: once at start, then not for a minute.
    member("m-live", shard_sync_interval=60.0)
    # A dead member with a lower id: listed, but neither live nor leader.
    dead = ClientInfo("a-dead", int(time.time() * 1000) - 60_000, frozenset([g["stream"]]))
    boto3.client("dynamodb", endpoint_url=g["url"], region_name="us-east-1").put_item(
        TableName=g["table"], Item=client_item(g["app"], dead, 3600)
    )

    # The checkpoints name the owner at the claim; the member's own item lists its shards at
    # its next heartbeat: wait for both (a CI run read the status between the two).
    last: list[dict[str, Any]] = []

    def settled() -> bool:
        doc = status_json(capsys, g)
        last[:] = [doc]
        mine = [m["shards"] for m in doc["members"] if m["client_id"] == "m-live"]
        return (
            len(mine) == 1
            and len(mine[0]) == 2
            and all(
                s["owner"] == "m-live" and s["millis_behind_latest"] is not None
                for s in doc["streams"][0]["shards"]
            )
        )

    poll_until(settled, what="both shards owned by m-live, with lag, in its item too")
    # The status that settled, not a second read: a heartbeat between two reads once showed
    # one shard in the member's item (a CI run, 2026-11-28).
    (doc,) = last
    assert doc["leader"] == "m-live"
    members = {m["client_id"]: m for m in doc["members"]}
    assert members["m-live"]["live"] and members["m-live"]["leader"]
    assert members["m-live"]["shards"] == [
        f"{g['stream']}/shardId-000000000000",
        f"{g['stream']}/shardId-000000000001",
    ]
    assert not members["a-dead"]["live"] and not members["a-dead"]["leader"]
    (stream,) = doc["streams"]
    assert stream["stream"] == g["stream"]
    assert [s["state"] for s in stream["shards"]] == ["owned", "owned"]
    assert all(isinstance(s["millis_behind_latest"], int) for s in stream["shards"])

    # The text form of a settled group. On a busy machine a heartbeat late by the member's 2 s
    # timeout fences it and a shard shows free until it claims it again: wait for that too.
    texts: list[str] = []

    def text_settled() -> bool:
        code, out, err = run(capsys, "status", *g["where"])
        assert code == 0, err
        texts[:] = [out]
        return out.count(" ms") >= 2  # a lag per shard

    poll_until(text_settled, what="the text status showing a lag for each shard")
    (out,) = texts
    assert "* m-live" in out and "1 live member" in out
    assert "a-dead" in out and "dead" in out
    assert f"stream {g['stream']}: 2 shards, 0 finished" in out
    # A member is live by the status's --client-timeout: with a tiny one, nobody is.
    code, out, err = run(capsys, "status", "--json", "--client-timeout", "0.001", *g["where"])
    assert code == 0, err
    assert json.loads(out)["leader"] is None


def test_status_watch_refreshes_until_interrupted(g: dict[str, Any]) -> None:
    setup_table(g["config"])
    argv = [sys.executable, "-m", "kinesumer.cli", "status", "--watch", "0.2", *g["where"]]
    proc = Running(argv)
    try:
        proc.wait_for(lambda: proc.output.count("refreshing every") >= 2, 30, "two refreshes")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        proc.stop()
    assert "no members registered" in proc.output


def test_status_watch_as_a_background_job_ignores_ctrl_c_and_stops_on_sigterm(
    g: dict[str, Any],
) -> None:
    """Started as a script's ``cmd &`` starts it (SIGINT ignored), the command keeps ignoring
    SIGINT, as the Unix convention wants (a Ctrl-C in the terminal is not for background jobs);
    SIGTERM ends it as Ctrl-C ends it in the foreground."""
    setup_table(g["config"])
    argv = [sys.executable, "-m", "kinesumer.cli", "status", "--watch", "0.2", *g["where"]]
    proc = Running(argv, sigint_ignored=True)
    try:
        proc.wait_for(lambda: proc.output.count("refreshing every") >= 2, 30, "two refreshes")
        proc.send_signal(signal.SIGINT)
        # Two refreshes after the signal: it was delivered (a handler runs at once) and ignored.
        after = proc.output.count("refreshing every") + 2
        proc.wait_for(lambda: proc.output.count("refreshing every") >= after, 30, "refreshes")
        assert proc.proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        proc.stop()


# -- checkpoints ------------------------------------------------------------------------------
def test_checkpoints_refuse_a_live_owner_unless_forced(
    g: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    member: Callable[..., Kinesumer],
) -> None:
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    put(g["url"], g["stream"], 0, 10)
    shard = "shardId-000000000000"
    consumer = member("owner-1")
    got = consumer.poll(max_records=10, timeout=30)  # returns once the 10 are in
    assert len(got) == 10
    sequences = [r.sequence_number for r in got]
    select = ["--stream", g["stream"], "--shard", shard]

    code, out, err = run(capsys, "checkpoints", "set", *g["where"], *select, "--sequence", "1")
    assert code == cli.EXIT_REFUSED
    assert "owned by live member 'owner-1'" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1 and out == ""
    code, out, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert code == cli.EXIT_REFUSED

    # --force takes the shard from its owner (new lease, no owner): its old lease is fenced off.
    before = _checkpoint(capsys, g)
    code, out, err = run(
        capsys, "checkpoints", "set", *g["where"], *select, "--sequence", sequences[4], "--force"
    )
    assert code == 0, err
    assert f"set to {sequences[4]}" in out and "taken from live member owner-1" in out
    after = _checkpoint(capsys, g)
    assert after["sequence_number"] == sequences[4] and after["lease"] > before["lease"]
    # The owner finds out at its next checkpoint write (refused: its lease is gone), drops what
    # it buffered, claims the shard again and reads on from the new position: records 5.. again.
    put(g["url"], g["stream"], 10, 5)
    later: list[bytes] = []
    deadline = time.monotonic() + 30
    while b"5" not in later or b"14" not in later[later.index(b"5") :]:
        assert time.monotonic() < deadline, f"no re-delivery from the new position: {later}"
        later += [r.data for r in consumer.poll(max_records=100, timeout=0.5)]
    again = later[later.index(b"5") :]
    assert again == [str(i).encode() for i in range(5, 15)], later
    # Claimed again after the forced move: a lease past the move's (before's + 1). Not past
    # ``after``'s: an idle owner notices a move within a commit interval, so ``after`` may
    # already show its new claim.
    final = _checkpoint(capsys, g)
    assert final["owner"] == "owner-1" and final["lease"] > before["lease"] + 1


def test_checkpoints_list_set_reset_when_nobody_owns_the_shard(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    put(g["url"], g["stream"], 0, 5)
    consume = [*g["consume"], "--initial-position", "TRIM_HORIZON", g["stream"]]
    code, out, _ = run(capsys, *consume[:-1], "--count", "5", g["stream"])
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(records) == 5
    shard = records[0]["shard_id"]
    select = ["--stream", g["stream"], "--shard", shard]

    code, out, err = run(capsys, "checkpoints", "list", *g["where"], "--stream", g["stream"])
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if shard in line)
    assert row[4] == records[-1]["sequence_number"], out  # SHARD STATE OWNER LEASE CHECKPOINT

    # set: resume right after record 1
    second = records[1]["sequence_number"]
    code, out, err = run(capsys, "checkpoints", "set", *g["where"], *select, "--sequence", second)
    assert code == 0, err
    code, out, _ = run(capsys, *consume[:-1], "--count", "3", g["stream"])
    assert [json.loads(line)["data"] for line in out.splitlines()] == ["2", "3", "4"]

    # reset: back to the initial position (TRIM_HORIZON for this member)
    code, out, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert code == 0, err
    assert "restarts at the initial position" in out
    assert _checkpoint(capsys, g)["sequence_number"] is None
    code, out, _ = run(capsys, *consume[:-1], "--count", "5", g["stream"])
    assert [json.loads(line)["data"] for line in out.splitlines()] == ["0", "1", "2", "3", "4"]

    # an unknown shard is refused, --force writes it; --all-shards resets every shard
    unknown = ["--stream", g["stream"], "--shard", "shardId-000000000099", "--sequence", "7"]
    code, _, err = run(capsys, "checkpoints", "set", *g["where"], *unknown)
    assert code == cli.EXIT_REFUSED and "not known" in err
    code, _, err = run(capsys, "checkpoints", "set", *g["where"], *unknown, "--force")
    assert code == 0, err
    code, out, err = run(
        capsys, "checkpoints", "reset", *g["where"], "--stream", g["stream"], "--all-shards"
    )
    assert code == 0 and out.count("reset (was") == 2, out


def test_checkpoint_write_loses_to_a_racing_claim(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the read and the write a member claims the shard: the conditional write fails
    with a clear message (exit 3) and the member's claim stands."""
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    put(g["url"], g["stream"], 0, 2)
    code, _, _ = run(
        capsys, *g["consume"], "--initial-position", "TRIM_HORIZON", "--count", "2", g["stream"]
    )
    assert code == 0
    real = view.stream_shards

    async def read_then_race(store: DynamoDBStateStore, stream: str, live: Any) -> Any:
        views = await real(store, stream, live)
        # The store keeps no member identity: a claim as "racer" is another member's claim.
        assert await store.claim(stream, views[0].shard_id, "racer", views[0].checkpoint)
        return views

    monkeypatch.setattr(view, "stream_shards", read_then_race)
    select = ["--stream", g["stream"], "--shard", "shardId-000000000000"]
    code, _, err = run(capsys, "checkpoints", "set", *g["where"], *select, "--sequence", "1")
    assert code == cli.EXIT_REFUSED
    assert "changed while it was being written" in err and "nothing written" in err
    monkeypatch.undo()
    assert _checkpoint(capsys, g)["owner"] == "racer"


async def _spark_latest_pin(config: Any, key: tuple[str, str], *, make: bool = False) -> Any:
    """The Spark source's LATEST pin of ``key`` (epoch ms or None), pinned first if ``make``:
    through the source's own code, as a query of the group would."""
    aws = AwsClients(config, RequestStats())
    await aws.open()
    try:
        store = DynamoDBStateStore(aws.dynamodb, config.dynamodb_table, config.app, RequestStats())
        pins = LatestPins(store)
        if not make:
            return await pins.started_at(key)
        reader = KinesisReader(aws.kinesis, RequestStats(), "us-east-1")

        async def opened_now() -> int:  # where a LATEST read opened now begins (Kinesis's clock)
            return (await reader.open_latest(*key))[1]

        return await pins.pin(key, opened_now, local_now_ms())
    finally:
        await aws.close()


def _read_at_latest(g: dict[str, Any], member: Callable[..., Kinesumer], shards: int) -> None:
    """A member of the group at ``LATEST`` (the default) until it recorded where its read of
    every shard began, then closed: what a first run of an app leaves in the table."""
    consumer = member("at-latest", initial_position="LATEST")
    poll_until(
        lambda: (
            (starts := recorded_starts(g["config"], g["stream"])) is not None
            and len(starts) == shards
            and None not in starts.values()
        ),
        what="the LATEST starts recorded",
    )
    consumer.close()


def test_reset_forgets_a_recorded_latest_start_so_a_backfill_reads_everything(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str], member: Callable[..., Kinesumer]
) -> None:
    """A run at LATEST records where it began; a later run at TRIM_HORIZON resumes there (the
    recorded start wins, as a position would), so records older than the start are never read.
    ``checkpoints reset --all-shards`` forgets the start (and the Spark source's LATEST pin):
    a TRIM_HORIZON member then reads every record."""
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 2)
    produced = put(g["url"], g["stream"], 0, 20)
    # Older than the 5 s the recorded start stays behind Kinesis's clock, and than the second
    # more it can lose to that clock's reading (an answer's Date header: whole seconds).
    put_at_ms = int(time.time() * 1000)
    poll_until(lambda: time.time() * 1000 > put_at_ms + SERVER_CLOCK_MARGIN_MS + 1500, 10)
    _read_at_latest(g, member, 2)
    starts = recorded_starts(g["config"], g["stream"])
    assert all(start is not None and start > put_at_ms for start in starts.values()), starts
    pinned = (g["stream"], "shardId-000000000000")
    assert asyncio.run(_spark_latest_pin(g["config"], pinned, make=True)) is not None

    code, out, err = run(
        capsys, "checkpoints", "reset", *g["where"], "--stream", g["stream"], "--all-shards"
    )
    assert code == 0, err
    backfill = member("backfill", initial_position="TRIM_HORIZON")
    got: list[bytes] = []

    def read_all() -> bool:
        got.extend(r.data for r in backfill.poll(max_records=100, timeout=0.2))
        return len(got) >= len(produced)

    poll_until(read_all, 20, f"the 20 records older than the recorded start (reset: {out})")
    assert sorted(got) == sorted(produced)
    assert out.count("reset (was started at ") == 2, out
    assert asyncio.run(_spark_latest_pin(g["config"], pinned)) is None


def test_status_and_list_show_where_a_shard_without_position_resumes(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str], member: Callable[..., Kinesumer]
) -> None:
    """Without a position, a shard resumes at its recorded LATEST start (or, for the Spark
    source's queries, at their LATEST pin): both tables and both JSON documents show it."""
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 2)
    _read_at_latest(g, member, 2)
    first, second = "shardId-000000000000", "shardId-000000000001"
    started = recorded_starts(g["config"], g["stream"])[first]
    assert started is not None
    select = ["--stream", g["stream"], "--shard", second]
    code, out, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert code == 0 and "reset (was started at" in out, (out, err)
    pinned = asyncio.run(_spark_latest_pin(g["config"], (g["stream"], second), make=True))
    shown = {
        first: f"started at {view.iso_time(started)} (LATEST)",
        second: f"Spark started at {view.iso_time(pinned)} (LATEST)",
    }

    for command in (["checkpoints", "list"], ["status"]):
        code, out, err = run(capsys, *command, *g["where"])
        assert code == 0, err
        for shard, text in shown.items():
            assert any(shard in line and text in line for line in out.splitlines()), out
    code, out, err = run(capsys, "checkpoints", "list", "--json", *g["where"])
    listed = {s["shard_id"]: s for s in json.loads(out)}
    (stream,) = status_json(capsys, g)["streams"]
    for shards in (listed, {s["shard_id"]: s for s in stream["shards"]}):
        assert shards[first]["started_at"] == view.iso_time(started)
        assert shards[first]["sequence_number"] is None
        assert shards[second]["started_at"] is None
        assert shards[second]["spark_latest_pin"] == view.iso_time(pinned)


def test_reset_of_a_recorded_start_loses_to_a_racing_claim(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forgetting a recorded LATEST start is fenced like a reset of a position: a member that
    claims the shard between the read and the write keeps it, and its start."""
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    shard = "shardId-000000000000"

    async def started_earlier() -> None:  # what a run at LATEST leaves, as its fetcher writes it
        async with state_store(g["config"]) as store:
            claimed = await store.claim(g["stream"], shard, "earlier", None)
            assert claimed is not None and await store.record_start(claimed, 2_000)
            assert await store.write_checkpoint(claimed, None, release=True)

    asyncio.run(started_earlier())
    real = view.stream_shards

    async def read_then_race(store: DynamoDBStateStore, stream: str, live: Any) -> Any:
        views = await real(store, stream, live)
        assert await store.claim(stream, views[0].shard_id, "racer", views[0].checkpoint)
        return views

    monkeypatch.setattr(view, "stream_shards", read_then_race)
    select = ["--stream", g["stream"], "--shard", shard]
    code, _, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert code == cli.EXIT_REFUSED and "changed while it was being written" in err
    monkeypatch.undo()
    code, out, err = run(capsys, "checkpoints", "list", "--json", *g["where"], *select)
    (after,) = json.loads(out)
    assert after["owner"] == "racer" and after["started_at"] == view.iso_time(2_000)


def _checkpoint(capsys: pytest.CaptureFixture[str], g: dict[str, Any]) -> dict[str, Any]:
    code, out, err = run(capsys, "checkpoints", "list", "--json", *g["where"])
    assert code == 0, err
    (shard,) = json.loads(out)
    return shard  # type: ignore[no-any-return]


# -- create-table, errors ---------------------------------------------------------------------
def test_create_table_is_idempotent(g: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--table", g["table"], "--region", "us-east-1", "--dynamodb-endpoint", g["url"]]
    code, out, _ = run(capsys, "create-table", *where)
    assert code == 0 and "created table" in out
    code, out, _ = run(capsys, "create-table", *where)
    assert code == 0 and "already exists" in out


def test_errors_are_one_line_with_documented_exit_codes(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    def one_line(argv: list[str], code: int, *fragments: str) -> None:
        got, out, err = run(capsys, *argv)
        assert got == code, (argv, out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        for fragment in fragments:
            assert fragment in err, err

    one_line(
        ["status", *g["where"]],
        cli.EXIT_ERROR,
        f"kinesumer: table '{g['table']}' does not exist in us-east-1 at {g['url']}: create it "
        f"with `kinesumer "
        f"create-table --table {g['table']} --region us-east-1 --dynamodb-endpoint {g['url']}`",
    )
    nothing_there = ["--app", "a", "--table", "t-x", "--dynamodb-endpoint", "http://127.0.0.1:9"]
    one_line(
        ["status", "--region", "us-east-1", *nothing_there],
        cli.EXIT_ERROR,
        'connect to the endpoint URL: "http://127.0.0.1:9/": is the endpoint right',
    )
    setup_table(g["config"])
    one_line([*g["consume"], "nope"], cli.EXIT_ERROR, "stream 'nope' does not exist")
    one_line(["checkpoints", "list", *g["where"]], cli.EXIT_ERROR, "no checkpoints")
    with pytest.raises(SystemExit) as usage:  # argparse: usage on stderr, exit 2
        cli.main(["consume", *g["where"]])
    assert usage.value.code == cli.EXIT_USAGE
    for bad in (["--count", "0"], ["--initial-position", "yesterday"]):
        with pytest.raises(SystemExit) as usage:
            cli.main([*g["consume"], *bad, g["stream"]])
        assert usage.value.code == cli.EXIT_USAGE
    capsys.readouterr()
    one_line(
        ["consume", *g["where"][2:], "--app", "bad name", "s"], cli.EXIT_USAGE, "--app: must be"
    )
    one_line(["checkpoints", "reset", *g["where"], "--stream", "s"], cli.EXIT_USAGE, "--all-shards")
    with pytest.raises(SystemExit):
        cli.main(["checkpoints", "set", *g["where"], "--stream", "s", "--shard", "x",
                  "--sequence", "12ab"])  # fmt: skip
    assert "decimal digits only" in capsys.readouterr().err
    # --debug: the traceback too
    code, _, err = run(
        capsys, "status", "--debug", *g["where"][:3], "missing-table", *g["where"][4:]
    )
    assert code == cli.EXIT_ERROR and "Traceback" in err and "does not exist" in err


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["status", "--help"], ["checkpoints", "set", "--help"]):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0
        assert "130  interrupted" in capsys.readouterr().out


# -- kinesumer.signals (the CLI's and the demo's handlers) -----------------------------------
def test_stop_on_signals_first_stops_second_interrupts_then_restores() -> None:
    stops: list[str] = []
    # As from a terminal, whatever the suite inherited (an ignored SIGINT stays ignored).
    with sigint_raises():
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        with pytest.raises(KeyboardInterrupt), stop_on_signals(stops.append):
            os.kill(os.getpid(), signal.SIGTERM)
            assert stops == ["SIGTERM"]  # the first one only asks to stop
            os.kill(os.getpid(), signal.SIGINT)  # the second one aborts
        assert stops == ["SIGTERM"]
        assert {s: signal.getsignal(s) for s in before} == before


def test_stop_on_signals_leaves_a_background_jobs_ignored_sigint_ignored() -> None:
    stops: list[str] = []
    with sigint_ignored(), stop_on_signals(stops.append):
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C meant for the foreground job
        assert stops == []
        os.kill(os.getpid(), signal.SIGTERM)  # kill: stops it gracefully
        assert stops == ["SIGTERM"]


#: Run as a background job (SIGINT ignored): starts one child as a terminal would, interrupts it.
_IGNORING_PARENT = """
import signal, subprocess, sys
from support.signals import as_from_a_terminal
assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN, "not started as a background job"
sleeper = "import time; print('sleeping', flush=True); time.sleep(60)"
child = subprocess.Popen(
    as_from_a_terminal([sys.executable, "-c", sleeper]),
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
)
try:
    assert child.stdout.readline() == "sleeping\\n"
    child.send_signal(signal.SIGINT)
    print(child.wait(30), "KeyboardInterrupt" in child.stderr.read())
finally:
    child.kill()
    child.wait()
"""


def test_a_child_started_as_from_a_terminal_is_interrupted_from_an_ignoring_parent() -> None:
    """What keeps the tests that interrupt a child green when the suite runs as a background
    job: the child's SIGINT disposition is set by its spawn, not inherited from the suite."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where support/ is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        as_a_background_job([sys.executable, "-c", _IGNORING_PARENT]),
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # A KeyboardInterrupt that ends Python ends it by SIGINT (the exit status a shell expects).
    assert done.stdout.split() == [str(-signal.SIGINT), "True"], done.stdout + done.stderr


def test_interrupt_on_sigterm_and_signals_ignored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), interrupt_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
    with signals_ignored():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_signal_helpers_do_nothing_outside_the_main_thread() -> None:
    seen: list[object] = []

    def install() -> None:
        with stop_on_signals(seen.append), interrupt_on_sigterm(), signals_ignored():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=install)
    thread.start()
    thread.join()
    assert seen == [before]


# -- demo -------------------------------------------------------------------------------------
def test_demo_end_to_end_loses_nothing() -> None:
    argv = [sys.executable, "-m", "kinesumer.cli", "demo", "--members", "2", "--shards", "2"]
    proc = Running([*argv, "--records", "300", "--rate", "300"], env=_demo_env())
    try:
        code = proc.wait(150)
    finally:
        proc.stop()
    assert code == 0, f"{proc.output}\n{proc.errors}"
    out = proc.output
    assert "  lost        0" in out and "result: OK, nothing lost" in out
    assert "SIGKILL member-1" in out and "started member-3" in out
    assert "produced    300 records" in out and "consumed    300 unique" in out


def test_demo_interrupted_stops_every_member_by_pid() -> None:
    argv = [sys.executable, "-m", "kinesumer.cli", "demo", "--members", "2", "--shards", "2"]
    proc = Running([*argv, "--records", "100000", "--rate", "50"], env=_demo_env())
    try:
        proc.wait_for(lambda: "group formed" in proc.output, 90, "the group")
        pids = [int(line.split("(pid ")[1].rstrip(")")) for line in proc.lines if "(pid " in line]
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == cli.EXIT_INTERRUPTED
    finally:
        proc.stop()
    assert "interrupted: stopped the member processes" in proc.output
    for pid in pids:
        poll_until(lambda pid=pid: not _exists(pid), 10, f"pid {pid} gone")  # type: ignore[misc]


def _demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_forced_reset_prints_the_owner_it_took_the_shard_from_escaped(
    g: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Owner ids come from the table (anyone with write access to it wrote them): what a
    command prints of them reaches the terminal escaped, as ``status`` shows them."""
    from kinesumer.models import Position
    from kinesumer.statestore.dynamodb.codecs import client_item, new_checkpoint_item

    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    hostile = "m-\x1b]0;pwned\x07-\u202eevil"
    shard = "shardId-000000000000"
    db = boto3.client("dynamodb", endpoint_url=g["url"], region_name="us-east-1")
    member_item = ClientInfo(client_id=hostile, last_update_ms=int(time.time() * 1000), beat=1)
    db.put_item(TableName=g["table"], Item=client_item(g["app"], member_item, 3600))
    position = Position("49590000000000000000000000000000000000000000000000000001", 0)
    checkpoint = new_checkpoint_item(g["app"], g["stream"], shard, position)
    checkpoint["owner"] = {"S": hostile}
    db.put_item(TableName=g["table"], Item=checkpoint)
    select = ["--stream", g["stream"], "--shard", shard, "--force"]
    code, out, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert code == 0, err
    assert "taken from live member m-\\x1b]0;pwned\\x07-\\u202eevil" in out, out
    assert "\x1b" not in out + err and "\u202e" not in out + err


@pytest.mark.parametrize("race_before", ["forget_latest_pin", "move_checkpoint"])
def test_a_reset_racing_a_query_never_says_done_while_the_old_start_still_wins(
    g: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    race_before: str,
) -> None:
    """A reset forgets two things, the Spark pin and the checkpoint's recorded start, in two
    conditional writes. A query of the group claiming the shard between (or before) them and
    recording the pin's instant as its start must make the reset fail and say so, never exit 0
    with the old start recorded again; run again, it forgets both."""
    setup_table(g["config"])
    create_stream(g["url"], g["stream"], 1)
    shard = "shardId-000000000000"
    key = (g["stream"], shard)
    began = int(time.time() * 1000) - 60_000

    async def a_query_ran() -> None:  # pinned, recorded, released the shard before a checkpoint
        aws = AwsClients(g["config"], RequestStats())
        await aws.open()
        try:
            store = DynamoDBStateStore(aws.dynamodb, g["table"], g["app"], RequestStats())
            pins = LatestPins(store)

            async def at_began() -> int:
                return began

            await pins.pin(key, at_began, began)
        finally:
            await aws.close()
        async with state_store(g["config"]) as store:
            claimed = await store.claim(g["stream"], shard, "query-1", None)
            assert claimed is not None and await store.record_start(claimed, began)
            assert await store.write_checkpoint(claimed, None, release=True)

    asyncio.run(a_query_ran())
    real = getattr(DynamoDBStateStore, race_before)
    raced: list[bool] = []

    async def racing(self: DynamoDBStateStore, *args: Any) -> bool:
        if not raced:  # another query of the group claims the shard and records its start
            raced.append(True)
            seen = (await self.get_checkpoints(g["stream"], [shard]))[shard]
            claimed = await self.claim(g["stream"], shard, "query-2", seen)
            assert claimed is not None and await self.record_start(claimed, began)
            assert await self.write_checkpoint(claimed, None, release=True)
        result: bool = await real(self, *args)
        return result

    monkeypatch.setattr(DynamoDBStateStore, race_before, racing)
    select = ["--stream", g["stream"], "--shard", shard]
    code, _, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert raced and code == cli.EXIT_REFUSED, err
    assert "run the command again" in err
    monkeypatch.undo()
    code, out, err = run(capsys, "checkpoints", "reset", *g["where"], *select)
    assert code == cli.EXIT_OK, err
    code, out, _ = run(capsys, "checkpoints", "list", "--json", *g["where"], *select)
    (after,) = json.loads(out)
    assert after["started_at"] is None and after["spark_latest_pin"] is None, after
