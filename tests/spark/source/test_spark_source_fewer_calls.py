"""The source's executors leave out two calls a batch does not need (kinesalite + dynalite, no
Spark; Spark's own attempt numbers are checked in ``test_spark_source.py``):

- the first attempt of a batch this run planned does not look its ledger item up first: there is
  none unless a concurrent attempt wrote one, and then the conditional write finds it, and the
  task returns exactly that attempt's range;
- a read ahead starts from the iterator the read before it ended with (passed between workers in
  the read-ahead's files) instead of asking GetShardIterator, unless that read stopped inside an
  answer (a batch ending inside a KPL aggregate), the iterator is old, or Kinesis says it
  expired. Every record still arrives once, in order.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from support.read_ahead import Worker, one_shard_stream, put_aggregates, put_plain
from support.spark_fakes import SoloMember
from support.wait import wait_until

from kinesumer.kinesis import KinesisReader
from kinesumer.kinesis.reader import IteratorExpired
from kinesumer.models import Position, Record
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor import read as executor
from kinesumer.spark.source.executor import readahead
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.executor.readahead import ReadAheadFiles
from kinesumer.spark.source.executor.shard_read import ShardRangeReader
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.partition import ShardPartition

pyspark = pytest.importorskip("pyspark")


@pytest.fixture
def setup(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return one_shard_stream(kinesalite, dynalite, unique_name)


@contextmanager
def two_workers(setup: dict[str, Any], root: Path) -> Iterator[list[Worker]]:
    """Two executor workers of one host (one read-ahead folder), as Spark's ``local[2]``."""
    made = [Worker(setup["config"], root, name=f"test-worker-{n}") for n in range(2)]
    try:
        yield made
    finally:
        for worker in made:
            worker.close()


@pytest.fixture
def workers(setup: dict[str, Any], tmp_path: Path) -> Iterator[list[Worker]]:
    with two_workers(setup, tmp_path / "ra") as made:
        yield made


class Attempt:
    """A Spark task's context as :func:`executor.first_attempt` reads it."""

    def __init__(self, number: int) -> None:
        self.number = number

    def attemptNumber(self) -> int:
        return self.number


@pytest.fixture
def attempt(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The attempt number of the task being run (None: not in a Spark task)."""
    number: list[int | None] = [None]

    def get() -> Attempt | None:
        return None if number[0] is None else Attempt(number[0])

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(get))
    return number


def partitions(setup: dict[str, Any], per_shard: int) -> Generator[ShardPartition, None, None]:
    """Batches planned one after another by the driver, as Spark's first attempts get them."""
    options = SourceOptions(
        config=setup["config"], streams=(setup["stream"],), max_records_per_shard=per_shard
    )
    planner = Planner(options, lambda config: SoloMember(config))
    planner.initial_offset()
    try:
        end = SourceOffset(planner.query or "", 0).to_json()
        while True:
            end = planner.latest_offset(end, None)
            (partition,) = planner.partitions(end)
            yield pickle.loads(pickle.dumps(replace(partition, planned_here=True)))
    finally:
        planner.close()


@contextmanager
def first_batch(setup: dict[str, Any], per_shard: int) -> Iterator[ShardPartition]:
    planned = partitions(setup, per_shard)
    try:
        yield next(planned)
    finally:
        planned.close()


def requests(workers: list[Worker], name: str) -> int:
    return sum(w.stats.requests[name] for w in workers)


def read_all(workers: list[Worker], planned: Iterator[ShardPartition], total: int) -> list[Any]:
    """Batches read by the workers in turn (each task on the next worker, as Spark may hand a
    shard's tasks to any of a host's workers) until ``total`` records came; their records, once
    the read-ahead the workers went on with has ended."""
    got: list[Record] = []
    try:
        for n, partition in enumerate(planned):
            if n:  # the read-ahead of this start, if one is under way, written first
                wait_until(lambda: not list(workers[0].root.rglob("*.pending")), timeout=30)
            got += workers[n % 2].read(partition)
            if len(got) >= total:
                break
    finally:
        close = getattr(planned, "close", None)
        if close is not None:
            close()
    for worker in workers:
        worker.settle()
    return got


def test_a_first_attempt_writes_its_range_without_looking_the_ledger_up(
    setup: dict[str, Any], workers: list[Worker], attempt: list[int | None]
) -> None:
    produced = put_plain(setup, 25)
    with first_batch(setup, per_shard=10) as partition:
        attempt[0] = 0
        got = workers[0].read(partition)
        assert [r.data for r in got] == produced[:10]
        assert requests(workers, "dynamodb:GetItem") == 0
        assert requests(workers, "dynamodb:PutItem") == 1
        # A retry (attempt 1) looks first, and replays exactly the range the first attempt wrote.
        attempt[0] = 1
        assert workers[1].read(partition) == got
        assert requests(workers, "dynamodb:GetItem") == 1
        assert requests(workers, "dynamodb:PutItem") == 1


def test_outside_a_spark_task_or_for_a_batch_from_the_offset_log_the_ledger_is_looked_up(
    setup: dict[str, Any], attempt: list[int | None]
) -> None:
    put_plain(setup, 5)
    with first_batch(setup, per_shard=10) as partition:
        assert executor.first_attempt(partition) is False  # no task context: not in Spark
        attempt[0] = 0
        assert executor.first_attempt(partition) is True
        assert executor.first_attempt(replace(partition, planned_here=False)) is False
        attempt[0] = 2
        assert executor.first_attempt(partition) is False


def test_only_the_first_partitions_of_a_batch_this_run_planned_skip_the_lookup(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark plans a batch's partitions again for each further job that reads it (a second
    action on a foreachBatch DataFrame): by then the first job's tasks wrote the batch's items,
    so those tasks look first and replay (found by a review: they read anew, lost the write,
    then replayed, and a read-ahead they began on another host went untaken). A batch from the
    offset log (a new reader: a restart) looks first too."""
    from kinesumer.spark.source.compat import ReadAllAvailable
    from kinesumer.spark.source.datasource import KinesumerStreamReader

    put_plain(setup, 5)
    monkeypatch.setattr(KinesumerStreamReader, "_leave_on_exit", lambda self: None)
    options = SourceOptions(config=setup["config"], streams=(setup["stream"],))
    reader = KinesumerStreamReader(options)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert SourceOffset.from_json(end).batch == SourceOffset.from_json(start).batch + 1
        (first,) = reader.partitions(start, end)
        (again,) = reader.partitions(start, end)
        assert first.planned_here and not again.planned_here
        (restarted,) = KinesumerStreamReader(options).partitions(start, end)
        assert not restarted.planned_here
        # Nothing new: the same offset again, and nothing planned here to skip a lookup for.
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        (after,) = reader.partitions(start, end)
        assert not after.planned_here
    finally:
        reader.stop()


def test_a_first_attempt_that_lost_the_race_returns_the_winners_range(
    setup: dict[str, Any], workers: list[Worker], attempt: list[int | None]
) -> None:
    """A speculative copy (attempt 1) wrote the batch first, with the limit it was planned
    with then (4: a limit the driver lowered since is the same as a copy that read less): the
    first attempt, which did not look, reads 10, loses the write, and returns the 4."""
    produced = put_plain(setup, 25)
    with first_batch(setup, per_shard=10) as partition:
        attempt[0] = 1
        winner = workers[1].read(replace(partition, limit=4, read_ahead=False))
        assert [r.data for r in winner] == produced[:4]
        attempt[0] = 0
        assert workers[0].read(partition) == winner
        assert asyncio.run(read_records(partition)) == winner  # and a replay, the same again


@pytest.mark.parametrize("position", ["LATEST", "TRIM_HORIZON"])
def test_reads_ahead_start_from_the_iterator_the_read_before_ended_with(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Any,
    tmp_path: Path,
    attempt: list[int | None],
    position: str,
) -> None:
    setup = one_shard_stream(kinesalite, dynalite, unique_name, initial_position=position)
    planned = partitions(setup, per_shard=10)
    first = next(planned)  # at LATEST (the default), the shard is opened here: records come after
    produced = put_plain(setup, 80)
    attempt[0] = 0
    with two_workers(setup, tmp_path / "ra") as workers:
        got = read_all(workers, chain([first], planned), total=80)
        planned.close()
        # Nine reads or more (8 batches, and the tip found empty), and two GetShardIterators:
        # the first batch's own read (from LATEST's pin or TRIM_HORIZON), and one at the tip
        # (the read ahead of batch 9 found nothing and left no file; the last task's read-ahead
        # reads there again, anew). Every other read, ahead in either worker, went on from the
        # iterator the read before it ended with (before: one GetShardIterator per read).
        assert requests(workers, "kinesis:GetRecords") >= 9
        assert requests(workers, "kinesis:GetShardIterator") <= 2
    assert [r.data for r in got] == produced


@pytest.mark.parametrize("per", [3, 5])
def test_kpl_batches_cut_inside_an_answer_ask_for_an_iterator_and_lose_nothing(
    setup: dict[str, Any], workers: list[Worker], attempt: list[int | None], per: int
) -> None:
    """Aggregates of ``per`` user records, batches of 10 user records. A read asks for as many
    Kinesis records as it needs user records (always enough), so its answer holds more than the
    batch and is cut: the rest belongs to the next batch (of 3: inside an aggregate), and an
    iterator after the answer would skip it. Each read asks for an iterator at its start."""
    produced = put_aggregates(setup, 60 // per, per)
    attempt[0] = 0
    got = read_all(workers, partitions(setup, per_shard=10), total=60)
    assert [r.data for r in got] == produced
    assert requests(workers, "kinesis:GetShardIterator") >= 6


def test_an_old_iterator_is_not_passed_on(tmp_path: Path) -> None:
    files = ReadAheadFiles(tmp_path / "ra", "app", "query")
    assert files.begin("s", "shardId-0", Position("10", 0))
    batch = readahead.ReadAheadBatch(Position("10", 0), _empty_rows(), False, False, 0)
    files.finish("s", "shardId-0", batch, "run", Position("20", 0), "ITERATOR")
    assert files.read_past("s", "shardId-0", Position("10", 0), "run") == (
        Position("20", 0),
        "ITERATOR",
    )
    (written,) = (tmp_path / "ra").rglob("*.next")
    old = time.time() - readahead.ITERATOR_SECONDS - 1
    os.utime(written, (old, old))
    assert files.read_past("s", "shardId-0", Position("10", 0), "run") == (Position("20", 0), None)


def test_a_previous_runs_place_to_go_on_from_is_not_taken(tmp_path: Path) -> None:
    """A query restarted with the same id finds its previous run's files: where that run's
    reads ahead went on from is that run's, like its batches (``take``)."""
    files = ReadAheadFiles(tmp_path / "ra", "app", "query")
    assert files.begin("s", "shardId-0", Position("10", 0))
    batch = readahead.ReadAheadBatch(Position("10", 0), _empty_rows(), False, False, 0)
    files.finish("s", "shardId-0", batch, "run-1", Position("20", 0), "ITERATOR")
    assert files.read_past("s", "shardId-0", Position("10", 0), "run-2") is None
    assert files.read_past("s", "shardId-0", Position("10", 0), "run-1") == (
        Position("20", 0),
        "ITERATOR",
    )


def test_an_iterator_kinesis_says_expired_is_replaced_and_nothing_is_lost(
    setup: dict[str, Any],
    workers: list[Worker],
    attempt: list[int | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    produced = put_plain(setup, 50)
    real_get, real_init = KinesisReader.get_epoch_columns, ShardRangeReader.__init__
    passed: set[str] = set()  # iterators a read was started from
    expired: list[str] = []

    def init(self: ShardRangeReader, reader: Any, p: Any, iterator: str | None = None) -> None:
        if iterator is not None:
            passed.add(iterator)
        real_init(self, reader, p, iterator)

    async def get_epoch_columns(self: KinesisReader, *args: Any) -> Any:
        iterator = args[2]  # stream, shard_id, iterator, limit, skip_through
        if iterator in passed and iterator not in expired:
            expired.append(iterator)  # each passed-on iterator fails, as if 5 minutes old
            raise IteratorExpired(iterator)
        return await real_get(self, *args)

    monkeypatch.setattr(ShardRangeReader, "__init__", init)
    monkeypatch.setattr(KinesisReader, "get_epoch_columns", get_epoch_columns)
    attempt[0] = 0
    got = read_all(workers, partitions(setup, per_shard=10), total=50)
    assert [r.data for r in got] == produced
    assert expired


def _empty_rows() -> Any:
    from kinesumer.spark.arrow import arrow_schema

    return arrow_schema().empty_table()
