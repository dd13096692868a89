"""Read-ahead when a shard's batch limit changes (``max_records_per_trigger`` spread over another
number of shards, after a reshard): this host's own batches then run through a read-ahead file
instead of starting at it. That is not a shard hopping between hosts, and must not turn the shard
cold here (no read-ahead for 10 minutes); a batch that ran elsewhere still does.

The planner with a stand-in member, one worker's loop kept between batches, the ledger and the
stream on dynalite + kinesalite; each batch's limit set as the planner would after a change."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from pathlib import Path
from typing import Any

from support.group import create_stream, make_config, put, setup_table
from support.read_ahead import Worker, recording_takes
from support.spark_fakes import SoloMember

from kinesumer.models import Position, Record
from kinesumer.spark.arrow import records_to_arrow
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.readahead import ReadAheadBatch, ReadAheadFiles
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions


def read_with_limits(
    kinesalite: Any, dynalite: Any, unique_name: Any, root: Path, limits: list[int]
) -> tuple[list[list[Record]], list[bool], list[bytes]]:
    """Batches of a 1-shard stream of 50 records, batch ``i`` with limit ``limits[i]``; the
    records of each, and whether each was taken from the read-ahead."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    produced = put(kinesalite.url, stream, 0, 50)
    options = SourceOptions(config=config, streams=(stream,), max_records_per_shard=limits[0])
    planner = Planner(options, lambda c: SoloMember(c))
    planner.initial_offset()
    worker = Worker(config, root, "test-read-ahead-realign")
    batches: list[list[Record]] = []
    try:
        end = SourceOffset(planner.query or "", 0).to_json()
        with recording_takes() as taken:
            for limit in limits:
                end = planner.latest_offset(end, None)
                (partition,) = planner.partitions(end)
                p = dataclasses.replace(pickle.loads(pickle.dumps(partition)), limit=limit)
                taken.append(False)
                batches.append(worker.read(p))
                worker.settle()
                planner.commit(end)
    finally:
        worker.close()
        planner.close()
    return batches, taken, produced


def test_a_limit_change_does_not_turn_the_shard_cold(
    kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Path
) -> None:
    """Batch 1 reads 10 and reads two batches of 10 ahead (from 10, from 20); batch 2, limited
    to 4, takes 4 of the first; batch 4 (from 18) reads through 20 on this host, so the file
    from 20 is never taken. Batches 5 and 6 must still find theirs read ahead."""
    root = tmp_path / "ra"
    got, taken, produced = read_with_limits(
        kinesalite, dynalite, unique_name, root, [10, 4, 10, 10, 10, 10]
    )
    assert [r.data for b in got for r in b] == produced[: sum(len(b) for b in got)]
    assert [len(b) for b in got] == [10, 4, 4, 10, 10, 10]
    assert taken == [False, True, True, False, True, True]
    assert list(root.rglob("*.cold")) == []


def test_a_batch_run_on_another_host_still_turns_the_shard_cold(tmp_path: Path) -> None:
    """This host read ahead from 10 and from 20; the batch from 20 ran on another host: this
    host's next task starts at 30 and finds 20's file untaken (a shard hopping hosts)."""
    files = ReadAheadFiles(tmp_path / "ra", "app", "query")
    shard = ("s", "shardId-000000000000")
    for after in (10, 20):
        assert files.begin(*shard, Position(str(after), 0))
        records = [Record(*shard, str(n), 0, "k", b"x", None) for n in range(after + 1, after + 11)]
        files.finish(
            *shard,
            ReadAheadBatch(Position(str(after), 0), records_to_arrow(records), False, False, 5),
        )
    assert asyncio.run(files.take(*shard, Position("10", 0), 0.0)) is not None
    assert asyncio.run(files.take(*shard, Position("30", 0), 0.0)) is None
    assert list((tmp_path / "ra").rglob("*.cold"))
    assert not files.begin(*shard, Position("40", 0))
