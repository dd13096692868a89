"""Read-ahead from the starts users run with: ``initial_position`` LATEST (the default: the
first batch starts AT_TIMESTAMP of the pin, no position to read ahead from until it ends), and a
lease lost at a batch's settle and claimed again at once (the next batch goes on from the
ledger's end, under the new lease, and takes what this host read ahead from there).

The planner with a stand-in member, one worker's loop kept between batches, the ledger and the
stream on dynalite + kinesalite. What must hold: every record once, in order; the batches after
the first taken from the read-ahead."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _group import put
from _read_ahead import background_done, one_shard_stream
from _spark_fakes import SoloMember

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.engine.loop_thread import LoopThread
from kinesumer.models import Record
from kinesumer.spark.source.executor import read_with
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.planner import Planner
from kinesumer.spark.source.readahead import ReadAheadBatch, ReadAheadFiles

#: Called with the batch number and the member after the batch is planned, before its read.
Hook = Callable[[int, SoloMember], None]


def read_batches(
    setup: dict[str, Any], root: Path, count: int, planned: Hook
) -> tuple[list[list[Record]], list[bool]]:
    """``count`` batches of 10 records at most, planned, read by one worker, committed; the
    records of each, and whether each was taken from the read-ahead."""
    options = SourceOptions(
        config=setup["config"], streams=(setup["stream"],), max_records_per_shard=10
    )
    members: list[SoloMember] = []

    def member(config: Any) -> SoloMember:
        members.append(SoloMember(config))
        return members[-1]

    planner = Planner(options, member)
    planner.initial_offset()
    loop = LoopThread("test-read-ahead-starts")
    stats = RequestStats()
    clients = AwsClients(setup["config"], stats)
    loop.run(clients.open())
    batches: list[list[Record]] = []
    taken: list[bool] = []
    real_take = ReadAheadFiles.take

    async def take(self: ReadAheadFiles, *args: Any) -> ReadAheadBatch | None:
        got = await real_take(self, *args)
        taken[-1] = got is not None
        return got

    try:
        files = ReadAheadFiles(root, setup["config"].app, planner.query or "")
        end = SourceOffset(planner.query or "", 0).to_json()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ReadAheadFiles, "take", take)
            for n in range(1, count + 1):
                end = planner.latest_offset(end, None)
                assert end["batch"] == n
                planned(n, members[-1])
                (partition,) = planner.partitions(end)
                taken.append(False)
                p = pickle.loads(pickle.dumps(partition))
                batches.append(loop.run(read_with(clients, stats, p, files)))
                loop.run(background_done())
                planner.commit(end)
    finally:
        loop.run(clients.close())
        loop.stop()
        planner.close()
    return batches, taken


def test_a_latest_start_reads_ahead_once_its_first_batch_ended(
    kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Path
) -> None:
    setup = one_shard_stream(kinesalite, dynalite, unique_name, initial_position="LATEST")
    produced: list[bytes] = []

    def after_the_pin(n: int, member: SoloMember) -> None:
        if n == 1:  # batch 1 is planned at the shard's LATEST pin: these come after it
            produced.extend(put(kinesalite.url, setup["stream"], 100, 25))

    got, taken = read_batches(setup, tmp_path / "ra", 3, after_the_pin)
    assert [r.data for b in got for r in b] == produced
    assert [len(b) for b in got] == [10, 10, 5]
    assert taken == [False, True, True]


def test_a_lease_lost_and_claimed_again_takes_the_read_ahead_of_its_next_start(
    kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Path
) -> None:
    setup = one_shard_stream(kinesalite, dynalite, unique_name)
    produced = put(kinesalite.url, setup["stream"], 0, 45)

    def lose_at_settle(n: int, member: SoloMember) -> None:
        if n == 2:  # batch 2's complete() (at batch 3's planning) is refused: lease 1 lost
            member.lose.add((setup["stream"], "shardId-000000000000"))

    got, taken = read_batches(setup, tmp_path / "ra", 5, lose_at_settle)
    assert [r.data for b in got for r in b] == produced
    assert [len(b) for b in got] == [10, 10, 10, 10, 5]
    assert taken == [False, True, True, True, True]
