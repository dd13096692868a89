"""Broadcast mode's plan when a parent left the shard listing (issue 17, item 1c): a position
the member saved in it counts as following its lineage, so its children start at TRIM_HORIZON
rather than as roots at LATEST. Pure: :class:`~kinesumer.read.broadcast_plan.ShardPlan`.
"""

from __future__ import annotations

import pytest

from kinesumer.models import Position, Shard
from kinesumer.read.broadcast_plan import ShardPlan
from kinesumer.statestore.base import SavedPosition


@pytest.mark.parametrize(
    "saved",
    [
        SavedPosition(
            "s", "p", Position("49590338271490256608559692538361571095921575989136588898")
        ),
        SavedPosition("s", "p", finished=True),
        SavedPosition("s", "p", started_at_ms=1_700_000_000_000),
    ],
    ids=["position", "finished", "started"],
)
def test_broadcast_children_of_an_aged_out_parent_it_followed_start_at_trim_horizon(
    saved: SavedPosition,
) -> None:
    """Issue 17, item 1c: the parent left ListShards (retention) while the member was down; a
    position saved in it means the member followed this lineage: its children replay from
    TRIM_HORIZON, they are not roots read from LATEST."""
    plan = ShardPlan("LATEST", {("s", "p"): saved}, 1_700_000_000_000, resume=True)
    children = [Shard("c1", parent_shard_id="p"), Shard("c2", parent_shard_id="p")]
    starts = plan.new_shards("s", children)
    assert [(s.key, s.after, s.initial, s.parents) for s in starts] == [
        (("s", "c1"), None, "TRIM_HORIZON", ()),
        (("s", "c2"), None, "TRIM_HORIZON", ()),
    ]


def test_broadcast_children_of_an_unknown_unlisted_parent_are_roots() -> None:
    plan = ShardPlan("LATEST", {}, 1_700_000_000_000, resume=True)
    (start,) = plan.new_shards("s", [Shard("c1", parent_shard_id="p")])
    assert (start.initial, start.started_at_ms) == ("LATEST", 1_700_000_000_000)
