"""Resharding on kinesalite + dynalite: kinesalite reports SHARD_END (moto never does) and gives
realistic 56-digit sequence numbers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.group import (
    Member,
    create_stream,
    datas,
    duplicates,
    make_config,
    put,
    state_store,
)
from support.group import setup_table as create_table
from support.reshard import assert_per_key_order, key_of, split_and_merge
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record

Names = Callable[[str], str]


@pytest.fixture
def env(kinesalite: Any, dynalite: Any, unique_name: Names) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    create_table(config)
    return {"url": kinesalite.url, "config": config, "stream": unique_name("s")}


async def test_split_and_merge_while_consuming(env: dict[str, Any]) -> None:
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 3)
    sink: list[tuple[str, Record]] = []
    members = [Member(env["config"].replace(client_id=c), [stream], sink).start() for c in "ab"]
    produced = put(url, stream, 0, 300, key_of)
    await eventually(lambda: len(sink) >= 300, what="records before the reshard")
    split_and_merge(url, stream)
    produced += put(url, stream, 300, 300, key_of)
    await eventually(lambda: len(set(datas(sink))) == 600, what="records after the reshard")
    for member in members:
        await member.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    assert_per_key_order(sink)
    # 56-digit sequence numbers survive as strings.
    assert all(len(r.sequence_number) >= 50 for _, r in sink)
    # The three parents were checkpointed finished.
    async with state_store(env["config"]) as store:
        checkpoints = await store.get_checkpoints(stream)
    finished = sorted(sid for sid, c in checkpoints.items() if c.finished)
    assert finished == [f"shardId-00000000000{i}" for i in range(3)]


async def test_children_wait_for_parents_then_start_at_trim_horizon(env: dict[str, Any]) -> None:
    """A group that starts after a split and a merge: the children are read (from TRIM_HORIZON)
    only once their parents are drained, so every record arrives, in per-key order."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 3)
    produced = put(url, stream, 0, 150, key_of)
    split_and_merge(url, stream)
    produced += put(url, stream, 150, 150, key_of)
    sink: list[tuple[str, Record]] = []
    consumer = AsyncKinesumer(env["config"])  # TRIM_HORIZON for the roots
    async for record in consumer.consume([stream]):
        sink.append(("solo", record))
        if len(sink) == 300:
            break
    await consumer.aclose()
    assert sorted(datas(sink)) == sorted(produced)
    assert_per_key_order(sink)
    children = {r.shard_id for _, r in sink if int(r.data) >= 150}
    parents = {r.shard_id for _, r in sink if int(r.data) < 150}
    assert parents == {f"shardId-00000000000{i}" for i in range(3)}
    assert children and not (children & parents)
