"""An executor asks GetRecords for no more records than its batch still needs.

It once asked for ``scan_limit`` (10,000) whatever the batch's limit, and dropped the rest: a
batch of 5,000 records per shard read 10,000, twice the bytes against the shard's 2 MB/s of
reads (and, on on-demand streams, its bill) and twice the time (measured in the Spark
benchmark: 0.40 s per task against 0.20 s). Checked without Spark (planner, executor read and
ledger on kinesalite + dynalite): every GetRecords' ``Limit`` is what the batch still needs,
batches follow each other without a gap or a repeat, plain records and KPL aggregates (one
Kinesis record, several user records: the ask counts Kinesis records, so what a batch needs in
user records is always enough), and a replay reads exactly the recorded batch again."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
from support.read_ahead import one_shard_stream, put_aggregates, put_plain
from support.spark_fakes import SoloMember

from kinesumer.kinesis.reader import KinesisReader
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions


@pytest.fixture
def setup(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return one_shard_stream(kinesalite, dynalite, unique_name)


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``Limit`` of every GetRecords the executor sends."""
    asked: list[int] = []
    real = KinesisReader.get_epoch_columns

    async def recording(self: KinesisReader, *args: Any) -> Any:
        asked.append(args[3])  # stream, shard_id, iterator, limit, skip_through
        return await real(self, *args)

    monkeypatch.setattr(KinesisReader, "get_epoch_columns", recording)
    return asked


def batches(setup: dict[str, Any], per_shard: int, count: int) -> list[list[Any]]:
    """``count`` batches read one after another, each partition as an executor gets it."""
    options = SourceOptions(
        config=setup["config"], streams=(setup["stream"],), max_records_per_shard=per_shard
    )
    planner = Planner(options, lambda config: SoloMember(config))
    planner.initial_offset()
    out: list[list[Any]] = []
    try:
        end = SourceOffset(planner.query or "", 0).to_json()
        for _ in range(count):
            end = planner.latest_offset(end, None)
            (partition,) = planner.partitions(end)
            partition = pickle.loads(pickle.dumps(partition))
            out.append(asyncio.run(read_records(partition)))
            # A replay (task retry) reads exactly the same records, asking no more.
            assert asyncio.run(read_records(partition)) == out[-1]
    finally:
        planner.close()
    return out


def test_plain_records_are_asked_for_as_the_batch_needs_them(
    setup: dict[str, Any], limits: list[int]
) -> None:
    produced = put_plain(setup, 25)
    got = batches(setup, per_shard=10, count=3)
    assert [len(b) for b in got] == [10, 10, 5]
    assert [r.data for b in got for r in b] == produced
    assert limits and max(limits) <= 10 + 1  # before: 10,000 each time
    assert limits[0] == 10


def test_aggregates_split_between_batches_are_read_once_each(
    setup: dict[str, Any], limits: list[int]
) -> None:
    produced = put_aggregates(setup, aggregates=4, per=5)
    got = batches(setup, per_shard=7, count=3)
    assert [len(b) for b in got] == [7, 7, 6]
    assert [r.data for b in got for r in b] == produced
    # Batch 2 starts inside the second aggregate: its first answer holds that aggregate again
    # (its user records up to the resume point skipped), so it asks for one more.
    assert max(limits) <= 7 + 1
