"""What an executor's Python worker keeps between tasks (kinesumer.spark.source.executor.read):
clients opened once per Config, and the worker's long-lived objects frozen out of the cyclic
garbage collector (a reused PySpark worker runs a full ``gc.collect()`` after every task). On
kinesalite + dynalite, in this process: the freeze is undone at the end."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table

from kinesumer.spark.source.executor.read import read_partition
from kinesumer.spark.source.offsets import Start
from kinesumer.spark.source.partition import ShardPartition

pytest.importorskip("pyarrow")


def test_a_worker_freezes_its_long_lived_objects_once_its_clients_are_open(
    kinesalite: Any, dynalite: Any, unique_name: Any
) -> None:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 5)
    partition = ShardPartition(
        config=config,
        query=unique_name("q"),
        batch=1,
        stream=stream,
        shard_id="shardId-000000000000",
        start=Start(at="TRIM_HORIZON"),
        limit=100,
        owner="o",
        max_read_seconds=5.0,
        ledger_ttl=3600,
    )
    gc.unfreeze()
    try:
        rows = sum(batch.num_rows for batch in read_partition(partition))
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()
    assert rows == 5
    # Modules, service models and the clients just opened: far more than a task's own objects.
    assert frozen > 10_000


class _Cycle:
    """Garbage the cyclic collector alone can free: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


def test_garbage_left_when_the_worker_freezes_is_still_collected(
    kinesalite: Any, dynalite: Any, unique_name: Any
) -> None:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 1)
    partition = ShardPartition(
        config=config,  # a Config this worker has no clients for yet: it opens them and freezes
        query=unique_name("q"),
        batch=1,
        stream=stream,
        shard_id="shardId-000000000000",
        start=Start(at="TRIM_HORIZON"),
        limit=100,
        owner="o",
        max_read_seconds=5.0,
        ledger_ttl=3600,
    )
    garbage = _Cycle()
    left = weakref.ref(garbage)
    del garbage  # unreachable, and (no automatic collection meanwhile) not collected yet
    gc.unfreeze()
    gc.disable()
    try:
        assert sum(batch.num_rows for batch in read_partition(partition)) == 1
        gc.collect()
        # Frozen while garbage, it would never be freed (measured: ~900 such objects at the
        # first task's freeze, the garbage of opening the clients).
        assert left() is None
    finally:
        gc.enable()
        gc.unfreeze()
