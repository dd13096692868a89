"""Broadcast mode on kinesalite + dynalite: every member reads every shard, alone.

Kinesalite reports SHARD_END and real sequence numbers, so reshards and resumed positions are
tested as on AWS. Each test says which face it drives: the sync generator on threads, ``poll()``,
and the async iterator all go through the same broadcast engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from support.group import (
    Member,
    create_stream,
    datas,
    duplicates,
    kinesis,
    make_config,
    put,
    state_store,
)
from support.group import setup_table as create_table
from support.reshard import assert_per_key_order, key_of, split_and_merge
from support.wait import eventually, wait_until

from kinesumer import (
    AsyncKinesumer,
    Config,
    ConfigError,
    ConsumerClosedError,
    Kinesumer,
    Record,
    cli,
)
from kinesumer.aws import AwsClients, RequestStats
from kinesumer.consumer.base import engine_of
from kinesumer.statestore import DynamoDBStateStore
from kinesumer.statestore.base import SavedPosition

Names = Callable[[str], str]


@pytest.fixture
def env(kinesalite: Any, dynalite: Any, unique_name: Names) -> Iterator[dict[str, Any]]:
    config = make_config(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"), broadcast=True
    )
    create_table(config)
    yield {"url": kinesalite.url, "config": config, "stream": unique_name("s")}


def table_keys(config: Config) -> list[str]:
    """``pk`` of every item in the state table."""
    dynamodb = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    )
    items = dynamodb.scan(TableName=config.dynamodb_table)["Items"]
    return sorted(item["pk"]["S"] for item in items)


def caught_up(consumer: Kinesumer | AsyncKinesumer, shards: int) -> Callable[[], bool]:
    """Every shard had its first read at the tip: records put from now on are delivered."""

    def check() -> bool:
        statuses = consumer.stats().shards
        return len(statuses) == shards and all(s.caught_up for s in statuses)

    return check


class Reader:
    """A broadcast member iterating ``consume()`` on a thread of its own."""

    def __init__(self, config: Config, stream: str) -> None:
        self.consumer = Kinesumer(config)
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream: str) -> None:
        try:
            for record in self.consumer.consume([stream]):
                self.records.append(record)
        except BaseException as exc:  # surfaced to the test
            self.error = exc

    def close(self) -> None:
        self.consumer.close()
        self._thread.join(timeout=20)
        assert not self._thread.is_alive() and self.error is None, self.error


def test_three_members_each_receive_every_record(env: dict[str, Any]) -> None:
    """Sync face, three threads, a 4-shard stream from TRIM_HORIZON: each member gets all."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 4)
    produced = put(url, stream, 0, 200)
    readers = [Reader(env["config"].replace(client_id=f"m{i}"), stream) for i in range(3)]
    produced += put(url, stream, 200, 200)
    for reader in readers:
        wait_until(
            lambda r=reader: len(r.records) >= 400,  # type: ignore[misc]
            what="every record at every member",
            diagnose=lambda: str([len(r.records) for r in readers]),
        )
    stats = readers[0].consumer.stats()
    assert sorted(s.shard_id for s in stats.shards) == [f"shardId-00000000000{i}" for i in range(4)]
    assert {s.status for s in stats.shards} == {"active"}
    assert stats.checkpoint_writes == 0 and stats.live_members == ()
    for reader in readers:
        reader.close()
        got = [r.data for r in reader.records]
        assert sorted(got) == sorted(produced)
        assert len(got) == len(set(got))
    # No claims, checkpoints, client items or shard cache: nothing of the group was written.
    assert table_keys(env["config"]) == []


def test_latest_start_delivers_only_what_came_after(env: dict[str, Any]) -> None:
    """LATEST (the default): records put before the member started never arrive; poll()."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    put(url, stream, 0, 50)
    config = env["config"].replace(initial_position="LATEST", client_id="late")
    with Kinesumer(config) as consumer:
        consumer.subscribe([stream])
        wait_until(caught_up(consumer, 2), what="both shards read at the tip")
        produced = put(url, stream, 50, 50)
        got: list[Record] = []
        wait_until(lambda: len(got) >= 50 or bool(got.extend(consumer.poll(100, 0.2))))
    assert sorted(r.data for r in got) == sorted(produced)


async def test_resume_after_restart_loses_nothing_and_replays_nothing(
    env: dict[str, Any],
) -> None:
    """broadcast_resume: a restart with the same client id starts after what was committed,
    including on a shard that had no record at all before (it resumes from when the member
    first read it, so what arrived there while it was down is not lost)."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    config = env["config"].replace(
        initial_position="LATEST", client_id="cache-1", broadcast_resume=True, auto_commit=False
    )
    first = AsyncKinesumer(config)
    await first.subscribe([stream])
    await eventually(caught_up(first, 2), what="both shards read at the tip")
    # Run 1: records on shard 0 only (hash key 0); commit part of what was delivered.
    client = kinesis(url)
    for i in range(40):
        client.put_record(
            StreamName=stream, Data=str(i).encode(), PartitionKey="k", ExplicitHashKey="0"
        )
    delivered: list[Record] = []
    while len(delivered) < 25:
        delivered += await first.poll(25 - len(delivered), 1.0)
    await first.commit()
    committed = {r.data for r in delivered}
    delivered += await first.poll(10, 1.0)  # delivered after the commit: not processed
    await first.aclose(discard=True)  # only what was committed counts
    # While it is down: records on both shards.
    down = put(url, stream, 100, 60)
    second = AsyncKinesumer(config.replace(auto_commit=True))
    again: list[Record] = []

    async def consume() -> None:
        async for record in second.consume([stream]):
            again.append(record)
            if len(again) == 40 - 25 + 60:
                return

    await asyncio.wait_for(consume(), 30)
    await second.aclose()
    expected = {str(i).encode() for i in range(40)} - committed | set(down)
    assert sorted(r.data for r in again) == sorted(expected)
    assert not committed & {r.data for r in again}
    keys = set(table_keys(config))
    assert keys == {f"broadcast#{config.app}#cache-1"}  # its own items only


async def test_crash_then_restart_loses_nothing(env: dict[str, Any]) -> None:
    """A resume member killed without saving (abort): the restart delivers again at most what
    was processed since the last periodic save, and everything after it."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    config = env["config"].replace(client_id="crashy", broadcast_resume=True)
    produced = put(url, stream, 0, 60)
    first: list[tuple[str, Record]] = []
    member = Member(config, [stream], first).start()
    await eventually(lambda: len(first) >= 60, what="the first 60")
    await eventually(lambda: member.consumer.stats().checkpoint_writes >= 2, what="a save")
    await member.crash()
    produced += put(url, stream, 60, 30)
    second: list[tuple[str, Record]] = []
    restarted = Member(config, [stream], second).start()
    await eventually(lambda: {b"89"} <= set(datas(second)), what="the newest record")
    await eventually(lambda: len(set(datas(first + second))) == 90, what="all 90")
    await restarted.close()
    assert sorted(set(datas(first + second))) == sorted(produced)
    assert duplicates(second) == {}
    assert {r.data for _, r in second} >= {str(i).encode() for i in range(60, 90)}


async def test_older_session_of_a_client_id_cannot_overwrite_a_newer(env: dict[str, Any]) -> None:
    config = env["config"]
    aws = AwsClients(config, RequestStats())
    await aws.open()
    try:
        store = DynamoDBStateStore(aws.dynamodb, config.dynamodb_table, config.app, RequestStats())
        old = await store.open_broadcast_session("twin")
        new = await store.open_broadcast_session("twin")
        assert new > old
        saved = SavedPosition("s", "shardId-0", started_at_ms=1)
        assert await store.save_broadcast_position("twin", old, saved)  # nobody newer yet
        assert await store.save_broadcast_position("twin", new, saved)
        assert not await store.save_broadcast_position("twin", old, saved)
        assert await store.broadcast_positions("twin") == {("s", "shardId-0"): saved}
    finally:
        await aws.close()


async def test_run_handlers_under_broadcast_save_each_members_positions(
    env: dict[str, Any],
) -> None:
    """run() with per-key concurrency on two broadcast members: each handles every record, and
    closing saves each member's own positions at the end of every shard it handled."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    produced = put(url, stream, 0, 100, key_of)
    config = env["config"]
    members = [Kinesumer(config.replace(client_id=f"h{i}", broadcast_resume=True)) for i in (0, 1)]
    handled: list[list[Record]] = [[], []]
    threads = [
        threading.Thread(
            target=member.run,
            args=([stream], got.append),
            kwargs={"concurrency": 8, "ordering": "key"},
            daemon=True,
        )
        for member, got in zip(members, handled, strict=True)
    ]
    for thread in threads:
        thread.start()
    await eventually(lambda: all(len(got) >= 100 for got in handled), what="every record twice")
    for member, thread in zip(members, threads, strict=True):
        await asyncio.to_thread(member.close)
        await asyncio.to_thread(thread.join, 20)
        assert not thread.is_alive()
    async with state_store(config) as store:
        for member, got in zip(members, handled, strict=True):
            assert sorted(r.data for r in got) == sorted(produced)
            last = {}
            for record in got:
                seq = max(int(record.sequence_number), last.get(record.shard_id, 0))
                last[record.shard_id] = seq
            saved = await store.broadcast_positions(member.client_id)
            assert {
                shard: int(s.position.sequence_number)
                for (_, shard), s in saved.items()
                if s.position is not None
            } == last
    # Handlers write nothing of the group either: only the members' own position items.
    assert table_keys(config) and all(k.startswith("broadcast#") for k in table_keys(config))


async def test_split_and_merge_while_consuming(env: dict[str, Any]) -> None:
    """Async face, three members from LATEST: the children born after they started are read
    from TRIM_HORIZON once each member drained their parents; every record once per member, in
    per-key order."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 3)
    sinks: list[list[tuple[str, Record]]] = [[], [], []]
    config = env["config"].replace(initial_position="LATEST")
    members = [
        Member(config.replace(client_id=f"b{i}"), [stream], sink).start()
        for i, sink in enumerate(sinks)
    ]
    for member in members:
        await eventually(lambda m=member: caught_up(m.consumer, 3)(), what="at the tip")  # type: ignore[misc]
    produced = put(url, stream, 0, 150, key_of)
    split_and_merge(url, stream)
    produced += put(url, stream, 150, 150, key_of)
    for sink in sinks:
        await eventually(
            lambda s=sink: len(s) >= 300,  # type: ignore[misc]
            what="every record at every member",
            diagnose=lambda: str([len(s) for s in sinks]),
        )
    ended = {s.shard_id for s in members[0].consumer.stats().shards}
    for member in members:
        await member.close()
        assert member.error is None
    for sink in sinks:
        assert sorted(datas(sink)) == sorted(produced)
        assert duplicates(sink) == {}
        assert_per_key_order(sink)
    # The three parents were drained and dropped; the three children are read.
    assert ended == {f"shardId-00000000000{i}" for i in range(3, 6)}


async def test_started_after_a_reshard_reads_parents_first(env: dict[str, Any]) -> None:
    """From TRIM_HORIZON after a split and a merge: the children wait until this member drained
    their parents (no other member or checkpoint says so), then every record arrives in per-key
    order."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 3)
    produced = put(url, stream, 0, 150, key_of)
    split_and_merge(url, stream)
    produced += put(url, stream, 150, 150, key_of)
    sink: list[tuple[str, Record]] = []
    # Small reads keep the parents busy for a while: a child read too early would interleave.
    config = env["config"].replace(client_id="after", scan_limit=10)
    member = Member(config, [stream], sink).start()
    await eventually(lambda: len(sink) >= 300, what="every record")
    await member.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    assert_per_key_order(sink)


def test_cli_consume_broadcast(env: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """``kinesumer consume --broadcast``: two runs print every record each; ``--resume`` needs
    ``--client-id``."""
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 2)
    produced = put(url, stream, 0, 20)
    where = ["--app", config.app, "--table", config.dynamodb_table, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", config.dynamodb_endpoint, "--kinesis-endpoint", url]
    argv = ["consume", *where, "--broadcast", "--initial-position", "TRIM_HORIZON"]
    for _ in range(2):  # nothing checkpointed for the group: the second run prints them again
        assert cli.main([*argv, "--count", "20", stream]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert sorted(json.loads(line)["data"].encode() for line in lines) == sorted(produced)
    assert cli.main([*argv, "--resume", stream]) == 2
    assert "--resume: " in capsys.readouterr().err


async def test_refresh_moves_to_other_streams(env: dict[str, Any], unique_name: Names) -> None:
    """refresh(): the dropped stream's shards stop, the new stream's shards start (resume mode:
    from what this member saved when it read that stream before)."""
    url, first, second = env["url"], env["stream"], unique_name("s")
    create_stream(url, first, 1)
    create_stream(url, second, 2)
    config = env["config"].replace(client_id="mover", broadcast_resume=True, auto_commit=False)
    consumer = AsyncKinesumer(config)
    await consumer.subscribe([first, second])
    produced = put(url, second, 0, 30)
    got: list[Record] = []
    while len(got) < 30:
        got += await consumer.poll(30, 1.0)
    await consumer.commit()
    await consumer.refresh([first])
    await eventually(lambda: {s.stream for s in consumer.stats().shards} == {first})
    later = put(url, second, 30, 10)
    await consumer.refresh([first, second])
    again: list[Record] = []
    while len(again) < 10:
        again += await consumer.poll(10, 1.0)
    await consumer.aclose()
    assert sorted(r.data for r in got) == sorted(produced)
    assert sorted(r.data for r in again) == sorted(later)


async def test_close_during_a_refresh(env: dict[str, Any], unique_name: Names) -> None:
    """close() while refresh() waits on AWS: the refresh raises ConsumerClosedError (not the
    closed client's error) and starts no shard."""
    url, first, second = env["url"], env["stream"], unique_name("s")
    create_stream(url, first, 1)
    create_stream(url, second, 1)
    consumer = AsyncKinesumer(env["config"].replace(client_id="closer"))
    await consumer.subscribe([first])
    engine = engine_of(consumer)
    real, gate, waiting = engine.reader.check_stream, asyncio.Event(), asyncio.Event()

    async def held(stream: str) -> None:
        waiting.set()
        await gate.wait()
        await real(stream)

    engine.reader.check_stream = held  # type: ignore[method-assign]
    refresh = asyncio.ensure_future(consumer.refresh([first, second]))
    await asyncio.wait_for(waiting.wait(), 10)
    await consumer.aclose()
    gate.set()
    with pytest.raises(ConsumerClosedError):
        await refresh
    assert second not in {stream for stream, _ in engine.leases}


def test_example_broadcast_cache(env: dict[str, Any]) -> None:
    """examples/broadcast_cache.py: two copies at once each drop every key; with a client id a
    restarted copy resumes after the last key it handled."""
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 1)
    client = kinesis(url)
    for key in ("item-1", "item-2", "item-3"):
        client.put_record(StreamName=stream, Data=key.encode(), PartitionKey=key)
    environ = {
        **os.environ,
        "AWS_ENDPOINT_URL_KINESIS": url,
        "AWS_ENDPOINT_URL_DYNAMODB": config.dynamodb_endpoint or "",
        "KINESUMER_APP": config.app,
        "KINESUMER_TABLE": config.dynamodb_table,
        "KINESUMER_STREAMS": stream,
        "KINESUMER_INITIAL_POSITION": "TRIM_HORIZON",
    }
    script = str(Path(__file__).resolve().parents[2] / "examples" / "broadcast_cache.py")

    def start(count: int, **more: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, script, str(count)],
            env={**environ, **more},
            stdout=subprocess.PIPE,
            text=True,
        )

    def invalidated(proc: subprocess.Popen[str]) -> list[str]:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        return [line.split()[1] for line in out.splitlines() if line.startswith("invalidated")]

    copies = [start(3), start(3)]
    assert [invalidated(p) for p in copies] == [["item-1", "item-2", "item-3"]] * 2
    assert invalidated(start(2, KINESUMER_CLIENT_ID="cache-a")) == ["item-1", "item-2"]
    assert invalidated(start(1, KINESUMER_CLIENT_ID="cache-a")) == ["item-3"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"broadcast_resume": True, "client_id": "x"}, "broadcast_resume"),  # without broadcast
        ({"broadcast": True, "broadcast_resume": True}, "broadcast_resume"),  # no client_id
        ({"broadcast": "yes"}, "broadcast"),
        ({"broadcast": True, "broadcast_resume": 1, "client_id": "x"}, "broadcast_resume"),
    ],
)
def test_config_validation(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Config(app="a", dynamodb_table="table", **fields)
    assert raised.value.field == named
