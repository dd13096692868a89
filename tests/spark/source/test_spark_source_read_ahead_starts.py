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

from support.group import put
from support.read_ahead import Worker, one_shard_stream, recording_takes
from support.spark_fakes import SoloMember

from kinesumer.models import Record
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions

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
    worker = Worker(setup["config"], root, "test-read-ahead-starts")
    batches: list[list[Record]] = []
    try:
        end = SourceOffset(planner.query or "", 0).to_json()
        with recording_takes() as taken:
            for n in range(1, count + 1):
                end = planner.latest_offset(end, None)
                assert end["batch"] == n
                planned(n, members[-1])
                (partition,) = planner.partitions(end)
                taken.append(False)
                batches.append(worker.read(pickle.loads(pickle.dumps(partition))))
                worker.settle()
                planner.commit(end)
    finally:
        worker.close()
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
