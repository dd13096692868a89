"""Read-ahead (kinesumer.spark.source.executor.readahead): an executor that took a full batch from a
shard reads the shard's next batches in the background and leaves them in files on its host, which
the next batches' tasks take instead of reading.

First the files alone (a temporary root; plain Python): what is left is what is taken, once;
a task waits for a read-ahead under way but not for a killed worker's; a read-ahead that comes
too late, twice, or past the depth is not made; a miss turns the shard cold; a root another
user could write to is never used. Then the executor's path on kinesalite + dynalite, on a
worker's long-lived loop as in Spark: every record once and in order through batches taken
from read-ahead, each batch replayable exactly from the stream, and a smaller limit taking a
prefix (KPL aggregates split between batches: test_spark_source_read_ahead_faults.py)."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow
import pytest
from support.read_ahead import Worker, data_files, one_shard_stream, put_plain
from support.spark_fakes import SoloMember
from support.wait import wait_until

from kinesumer.config import Config
from kinesumer.models import Position, Record
from kinesumer.spark.arrow import arrow_schema, records_to_arrow, table_to_records
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor import read as executor
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.executor.readahead import DEPTH, ReadAheadBatch, ReadAheadFiles
from kinesumer.spark.source.executor.shard_read import ShardRangeReader
from kinesumer.spark.source.ledger import LedgerEntry
from kinesumer.spark.source.offsets import SourceOffset, Start
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.partition import ShardPartition


@pytest.fixture
def setup(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return one_shard_stream(kinesalite, dynalite, unique_name)


STREAM, SHARD = "s", "shardId-000000000000"


def record(seq: int, sub: int = 0, arrival: datetime | None = None) -> Record:
    return Record(STREAM, SHARD, str(seq), sub, f"k{seq}", bytes([seq % 256]) * 3, arrival)


def at(seq: int, sub: int = 0) -> Position:
    return Position(str(seq), sub)


@pytest.fixture
def files(tmp_path: Path) -> ReadAheadFiles:
    return ReadAheadFiles(tmp_path / "root", "app", "query")


def kinds(tmp_path: Path, suffix: str) -> list[Path]:
    return list((tmp_path / "root").rglob(f"*{suffix}"))


def leave(files: ReadAheadFiles, after: Position, records: list[Record]) -> None:
    assert files.begin(STREAM, SHARD, after)
    files.finish(STREAM, SHARD, ReadAheadBatch(after, records_to_arrow(records), False, False, 5))


def take(files: ReadAheadFiles, after: Position, wait: float = 0.0) -> ReadAheadBatch | None:
    return asyncio.run(files.take(STREAM, SHARD, after, wait))


# -- the files alone ---------------------------------------------------------------------------
def test_records_left_come_back_exactly_and_only_once(files: ReadAheadFiles) -> None:
    arrival = datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=timezone.utc)
    records = [record(11, 0, arrival), record(11, 1, arrival), record(12, 0, None)]
    leave(files, at(10), records)
    got = take(files, at(10))
    assert got is not None and got.records == records and got.millis_behind == 5
    assert take(files, at(10)) is None  # taken: a second attempt of the batch reads itself
    assert take(files, at(11)) is None  # nothing left from another start


#: Per limit: the end, count, caught up and latest arrival (epoch ms) a read of that limit
#: forms from the records of the test below.
FORMED = {
    1: (at(11), 1, False, 1767225602345),
    3: (at(12), 3, False, 1767225609001),  # the latest is not the last; one has none
    5: (at(14), 5, True, 1767225609001),
    6: (at(14), 5, True, 1767225609001),
}


@pytest.mark.parametrize("limit", sorted(FORMED))
def test_a_batch_formed_from_read_ahead_is_the_batch_a_read_would_form(
    files: ReadAheadFiles, limit: int
) -> None:
    """The task slices the Arrow it took from the file and derives its ledger entry from the
    columns; a read forms both from records. Same rows (Spark's schema, exactly) and the same
    entry, with KPL sub-sequences, arrivals out of order and records without one."""
    config = Config(app="app", region="us-east-1", dynamodb_table="state")
    partition = ShardPartition(
        config, "q", 2, STREAM, SHARD, Start(after=at(10)), limit, "o", 5.0, 3600
    )
    utc = timezone.utc
    records = [
        record(11, 0, datetime(2026, 1, 1, 0, 0, 2, 345000, tzinfo=utc)),
        record(11, 1, datetime(2026, 1, 1, 0, 0, 9, 1000, tzinfo=utc)),
        record(12, 0, None),
        record(13, 0, datetime(2026, 1, 1, 0, 0, 5, tzinfo=utc)),
        record(14, 0, datetime(2026, 1, 1, 0, 0, 1, 999000, tzinfo=utc)),
    ]
    assert files.begin(STREAM, SHARD, at(10))
    files.finish(STREAM, SHARD, ReadAheadBatch(at(10), records_to_arrow(records), True, False, 0))
    ahead = take(files, at(10))
    assert ahead is not None
    rows, entry = ShardRangeReader(None, partition).from_read_ahead(ahead)  # type: ignore[arg-type]
    end, count, caught_up, last_arrival_ms = FORMED[limit]
    assert entry == LedgerEntry(
        2, STREAM, SHARD, end, count, caught_up, False, last_arrival_ms, "o", 0, 0
    )
    assert table_to_records(rows) == records[:limit]
    batches = rows.to_batches()
    assert all(b.schema.equals(arrow_schema(), check_metadata=True) for b in batches)
    assert pyarrow.Table.from_batches(batches).equals(records_to_arrow(records[:limit]))


def test_a_task_waits_for_a_read_ahead_under_way(files: ReadAheadFiles) -> None:
    assert files.begin(STREAM, SHARD, at(10))
    records = [record(11)]
    finisher = threading.Timer(
        0.3,
        files.finish,
        (STREAM, SHARD, ReadAheadBatch(at(10), records_to_arrow(records), True, False, 0)),
    )
    finisher.start()
    got = take(files, at(10), wait=30.0)
    finisher.join()
    assert got is not None and got.records == records and got.caught_up


def test_a_killed_workers_claim_is_not_waited_for(files: ReadAheadFiles, tmp_path: Path) -> None:
    assert files.begin(STREAM, SHARD, at(10))
    dead = subprocess.Popen(["true"])
    dead.wait()
    (pending,) = kinds(tmp_path, ".pending")
    pending.write_text(str(dead.pid))
    # With a live claimant this would wait 60 s; the test's own bound only catches a hang.
    got = asyncio.run(asyncio.wait_for(files.take(STREAM, SHARD, at(10), 60.0), 20.0))
    assert got is None


def test_a_claim_whose_pid_was_never_written_is_not_waited_for(
    files: ReadAheadFiles, tmp_path: Path
) -> None:
    """A worker killed between creating its claim and writing its pid leaves an empty claim:
    read as pid 0, and ``os.kill(0, 0)`` signals this process's own group and succeeds, so it
    counted as alive and every task of that start waited for it."""
    assert files.begin(STREAM, SHARD, at(10))
    (pending,) = kinds(tmp_path, ".pending")
    pending.write_text("")
    os.utime(pending, (time.time() - 60, time.time() - 60))
    got = asyncio.run(asyncio.wait_for(files.take(STREAM, SHARD, at(10), 60.0), 20.0))
    assert got is None


def test_no_read_ahead_where_a_task_already_started_or_one_was_made(
    files: ReadAheadFiles,
) -> None:
    assert take(files, at(20)) is None  # a task started the shard at 20
    assert not files.begin(STREAM, SHARD, at(10))  # too late: the tasks are past it
    assert not files.begin(STREAM, SHARD, at(20))
    leave(files, at(30), [record(31)])
    assert not files.begin(STREAM, SHARD, at(30))  # made already (its data is there)
    assert files.begin(STREAM, SHARD, at(40))  # further on: fine
    assert not files.begin(STREAM, SHARD, at(40))  # claimed by another worker


def test_read_ahead_stops_at_its_depth(files: ReadAheadFiles) -> None:
    for n in range(DEPTH):
        leave(files, at(10 * (n + 1)), [record(10 * (n + 1) + 1)])
    assert not files.begin(STREAM, SHARD, at(10 * (DEPTH + 1)))
    assert take(files, at(10)) is not None  # a task caught up: there is room again
    assert files.begin(STREAM, SHARD, at(10 * (DEPTH + 1)))


def test_an_untaken_read_ahead_turns_the_shard_cold(files: ReadAheadFiles, tmp_path: Path) -> None:
    leave(files, at(10), [record(11)])
    # The batch from 10 ran on another host; this host's next task starts later.
    assert take(files, at(50)) is None
    assert not kinds(tmp_path, ".data")
    assert not files.begin(STREAM, SHARD, at(60))  # cold: no more read-ahead here
    other = ReadAheadFiles(tmp_path / "root", "app", "query")
    assert not other.begin(STREAM, SHARD, at(70))  # for every worker of the host
    elsewhere = ReadAheadFiles(tmp_path / "root", "app", "another query")
    assert elsewhere.begin(STREAM, SHARD, at(70))  # another query's reads are its own


def test_a_root_others_can_write_to_is_never_used(files: ReadAheadFiles, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    root.chmod(0o777)
    assert not files.begin(STREAM, SHARD, at(10))
    root.chmod(0o700)
    leave(files, at(10), [record(11)])
    root.chmod(0o777)
    assert take(files, at(10)) is None  # what another user could have planted is not read


# -- the executor's path on kinesalite + dynalite -------------------------------------------------
@pytest.fixture
def worker(setup: dict[str, Any], tmp_path: Path) -> Iterator[Worker]:
    made = Worker(setup["config"], tmp_path / "read-ahead")
    try:
        yield made
    finally:
        made.close()


def run_batches(
    setup: dict[str, Any],
    worker: Worker,
    per_shard: int,
    count: int,
    limits: list[int] | None = None,
) -> list[list[Record]]:
    """``count`` batches planned one after another, each read by ``worker`` as an executor task
    (after waiting until the read-ahead of its start is written, when one is under way), then
    replayed from the stream without read-ahead: the ledger's range must give the same records."""
    options = SourceOptions(
        config=setup["config"], streams=(setup["stream"],), max_records_per_shard=per_shard
    )
    planner = Planner(options, lambda config: SoloMember(config))
    planner.initial_offset()
    out: list[list[Record]] = []
    try:
        end = SourceOffset(planner.query or "", 0).to_json()
        for n in range(count):
            end = planner.latest_offset(end, None)
            (partition,) = planner.partitions(end)
            if limits:
                partition = partition.__class__(**{**partition.__dict__, "limit": limits[n]})
            partition = pickle.loads(pickle.dumps(partition))
            if n:
                wait_until(lambda: not pending_files(worker.root), timeout=30)
            out.append(worker.read(partition))
            assert asyncio.run(read_records(partition)) == out[-1]
    finally:
        planner.close()
    return out


def pending_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.pending")] if root.exists() else []


def test_batches_taken_from_read_ahead_hold_every_record_once_in_order(
    setup: dict[str, Any], worker: Worker
) -> None:
    produced = put_plain(setup, 45)
    taken: list[int] = []
    real_take = ReadAheadFiles.take

    async def counting(self: ReadAheadFiles, *args: Any) -> Any:
        got = await real_take(self, *args)
        taken.append(len(got.records) if got else 0)
        return got

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReadAheadFiles, "take", counting)
        got = run_batches(setup, worker, per_shard=10, count=5)
    assert [len(b) for b in got] == [10, 10, 10, 10, 5]
    assert [r.data for b in got for r in b] == produced
    # Batches 2 to 5 came from read-ahead (batch 1, from TRIM_HORIZON, looks for none).
    assert taken == [10, 10, 10, 5]
    wait_until(lambda: not pending_files(worker.root), timeout=30)
    assert not data_files(worker.root)  # caught up: nothing read ahead is left behind


def test_a_smaller_limit_takes_a_prefix_of_the_read_ahead(
    setup: dict[str, Any], worker: Worker
) -> None:
    produced = put_plain(setup, 40)
    limits = [10, 4, 10, 10, 10, 10]
    got = run_batches(setup, worker, per_shard=10, count=6, limits=limits)
    # Batch 2's read-ahead was read under its limit of 4: batch 3 takes those 4 (a batch may
    # hold fewer than its limit), and the batches after it read ahead 10 at a time again.
    assert [len(b) for b in got] == [10, 4, 4, 10, 10, 2]
    assert [r.data for b in got for r in b] == produced


def test_read_ahead_off_reads_for_itself(setup: dict[str, Any]) -> None:
    produced = put_plain(setup, 25)
    options = SourceOptions(
        config=setup["config"],
        streams=(setup["stream"],),
        max_records_per_shard=10,
        read_ahead=False,
    )
    planner = Planner(options, lambda config: SoloMember(config))
    planner.initial_offset()
    given: list[Any] = []
    real = executor.read_with

    async def capturing(*args: Any) -> Any:
        given.append(args[3])
        return await real(*args)

    try:
        end = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
        (partition,) = planner.partitions(end)
        assert partition.read_ahead is False
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(executor, "read_with", capturing)
            got = table_to_records(
                executor.worker_clients().read(pickle.loads(pickle.dumps(partition)))
            )
        assert [r.data for r in got] == produced[:10]
        assert given == [None]  # no read-ahead files: nothing read ahead, nothing taken
    finally:
        planner.close()
