"""A parent shard whose end was read is finished in the group whatever happens between that
batch and the next: a restart of the driver, a stop, a lost and re-claimed lease. The planner
with its executor reads and ledger on kinesalite + dynalite, driven by the stand-in member of
:mod:`support.spark_fakes` (each run of the query gets a new one that starts from the group's
checkpoints, as a new member would).

The scenario of each: a 1-shard stream with 20 records, split, 20 more on the children; a query
with ``max_records_per_shard=20`` reads the parent's 20 in batch 1, and in batch 2 nothing but
SHARD_END (the ledger says ``end=None, shard_end=True``).
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table, split_in_two
from support.spark_fakes import SoloMember

from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions

Key = tuple[str, str]


@pytest.fixture
def split(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    """20 records on a parent, the parent split, 20 records on its children."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 20)
    parent = split_in_two(kinesalite.url, stream)
    children = put(kinesalite.url, stream, 20, 20)
    return {
        "config": config,
        "stream": stream,
        "parent": (stream, parent),
        "children": children,
    }


class Runs:
    """Runs of one query: each a planner with a member of its own that starts from the group's
    checkpoints (what the previous members wrote), as a restarted driver's member does."""

    def __init__(self, split: dict[str, Any]) -> None:
        self.split = split
        self.members: list[SoloMember] = []

    def planner(self) -> Planner:
        options = SourceOptions(
            config=self.split["config"], streams=(self.split["stream"],), max_records_per_shard=20
        )
        before = self.members[-1] if self.members else None

        def factory(config: Any) -> SoloMember:
            member = SoloMember(config)
            if before is not None:  # the group's checkpoints, as the last member left them
                member.positions = dict(before.positions)
                member.finished = set(before.finished)
            self.members.append(member)
            return member

        return Planner(options, factory)  # type: ignore[arg-type]


def read_all(planner: Planner, end: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for partition in planner.partitions(end):
        out.extend(asyncio.run(read_records(pickle.loads(pickle.dumps(partition)))))
    return out


def parent_to_its_end(planner: Planner, parent: Key) -> dict[str, Any]:
    """Batch 1 reads the parent's 20 records, batch 2 its SHARD_END only; returns batch 2."""
    planner.initial_offset()
    origin = SourceOffset(planner.query or "", 0).to_json()
    first = planner.latest_offset(origin, None)
    assert len(read_all(planner, first)) == 20
    second = planner.latest_offset(first, None)
    assert second["batch"] == 2 and list(second["shards"]) == ["/".join(parent)]
    assert read_all(planner, second) == []
    entry = planner.io.batch(2)[parent]
    assert entry.shard_end and entry.end is None  # the parent's empty last read
    return second


def children_read(planner: Planner, start: dict[str, Any]) -> list[bytes]:
    """Plan and read batches after ``start`` until one reads the children (or give up)."""
    got: list[bytes] = []
    offset = start
    for _ in range(30):
        following = planner.latest_offset(offset, None)
        if following != offset:
            offset = following
            got.extend(r.data for r in read_all(planner, offset))
            if len(got) >= 20:
                break
        else:
            asyncio.run(asyncio.sleep(0.1))
    return got


def test_a_restart_after_the_parents_empty_last_read_finishes_it(split: dict[str, Any]) -> None:
    runs = Runs(split)
    before = runs.planner()
    second = parent_to_its_end(before, split["parent"])
    before.io.close()  # the driver dies: batch 2 committed in Spark, never settled here
    after = runs.planner()
    try:
        got = children_read(after, second)
        assert split["parent"] in runs.members[-1].finished
        assert sorted(got) == sorted(split["children"])
    finally:
        after.close()


def test_a_stop_between_the_batches_finishes_the_parent_at_the_next_run(
    split: dict[str, Any],
) -> None:
    runs = Runs(split)
    before = runs.planner()
    second = parent_to_its_end(before, split["parent"])
    before.close()  # query.stop(): the member leaves, batch 2 not settled
    assert split["parent"] not in runs.members[-1].finished
    after = runs.planner()
    try:
        assert read_all(after, second) == []  # Spark runs batch 2 again: the ledger's range
        got = children_read(after, second)
        assert split["parent"] in runs.members[-1].finished
        assert sorted(got) == sorted(split["children"])
    finally:
        after.close()


@pytest.mark.parametrize("late", [False, True], ids=["reclaimed-at-once", "reclaimed-later"])
def test_a_lost_and_reclaimed_lease_still_finishes_the_parent(
    split: dict[str, Any], late: bool
) -> None:
    runs = Runs(split)
    planner = runs.planner()
    try:
        second = parent_to_its_end(planner, split["parent"])
        member = runs.members[-1]
        member.lose.add(split["parent"])  # batch 2's complete() is refused: the lease was lost
        if late:
            member.hidden.add(split["parent"])  # ... and the shard comes back a while later
            assert planner.latest_offset(second, None) == second
            assert split["parent"] not in member.finished
            member.hidden.clear()
        got = children_read(planner, second)
        assert member.leases[split["parent"]] == 2  # finished under the lease claimed again
        assert split["parent"] in member.finished
        assert sorted(got) == sorted(split["children"])
    finally:
        planner.close()
