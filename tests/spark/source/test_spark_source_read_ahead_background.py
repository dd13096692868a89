"""The read-ahead's background task (kinesumer.spark.source.executor.read) on a worker's loop: how
it ends when its folder breaks under it, and when the loop stops while it reads.

A task nobody awaits must end without an exception (asyncio would log "Task exception was never
retrieved" in the worker's stderr, with a traceback that looks like a failure) and leave no
claim behind. Kinesalite + dynalite; one worker's loop kept between batches, as in Spark."""

from __future__ import annotations

import asyncio
import gc
import pickle
import shutil
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember
from support.wait import wait_until

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.kinesis import KinesisReader
from kinesumer.kinesis.columns import EpochColumns
from kinesumer.models import Record
from kinesumer.runtime.loop_thread import LoopThread
from kinesumer.spark import arrow
from kinesumer.spark.arrow import table_to_records
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor import read as executor
from kinesumer.spark.source.executor.read import read_with
from kinesumer.spark.source.executor.readahead import ReadAheadBatch, ReadAheadFiles
from kinesumer.spark.source.executor.shard_read import ShardRangeReader
from kinesumer.spark.source.ledger import LedgerEntry
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.partition import ShardPartition


class Worker:
    """One executor worker: a long-lived loop and clients; the tasks it ran."""

    def __init__(self, config: Any, root: Path) -> None:
        self.loop = LoopThread("test-read-ahead-background")
        self.stats = RequestStats()
        self.clients = AwsClients(config, self.stats)
        self.loop.run(self.clients.open())
        self.root = root
        self.tasks: set[asyncio.Task[Any]] = set()  # the tasks' own (not the read-ahead)

    def read(self, p: ShardPartition) -> list[Record]:
        files = ReadAheadFiles(self.root, p.config.app, p.query)

        async def task() -> list[Record]:
            current = asyncio.current_task()
            assert current is not None
            self.tasks.add(current)
            return table_to_records(await read_with(self.clients, self.stats, p, files))

        return self.loop.run(task())

    def background_outcomes(self) -> list[BaseException | None]:
        """Wait for the read-ahead (every other task on the loop); how each ended."""

        async def outcomes() -> list[BaseException | None]:
            current = asyncio.current_task()
            others = [t for t in asyncio.all_tasks() if t is not current]
            await asyncio.gather(*others, return_exceptions=True)
            return [None if t.cancelled() else t.exception() for t in others]

        return self.loop.run(outcomes())


@pytest.fixture
def first_batch(
    kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Path
) -> Iterator[tuple[Worker, ShardPartition]]:
    """A worker, and batch 1 of a 1-shard stream with 30 records, 10 per batch (a backlog: the
    batch's task reads the next ones ahead)."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 30)
    options = SourceOptions(config=config, streams=(stream,), max_records_per_shard=10)
    planner = Planner(options, lambda c: SoloMember(c))
    planner.initial_offset()
    worker = Worker(config, tmp_path / "ra")
    try:
        end = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
        (partition,) = planner.partitions(end)
        yield worker, pickle.loads(pickle.dumps(partition))
    finally:
        if not worker.loop.stopped:
            worker.loop.run(worker.clients.close())
        worker.loop.stop()
        planner.close()


def test_a_folder_broken_while_reading_ahead_ends_the_read_ahead_quietly(
    first_batch: tuple[Worker, ShardPartition],
) -> None:
    """The query's folder removed (a /tmp cleaner) and its name taken by a file while a
    read-ahead reads: the read-ahead cannot leave its file, nor drop its claim. It ends there,
    with a warning, not with an exception nobody retrieves."""
    worker, partition = first_batch
    real = ReadAheadFiles.finish
    broken: list[Path] = []

    def finish(
        self: ReadAheadFiles, stream: str, shard_id: str, batch: ReadAheadBatch, *more: Any
    ) -> None:
        folder = next(worker.root.iterdir())
        shutil.rmtree(folder)
        folder.write_bytes(b"")
        broken.append(folder)
        real(self, stream, shard_id, batch, *more)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReadAheadFiles, "finish", finish)
        assert len(worker.read(partition)) == 10
        outcomes = worker.background_outcomes()
    assert broken  # the read-ahead ran, and met the broken folder
    assert outcomes == [None] * len(outcomes)


def test_a_loop_stopped_while_reading_ahead_leaves_no_claim(
    first_batch: tuple[Worker, ShardPartition],
) -> None:
    """The worker's loop stopped (the worker leaves) while its read-ahead waits on Kinesis: the
    read-ahead is cancelled and drops its claim (a live worker's claim is waited for by the
    next task of the shard on this host)."""
    worker, partition = first_batch
    real = KinesisReader.get_epoch_columns
    reading_ahead = threading.Event()

    async def get_epoch_columns(self: KinesisReader, *args: Any) -> Any:
        if asyncio.current_task() not in worker.tasks:  # the read-ahead: held until cancelled
            reading_ahead.set()
            await asyncio.Event().wait()
        return await real(self, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KinesisReader, "get_epoch_columns", get_epoch_columns)
        assert len(worker.read(partition)) == 10
        wait_until(reading_ahead.is_set, timeout=60, what="the read-ahead to read")
        assert list(worker.root.rglob("*.pending"))  # its claim, while it reads
        worker.loop.run(worker.clients.close())
        worker.loop.stop()
    assert list(worker.root.rglob("*.pending")) == []
    assert list(worker.root.rglob("*.data")) == []


def test_a_batch_read_ahead_is_let_go_once_in_its_file_not_held_through_the_next_read(
    first_batch: tuple[Worker, ShardPartition],
) -> None:
    """Once left in its file, a read-ahead's records and the Arrow built from them are of no
    more use to the worker: held on while it reads the next batch ahead (up to
    ``max_read_seconds``), every shard it reads ahead holds a batch's records twice over."""
    worker, partition = first_batch
    made: list[weakref.ref[Any]] = []  # each read's records, and each table built from them
    alive_at_each_read: list[list[bool]] = []
    real_read, real_to_arrow = ShardRangeReader.read_new, arrow.epoch_columns_to_arrow

    async def read_new(self: ShardRangeReader) -> tuple[EpochColumns, LedgerEntry]:
        gc.collect()
        alive_at_each_read.append([ref() is not None for ref in made])
        records, entry = await real_read(self)
        made.append(weakref.ref(records))
        return records, entry

    def epoch_columns_to_arrow(records: EpochColumns) -> Any:
        table = real_to_arrow(records)
        made.append(weakref.ref(table))
        return table

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardRangeReader, "read_new", read_new)
        patch.setattr(executor, "epoch_columns_to_arrow", epoch_columns_to_arrow)
        assert len(worker.read(partition)) == 10
        assert worker.background_outcomes() == [None]
    # The task's read (its records and table: made[0], made[1]), then two read ahead (records
    # behind each): at the second, the first's records and table (made[2], made[3]) are gone.
    assert len(alive_at_each_read) >= 3
    assert alive_at_each_read[2][2:] == [False, False]
