"""Group mode: a child whose parent aged out of ListShards (retention) while the group was
following it starts at TRIM_HORIZON, not at the configured LATEST (which would skip every record
written to the child since the reshard); a child of a parent the group never held stays a root.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from kinesumer.group.shard_sync import ShardSync
from kinesumer.models import Checkpoint, Shard
from kinesumer.statestore.base import ShardCache

STREAM = "orders"


class Listing:
    """The reader's ListShards: the child, its parent gone from the listing."""

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards

    async def list_shards(self, stream: str) -> list[Shard]:
        return list(self.shards)


class Store:
    """The state store calls a shard sync makes, in memory."""

    def __init__(self, checkpoints: dict[str, Checkpoint]) -> None:
        self.checkpoints = checkpoints
        self.cache: ShardCache | None = None
        self.asked: list[list[str]] = []

    async def get_checkpoints(
        self, stream: str, shard_ids: Iterable[str] | None = None
    ) -> dict[str, Checkpoint]:
        ids = set(self.checkpoints) if shard_ids is None else set(shard_ids)
        self.asked.append(sorted(ids))
        return {sid: c for sid, c in self.checkpoints.items() if sid in ids}

    async def shard_cache_digests(self, streams: Sequence[str]) -> dict[str, str]:
        return {STREAM: self.cache.digest} if self.cache is not None else {}

    def shard_cache_unreadable(self, stream: str) -> bool:
        return False

    async def save_shard_cache(self, cache: ShardCache, expected_digest: str | None) -> bool:
        self.cache = cache
        return True


def start_of_child(parent_checkpoint: Checkpoint | None) -> Any:
    child = Shard("shardId-000000000002", parent_shard_id="shardId-000000000000")
    store = Store(
        {} if parent_checkpoint is None else {parent_checkpoint.shard_id: parent_checkpoint}
    )
    sync = ShardSync("m1", "LATEST", store, Listing([child]))  # type: ignore[arg-type]
    asyncio.run(sync.sync_stream(STREAM))
    return sync.start_of((STREAM, child.shard_id))


@pytest.mark.parametrize("finished", [True, False], ids=["parent-finished", "parent-unfinished"])
def test_a_child_of_a_parent_the_group_followed_starts_at_trim_horizon(finished: bool) -> None:
    parent = Checkpoint(STREAM, "shardId-000000000000", "4960", finished=finished)
    start = start_of_child(parent)
    assert start.initial == "TRIM_HORIZON"
    assert start.pending_parents == ()  # an aged-out parent can never be read: nothing to wait for


def test_a_child_of_a_parent_the_group_never_held_is_a_root() -> None:
    start = start_of_child(None)
    assert start.initial == "LATEST"
    assert start.pending_parents == ()


def test_an_aged_out_parent_is_looked_up_once_per_leader() -> None:
    child = Shard("shardId-000000000002", parent_shard_id="shardId-000000000000")
    parent = Checkpoint(STREAM, "shardId-000000000000", "4960", finished=True)
    store = Store({parent.shard_id: parent})
    sync = ShardSync("m1", "LATEST", store, Listing([child]))  # type: ignore[arg-type]
    for _ in range(3):
        asyncio.run(sync.sync_stream(STREAM))
    assert store.asked == [["shardId-000000000000"]]  # then nothing closed, nothing new to read
    assert sync.start_of((STREAM, child.shard_id)).initial == "TRIM_HORIZON"
