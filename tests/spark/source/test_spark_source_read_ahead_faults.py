"""Read-ahead under faults, without Spark: the planner, an executor worker's reads (one event
loop kept between batches, as a reused PySpark worker keeps it) and the ledger on kinesalite +
dynalite, the read-ahead files in a folder of the test's own.

What a fault must never do: change a batch (every record once, in order, whatever was found in
the folder) or fail a task that could have read for itself. What it may cost: reads."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.read_ahead import (
    background_done,
    data_files,
    one_shard_stream,
    put_aggregates,
    put_plain,
)
from support.spark_fakes import SoloMember

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.models import Position, Record
from kinesumer.runtime.loop_thread import LoopThread
from kinesumer.spark.arrow import records_to_arrow, table_to_records
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor import readahead
from kinesumer.spark.source.executor.read import read_with
from kinesumer.spark.source.executor.readahead import DEPTH, ReadAheadBatch, ReadAheadFiles
from kinesumer.spark.source.offsets import SourceOffset, Start
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.partition import ShardPartition


@pytest.fixture
def setup(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return one_shard_stream(kinesalite, dynalite, unique_name)


async def _attempts(
    count: int, clients: AwsClients, stats: RequestStats, p: ShardPartition, files: ReadAheadFiles
) -> list[list[Record]]:
    got = await asyncio.gather(*(read_with(clients, stats, p, files) for _ in range(count)))
    return [table_to_records(rows) for rows in got]


#: Called before each batch's read; may return the partition to read instead.
Hook = Callable[[int, ShardPartition, ReadAheadFiles], ShardPartition | None]


def read_batches(
    setup: dict[str, Any],
    root: Path,
    per_shard: int,
    count: int,
    before: Hook | None = None,
    attempts: int = 1,
) -> list[list[Record]]:
    """``count`` batches read one after another by one worker with read-ahead on (the default),
    ``before(i, partition, files)`` called before batch ``i``'s read (the read-ahead that the
    batch before it began has ended by then); ``attempts`` of each batch at once (a retry or a
    speculative copy racing the first), which must all give the same records. Fewer batches
    when the planner plans none (every record read)."""
    options = SourceOptions(
        config=setup["config"], streams=(setup["stream"],), max_records_per_shard=per_shard
    )
    assert options.read_ahead
    planner = Planner(options, lambda config: SoloMember(config))
    planner.initial_offset()
    loop = LoopThread("test-read-ahead-worker")
    stats = RequestStats()
    clients = AwsClients(setup["config"], stats)
    loop.run(clients.open())
    out: list[list[Record]] = []
    try:
        files = ReadAheadFiles(root, setup["config"].app, planner.query or "")
        end = SourceOffset(planner.query or "", 0).to_json()
        for i in range(count):
            following = planner.latest_offset(end, None)
            if following == end:
                break  # caught up: nothing to plan
            end = following
            (partition,) = planner.partitions(end)
            partition = pickle.loads(pickle.dumps(partition))
            assert partition.read_ahead
            if before is not None:
                partition = before(i, partition, files) or partition
            got = loop.run(_attempts(attempts, clients, stats, partition, files))
            assert all(g == got[0] for g in got)
            out.append(got[0])
            loop.run(background_done())
            planner.commit(end)
    finally:
        loop.run(clients.close())
        loop.stop()
        planner.close()
    return out


def test_batches_are_taken_from_the_read_ahead_exactly(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    produced = put_plain(setup, 35)
    seen: list[int] = []
    got = read_batches(
        setup, tmp_path / "ra", 10, 4, lambda i, p, f: seen.append(len(data_files(tmp_path / "ra")))
    )
    assert [len(b) for b in got] == [10, 10, 10, 5]
    assert [r.data for b in got for r in b] == produced
    # Read ahead: batches 1-3 found theirs waiting, DEPTH deep while records were behind.
    assert seen[1:] == [DEPTH, DEPTH, 1]
    assert data_files(tmp_path / "ra") == []  # and took them


def test_racing_attempts_of_each_batch_agree_with_one_taking_the_read_ahead(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """Two attempts of every batch at once: one takes the read-ahead, the other reads (or waits
    for the read-ahead under way, then reads); the ledger makes them agree."""
    produced = put_plain(setup, 45)
    got = read_batches(setup, tmp_path / "ra", 10, 5, attempts=2)
    assert [len(b) for b in got] == [10, 10, 10, 10, 5]
    assert [r.data for b in got for r in b] == produced
    assert data_files(tmp_path / "ra") == []


def test_limits_that_change_between_batches_take_only_a_prefix_of_the_read_ahead(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """A batch's limit differs from the one the read-ahead was read with (``max_records_per_
    trigger`` spread over another number of shards): the batch takes the first ``limit``
    records of it, or all of them; the next starts right after, and a replay agrees. A batch
    whose limit grew takes a read-ahead shorter than it (a batch may hold fewer records)."""
    produced = put_plain(setup, 60)
    limits = [10, 4, 12, 10, 3] + [20] * 10

    def limit(i: int, p: ShardPartition, files: ReadAheadFiles) -> ShardPartition:
        return dataclasses.replace(p, limit=limits[i])

    got = read_batches(setup, tmp_path / "ra", 10, len(limits), limit, attempts=2)
    assert [r.data for b in got for r in b] == produced
    assert all(len(b) <= n for b, n in zip(got, limits[: len(got)], strict=True))


def test_batches_inside_kpl_aggregates_are_taken_from_the_read_ahead_exactly(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """Batches of 7 over aggregates of 5: every batch after the first starts inside an
    aggregate (at a sub-sequence), so each read-ahead does too."""
    produced = put_aggregates(setup, aggregates=6, per=5)
    seen: list[int] = []
    got = read_batches(
        setup, tmp_path / "ra", 7, 5, lambda i, p, f: seen.append(len(data_files(tmp_path / "ra")))
    )
    assert [len(b) for b in got] == [7, 7, 7, 7, 2]
    assert [r.data for b in got for r in b] == produced
    assert all(seen[1:])  # each found its batch read ahead


def test_an_unreadable_read_ahead_file_is_read_past_not_a_task_failure(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """A ``.data`` file the worker cannot decode (a previous kinesumer version's layout, left
    by a restarted query with the same id, or a damaged file) once failed the task."""
    produced = put_plain(setup, 30)

    def spoil(i: int, p: ShardPartition, files: ReadAheadFiles) -> None:
        for path in data_files(tmp_path / "ra"):
            path.write_bytes(b"\x93\x01\x02")  # msgpack, but not a read-ahead

    got = read_batches(setup, tmp_path / "ra", 10, 3, spoil)
    assert [r.data for b in got for r in b] == produced


def test_a_broken_read_ahead_folder_is_read_past_not_a_task_failure(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """The query's folder gone wrong (here a file where the folder was: removed by a cleaner of
    /tmp and its name taken) once failed every task of the query on the host."""
    produced = put_plain(setup, 30)

    def break_folder(i: int, p: ShardPartition, files: ReadAheadFiles) -> None:
        if i == 1:
            folder = tmp_path / "ra" / _digest(setup["config"].app, p.query)
            shutil.rmtree(folder)
            folder.write_bytes(b"")

    got = read_batches(setup, tmp_path / "ra", 10, 3, break_folder)
    assert [r.data for b in got for r in b] == produced


def test_a_symlinked_root_turns_read_ahead_off(tmp_path: Path) -> None:
    """Another user can create ``/tmp/kinesumer-read-ahead-<uid>`` as a symlink to a folder of
    ours (mode 0700, ours): a check that follows it took the link for a private folder, and
    the worker then created folders and removed files wherever the link pointed."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    root = tmp_path / "root"
    root.symlink_to(target)
    files = ReadAheadFiles(root, "app", "query")
    assert not files.begin("s", "shardId-0", Position("1", 0))
    assert list(target.iterdir()) == []


def test_a_root_not_ours_is_warned_of_once_not_at_every_task(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "shared"
    root.mkdir(mode=0o777)
    root.chmod(0o777)  # as another user's would be to us: not private
    files = ReadAheadFiles(root, "app", "query")
    with caplog.at_level("WARNING", logger="kinesumer.spark.source"):
        for n in range(1, 4):
            assert asyncio.run(files.take("s", "shardId-0", Position(str(n), 0), 0.0)) is None
            assert not files.begin("s", "shardId-0", Position(str(n), 0))
    assert [r.getMessage() for r in caplog.records].count(
        f"read-ahead off: {root} is not this user's alone"
    ) == 1


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    return child.pid


def test_claims_of_killed_workers_do_not_hold_the_read_ahead_off(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """A worker killed while reading ahead leaves its ``.pending`` claim (pid inside); the
    batch's task then reads for itself and goes past it. Such claims once counted toward
    :data:`DEPTH` until swept 10 min later: two killed workers turned a shard's read-ahead off.
    Here two dead claims lie just behind every batch's start."""
    produced = put_plain(setup, 50)
    seen: list[int] = []

    def kill_claims(i: int, p: ShardPartition, files: ReadAheadFiles) -> None:
        seen.append(len(data_files(tmp_path / "ra")))
        after = p.start.after
        if after is None:
            return
        folder = tmp_path / "ra" / _digest(setup["config"].app, p.query)
        prefix = _digest(p.stream, p.shard_id)
        for back in (1, 2):
            name = f"{prefix}-{int(after.sequence_number) - back}-0.pending"
            (folder / name).write_text(str(_dead_pid()))

    got = read_batches(setup, tmp_path / "ra", 10, 5, kill_claims)
    assert [r.data for b in got for r in b] == produced
    # Batches 1-4 found theirs waiting, as with no claims left behind (before: [2, 1, 0, 0]).
    # A task that took its batch finds its end read ahead already and goes on past it, so the
    # read-ahead stays DEPTH deep (before that: 2, 1, 2, 1).
    assert seen[1:] == [DEPTH, DEPTH, DEPTH, 1]
    # and were removed once passed, not left to the sweep 10 min later (a worker Spark does
    # not reuse leaves one per batch and shard: the folder filled with them).
    assert list((tmp_path / "ra").glob("*/*.pending")) == []


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def test_a_read_ahead_left_by_a_stopped_query_is_not_taken_at_its_restart(tmp_path: Path) -> None:
    """A query stopped with read-ahead files waiting, restarted later from the same checkpoint
    (the same query id, so the same folder): they were taken, "caught up" included, though
    records had arrived since; a batch of every shard caught up ends an availableNow run, which
    then ended before reading what was there when it started (or, the stream re-created under
    the same name, delivered the old stream's records)."""
    files = ReadAheadFiles(tmp_path / "ra", "app", "query")
    after = Position("100", 0)
    assert files.begin("s", "shardId-0", after)
    record = Record("s", "shardId-0", "101", 0, "k", b"old", None)
    files.finish(
        "s", "shardId-0", ReadAheadBatch(after, records_to_arrow([record]), True, False, 0)
    )
    (data,) = data_files(tmp_path / "ra")
    an_hour_ago = time.time() - 3600
    os.utime(data, (an_hour_ago, an_hour_ago))
    assert asyncio.run(files.take("s", "shardId-0", after, 0.0)) is None
    assert data_files(tmp_path / "ra") == []


def test_a_read_ahead_of_a_previous_run_is_not_taken_even_when_recent(tmp_path: Path) -> None:
    """A run of availableNow every few minutes (a scheduled job): the previous run ended with
    a shard past the run's target but not caught up, its read-ahead went on to the tip ("caught
    up"); the next run took that file, its batch "caught up", and ended before reading what had
    arrived in between. A file another run read ahead is not taken (told by the driver's token
    for the run, not by comparing its clock with this host's)."""
    files = ReadAheadFiles(tmp_path / "ra", "app", "query")
    for n, run in enumerate(("previous", "this")):
        after = Position(str(100 * (n + 1)), 0)
        record = Record("s", "shardId-0", str(100 * (n + 1) + 1), 0, "k", b"then", None)
        assert files.begin("s", "shardId-0", after)
        files.finish(
            "s", "shardId-0", ReadAheadBatch(after, records_to_arrow([record]), True, False, 0), run
        )
        got = asyncio.run(files.take("s", "shardId-0", after, 0.0, "this"))
        assert (got is not None) is (run == "this")


def test_partitions_carry_their_run(setup: dict[str, Any]) -> None:
    from kinesumer.spark.source.datasource import KinesumerStreamReader

    options = SourceOptions(config=setup["config"], streams=(setup["stream"],))
    key = (setup["stream"], "shardId-000000000000")
    end = SourceOffset("q", 1, shards={key: Start(after=Position("1", 0))}).to_json()
    first = KinesumerStreamReader(options)
    (planned,) = first.partitions({}, end)
    assert planned.run
    assert first.partitions({}, end) == [planned]  # one run, one token
    (restarted,) = KinesumerStreamReader(options).partitions({}, end)
    assert restarted.run != planned.run
    assert pickle.loads(pickle.dumps(planned)) == planned


def test_a_stopped_querys_files_are_removed_by_another_querys_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a query's own read-ahead swept its folder: a query stopped for good left up to
    DEPTH batches per shard in /tmp (with the defaults, 10,000 records each) for ever. (The
    two queries would be two processes; here one, so its sweeps are not spaced out.)"""
    monkeypatch.setattr(readahead, "SWEEP_EVERY", 0.0)
    root = tmp_path / "ra"
    stopped = ReadAheadFiles(root, "app", "stopped-query")
    after = Position("100", 0)
    assert stopped.begin("s", "shardId-0", after)
    record = Record("s", "shardId-0", "101", 0, "k", b"x", None)
    stopped.finish(
        "s", "shardId-0", ReadAheadBatch(after, records_to_arrow([record]), False, False, 5)
    )
    (data,) = data_files(root)
    an_hour_ago = time.time() - 3600
    os.utime(data, (an_hour_ago, an_hour_ago))
    os.utime(data.parent, (an_hour_ago, an_hour_ago))
    running = ReadAheadFiles(root, "app", "running-query")
    assert running.begin("s", "shardId-0", after)
    assert not data.parent.exists()
    assert [f.name for f in root.iterdir()] == [_digest("app", "running-query")]


def test_a_process_sweeps_a_root_at_most_once_a_minute(tmp_path: Path) -> None:
    """A sweep stats every file of every query's folder, and a worker reading ahead begins once
    per batch and shard: files are stale after minutes, so one sweep a minute is enough."""
    root = tmp_path / "ra"
    files = ReadAheadFiles(root, "app", "query")
    assert files.begin("s", "shardId-0", Position("100", 0))  # sweeps (nothing to remove)
    old = root / "another" / "left.data"
    old.parent.mkdir()
    old.write_bytes(b"")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert files.begin("s", "shardId-1", Position("100", 0))
    assert old.exists()  # not swept again so soon
