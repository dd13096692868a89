"""The rewind's pure plan: the order moves are written in, and when a shard needs no write."""

from __future__ import annotations

import pytest

from kinesumer.core.rewind import RewindTarget, lineage_order, time_target
from kinesumer.models import Checkpoint, Position, Shard


def test_ancestors_come_before_their_descendants_whatever_the_ids() -> None:
    shards = [
        Shard("a-child", "z-parent"),
        Shard("z-parent", "m-grand", None, True),
        Shard("m-grand", None, None, True),
        Shard("b-merged", "z-parent", "c-other", False),
        Shard("c-other", None, None, True),
    ]
    order = lineage_order(shards)
    for shard in shards:
        for parent in shard.parents:
            assert order.index(parent) < order.index(shard.shard_id)
    assert order == ["c-other", "m-grand", "z-parent", "a-child", "b-merged"]


def test_a_target_is_exactly_one_place() -> None:
    with pytest.raises(ValueError):
        RewindTarget()
    with pytest.raises(ValueError):
        RewindTarget(started_at_ms=5, finished=True)


def test_a_start_of_zero_is_a_start_and_held_only_by_the_same_item() -> None:
    target = RewindTarget(started_at_ms=0)
    assert target.holds(Checkpoint("s", "0", started_at_ms=0))
    assert not target.holds(Checkpoint("s", "0"))  # no start: the initial position, not 0
    assert not target.holds(Checkpoint("s", "0", "42", started_at_ms=0))
    assert not target.holds(Checkpoint("s", "0", started_at_ms=0, finished=True))
    assert RewindTarget(position=Position("42")).holds(Checkpoint("s", "0", "42"))


def test_a_closed_shard_without_a_later_record_is_finished_and_an_unknown_one_is_read() -> None:
    closed = Shard("p", None, None, True)
    listed = {"p": closed}
    assert time_target(closed, listed, 1_000, False)[0] == RewindTarget(finished=True)
    assert time_target(closed, listed, 1_000, None)[0] == RewindTarget(started_at_ms=1_000)
    assert time_target(Shard("gone"), listed, 1_000, None)[0] == RewindTarget(finished=True)
