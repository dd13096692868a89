"""Read-ahead across a reshard: a parent shard's last records (and its SHARD_END) read ahead end
the parent as a read would, and its children are read after it, every record once.

The planner with a stand-in member (:mod:`support.spark_fakes`), one executor worker's loop kept
between batches (the read-ahead runs there after each task, as in a reused PySpark worker),
the ledger and the stream on dynalite + kinesalite. Kinesalite says SHARD_END only in an empty
answer; Kinesis may say it in the answer that carries a closed shard's last records (no
``NextShardIterator``): :func:`aws_like_shard_end` makes kinesalite's answers look so, so that
a read-ahead file itself holds the SHARD_END.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table, split_in_two
from support.read_ahead import background_done
from support.spark_fakes import SoloMember

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.kinesis import KinesisReader
from kinesumer.kinesis.columns import EpochColumns
from kinesumer.kinesis.reader import ShardBatch
from kinesumer.models import Position, Record
from kinesumer.runtime.loop_thread import LoopThread
from kinesumer.spark.arrow import table_to_records
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_with
from kinesumer.spark.source.executor.readahead import ReadAheadBatch, ReadAheadFiles
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions

Key = tuple[str, str]
PER_SHARD = 10


def split_stream(kinesalite: Any, stream: str, parent_records: int) -> tuple[str, list[bytes]]:
    """``parent_records`` on a 1-shard stream, then the shard split; its id and the data."""
    create_stream(kinesalite.url, stream, 1)
    produced = put(kinesalite.url, stream, 0, parent_records)
    return split_in_two(kinesalite.url, stream), produced


@pytest.fixture
def aws_like_shard_end() -> Iterator[None]:
    """An answer with records that reaches a closed shard's end says SHARD_END itself (no next
    iterator), as Kinesis may; kinesalite says it only in the empty answer after."""
    real = KinesisReader.get_epoch_columns

    async def get_epoch_columns(
        self: KinesisReader,
        stream: str,
        shard_id: str,
        iterator: str,
        limit: int,
        skip_through: Position | None,
    ) -> ShardBatch[EpochColumns]:
        batch = await real(self, stream, shard_id, iterator, limit, skip_through)
        following = batch.next_iterator if batch.records else None
        for _ in range(3):  # kinesalite answers a drained closed shard empty once, then ends
            if following is None:
                break
            peek = await real(self, stream, shard_id, following, 1, None)
            if peek.raw_count:
                break
            if peek.next_iterator is None:
                return dataclasses.replace(batch, next_iterator=None)
            following = peek.next_iterator
        return batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KinesisReader, "get_epoch_columns", get_epoch_columns)
        yield


class Seen:
    """What the read-ahead did: the starts it claimed, the batches tasks took."""

    def __init__(self) -> None:
        self.begun: list[tuple[str, Position]] = []
        self.taken: list[ReadAheadBatch] = []


@pytest.fixture
def seen() -> Iterator[Seen]:
    out = Seen()
    begin, take = ReadAheadFiles.begin, ReadAheadFiles.take

    def begin_seen(self: ReadAheadFiles, stream: str, shard_id: str, after: Position) -> bool:
        out.begun.append((shard_id, after))
        return begin(self, stream, shard_id, after)

    async def take_seen(self: ReadAheadFiles, *args: Any) -> ReadAheadBatch | None:
        got = await take(self, *args)
        if got is not None:
            out.taken.append(got)
        return got

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReadAheadFiles, "begin", begin_seen)
        patch.setattr(ReadAheadFiles, "take", take_seen)
        yield out


def read_until(
    config: Any, stream: str, root: Path, wanted: int
) -> tuple[list[Record], SoloMember]:
    """Batches planned, read by one worker with read-ahead on, and committed, until ``wanted``
    records came (or a generous bound: a shard idle between batches waits for the probe)."""
    options = SourceOptions(config=config, streams=(stream,), max_records_per_shard=PER_SHARD)
    members: list[SoloMember] = []

    def member(c: Any) -> SoloMember:
        members.append(SoloMember(c))
        return members[-1]

    planner = Planner(options, member)
    planner.initial_offset()
    loop = LoopThread("test-read-ahead-reshard")
    stats = RequestStats()
    clients = AwsClients(config, stats)
    loop.run(clients.open())
    got: list[Record] = []
    try:
        files = ReadAheadFiles(root, config.app, planner.query or "")
        end = SourceOffset(planner.query or "", 0).to_json()
        deadline = time.monotonic() + 120
        while len(got) < wanted and time.monotonic() < deadline:
            following = planner.latest_offset(end, None)
            if following == end:
                time.sleep(0.2)  # idle: the planner probes every idle_poll_interval
                continue
            end = following
            for partition in planner.partitions(end):
                p = pickle.loads(pickle.dumps(partition))
                got.extend(table_to_records(loop.run(read_with(clients, stats, p, files))))
            loop.run(background_done())
            planner.commit(end)
    finally:
        loop.run(background_done())
        loop.run(clients.close())
        loop.stop()
        planner.close()
    return got, members[-1]


@pytest.mark.parametrize("parent_records", [25, 20], ids=["short-last-batch", "full-last-batch"])
def test_a_parent_whose_end_was_read_ahead_is_finished_and_its_children_read_once(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Any,
    tmp_path: Path,
    aws_like_shard_end: None,
    seen: Seen,
    parent_records: int,
) -> None:
    """Batch 1 reads the parent's first 10 records and reads the rest ahead, the last of them
    with SHARD_END (full-last-batch: exactly a batch's worth). The batch that takes it ends the
    parent: finished in the group, never read (nor read ahead) again; then the children."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    parent, on_parent = split_stream(kinesalite, stream, parent_records)
    on_children = put(kinesalite.url, stream, parent_records, 20)

    got, member = read_until(config, stream, tmp_path / "ra", parent_records + 20)

    from_parent = [r for r in got if r.shard_id == parent]
    assert [r.data for r in from_parent] == on_parent  # once each, in order
    assert sorted(r.data for r in got if r.shard_id != parent) == sorted(on_children)
    for child in {r.shard_id for r in got} - {parent}:
        numbers = [int(r.data) for r in got if r.shard_id == child]
        assert numbers == sorted(numbers)
    assert (stream, parent) in member.finished
    # The parent's end came in a batch taken from the read-ahead.
    assert [b.shard_end for b in seen.taken if b.records[0].shard_id == parent][-1]
    # A closed shard read to its end is not read ahead past it.
    last = Position(from_parent[-1].sequence_number, from_parent[-1].sub_sequence_number)
    assert (parent, last) not in seen.begun
