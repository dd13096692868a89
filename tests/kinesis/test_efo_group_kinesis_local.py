"""The group on kinesis-local with enhanced fan-out (issue 24): the real transport end to end.

Member processes (``tests/support/member.py --efo``) read a stream whose first events are over 64
KiB (a pre-filled backlog): one is killed with SIGKILL, one joins, and the stream is resharded with
UpdateShardCount and a merge while the producer writes. Nothing is lost, each key's records come in
order, every record written before the reshard comes (for its key) before any written after it, and
the parents end finished. kinesis-local never ends a closed shard's subscription and holds a
subscription's lease for as long as its server stream lives: what the member does about both (the
SHARD_END check, the stall fallback) is exercised here, not stubbed."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.scenario import (
    FAST,
    Scenario,
    assert_key_order,
    assert_nothing_lost,
    first_deliveries,
)
from support.standins import start_kinesis_local

Names = Callable[[str], str]

# Multi-process and CPU-bound (kinesis-local pushes every event through Scala.js on node): run
# first, before a full run's other files load the machine (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.first]


@pytest.fixture(scope="module")
def kinesis_local() -> Iterator[Any]:
    server = start_kinesis_local()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def world(
    kinesis_local: Any, dynalite: Any, unique_name: Names, tmp_path: Path
) -> Iterator[Scenario]:
    scenario = Scenario(
        kinesis_local.url, dynalite.url, unique_name("app"), unique_name("state"), tmp_path
    )
    scenario.create_table()
    try:
        yield scenario
    finally:
        scenario.close()


def wait_active(world: Scenario, stream: str) -> None:
    world.kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
    )


def test_kill_join_update_shard_count_and_merge_lose_nothing(
    world: Scenario, unique_name: Names
) -> None:
    """The module's scenario (see above). Its length (about 20 s) is the real events it waits
    for: a killed member's shards taken over after ``client_timeout``, a join's rebalance, two
    reshards each read to their parents' ends through real subscriptions."""
    stream = unique_name("s")
    roots = world.create_stream(stream, 2)
    producer = world.producer(stream, batch=10, interval=0.1)
    producer.put(1500)  # a backlog: each shard's first event is about 250 KB
    config = {**FAST, "client_timeout": 2.0}
    start = world.start_member
    victim = start("m2", [stream], config=config, extra=["--efo"])
    survivor = start("m1", [stream], config=config, extra=["--efo"])
    world.wait_delivered(range(1500), timeout=60)
    producer.start()
    world.wait(lambda: bool(victim.owned()), 30, "the victim owns a shard")
    taken = victim.owned()
    victim.kill()
    killed = time.monotonic()
    world.wait(
        lambda: (
            {f"{d.stream}/{d.shard_id}" for d in survivor.deliveries() if d.mono > killed} >= taken
        ),
        60,
        "the survivor reads the victim's shards",
    )
    print(f"failover: first record of the victim's shards after {time.monotonic() - killed:.1f}s")
    joiner = start("m3", [stream], config=config, extra=["--efo"])
    world.wait(lambda: bool(joiner.owned()), 60, "the joiner owns a shard")

    with producer.gate:  # nothing written while the shards change: each record is pre or post
        boundary = producer.count
        world.kinesis.update_shard_count(
            StreamName=stream, TargetShardCount=4, ScalingType="UNIFORM_SCALING"
        )
        wait_active(world, stream)
        split = sorted(set(world.shard_ids(stream, open_only=True)) - set(roots))
        world.kinesis.merge_shards(
            StreamName=stream, ShardToMerge=split[0], AdjacentShardToMerge=split[1]
        )
        wait_active(world, stream)
    parents = set(roots) | set(split[:2])
    open_now = set(world.shard_ids(stream, open_only=True))
    world.wait(lambda: producer.count >= boundary + 300, 60, "records after the reshard")
    world.wait(
        lambda: {d.shard_id for d in world.deliveries()} >= open_now, 60, "the children read"
    )
    produced = producer.stop()
    world.wait_delivered(produced, timeout=60)

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert_key_order(deliveries)
    pre: dict[str, float] = defaultdict(float)
    post: dict[str, float] = defaultdict(lambda: float("inf"))
    for d in first_deliveries(deliveries):
        if d.number < boundary:
            pre[d.partition_key] = max(pre[d.partition_key], d.mono)
        else:
            assert d.shard_id in open_now, f"record {d.number} came from a closed shard"
            post[d.partition_key] = min(post[d.partition_key], d.mono)
    for key in pre:
        assert pre[key] < post[key], f"{key}: a post-reshard record came before a pre-reshard one"
    world.wait(
        lambda: {s for s, c in world.checkpoints(stream).items() if c["finished"]} >= parents,
        30,
        "the parents finished",
    )
    for member in (survivor, joiner):
        member.stop()
        assert member.returncode == 0, member.describe()
