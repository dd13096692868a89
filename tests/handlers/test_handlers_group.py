"""``run()`` on the real engine (kinesalite + dynalite): order, checkpoints, batches, failures.

Each test runs ``Kinesumer.run`` in a thread (as an application's main thread would) and stops
it with ``close()`` from the test's thread, the documented way; checkpoints are read straight
from DynamoDB.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.handlers import Run, checkpoints
from support.wait import eventually, wait_until

from kinesumer import AsyncKinesumer, ConfigError, Kinesumer, Record
from kinesumer.handlers import Batch


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 4)
    return {"config": config, "stream": stream, "url": kinesalite.url}


def test_per_key_order_under_concurrency_32(group: dict[str, Any]) -> None:
    """Many keys over 4 shards, random handler delays: each key's records are handled one at a
    time in the order they were written; every record once; the final checkpoints are each
    shard's last record."""
    config, stream = group["config"], group["stream"]
    total = 1200
    put(group["url"], stream, 0, total, key=lambda i: f"k{i % 97}")
    lock = threading.Lock()
    seen: dict[str, list[int]] = defaultdict(list)
    busy: set[str] = set()
    overlaps: list[str] = []
    last_of_shard: dict[str, int] = {}
    rng = random.Random(7)

    def handle(record: Record) -> None:
        key = record.partition_key
        with lock:
            if key in busy:
                overlaps.append(key)
            busy.add(key)
            delay = rng.random() * 0.004
        time.sleep(delay)
        with lock:
            busy.discard(key)
            seen[key].append(int(record.data))
            sequence = int(record.sequence_number)
            last_of_shard[record.shard_id] = max(last_of_shard.get(record.shard_id, 0), sequence)

    consumer = Kinesumer(config)
    run = Run(consumer, [stream], handle, concurrency=32, ordering="key")
    wait_until(lambda: sum(map(len, seen.values())) >= total, 60, "every record handled")
    run.stop()
    assert not overlaps, f"keys with two calls in flight: {overlaps[:5]}"
    for key, numbers in seen.items():
        assert numbers == sorted(numbers), f"key {key} out of order: {numbers}"
    every = sorted(n for numbers in seen.values() for n in numbers)
    assert every == list(range(total)), "a record was lost or handled twice"
    assert checkpoints(config, stream) == last_of_shard
    assert list(consumer.stats().handled.values()) == [{"ok": total}]


def test_checkpoint_never_passes_an_unfinished_record(group: dict[str, Any]) -> None:
    """One record blocks in its handler; later records of other keys on the same shard finish.
    The shard's checkpoint reaches the record just before the blocked one and stays there until
    it is released."""
    config, stream, url = group["config"], group["stream"], group["url"]
    put(url, stream, 0, 400, key=lambda i: f"k{i % 50}")
    release = threading.Event()
    blocked: list[Record] = []
    handled: list[Record] = []
    lock = threading.Lock()

    def handle(record: Record) -> None:
        if int(record.data) == 100:
            blocked.append(record)
            release.wait(30)
        with lock:
            handled.append(record)

    consumer = Kinesumer(config)
    run = Run(consumer, [stream], handle, concurrency=8, ordering="key", max_in_flight=400)
    # Every record but the blocked one and its key's later records (they wait for it).
    others = sum(1 for i in range(400) if i % 50 or i < 100)
    wait_until(lambda: len(handled) >= others, 30, "every record of the other keys")
    stuck = blocked[0]
    same_shard = sorted(int(r.sequence_number) for r in handled if r.shard_id == stuck.shard_id)
    before = max(s for s in same_shard if s < int(stuck.sequence_number))
    assert any(s > int(stuck.sequence_number) for s in same_shard), "nothing done after it"
    wait_until(
        lambda: checkpoints(config, stream).get(stuck.shard_id) == before,
        10,
        "the checkpoint at the record before the blocked one",
        lambda: f"{checkpoints(config, stream)} blocked at {stuck.sequence_number}",
    )
    time.sleep(2 * config.commit_interval)  # flushes happen; the mark must not move
    assert checkpoints(config, stream)[stuck.shard_id] == before
    release.set()
    wait_until(
        lambda: (checkpoints(config, stream)[stuck.shard_id] or 0) >= same_shard[-1],
        10,
        "the checkpoint past the released record",
    )
    run.stop()


def test_handler_failure_is_raised_after_a_clean_close(group: dict[str, Any]) -> None:
    """The default policy stops: run() raises the handler's own exception, the consumer is
    closed, and the failing record's shard is checkpointed before it."""
    config, stream, url = group["config"], group["stream"], group["url"]
    put(url, stream, 0, 300, key=lambda i: f"k{i % 30}")
    failing: list[Record] = []

    class Boom(Exception):
        pass

    def handle(record: Record) -> None:
        if int(record.data) == 150:
            failing.append(record)
            raise Boom("no")
        time.sleep(0.001)

    consumer = Kinesumer(config)
    with pytest.raises(Boom) as raised:
        consumer.run([stream], handle, concurrency=4, ordering="key")
    assert any("handle" in note for note in raised.value.__notes__)
    assert consumer.stats().state == "closed"
    (counts,) = consumer.stats().handled.values()
    assert counts["failed"] == 1
    record = failing[0]
    mark = checkpoints(config, stream).get(record.shard_id)
    assert mark is None or mark < int(record.sequence_number)
    # The next run delivers the failing record again.
    again: list[Record] = []
    second = Kinesumer(config)
    run = Run(second, [stream], again.append)
    wait_until(
        lambda: any(r.sequence_number == record.sequence_number for r in again), 30, "re-delivery"
    )
    run.stop()


def test_batch_sizes_under_a_saturating_load(group: dict[str, Any]) -> None:
    """A slow batch handler with every slot busy: records queue up and batches reach max_size;
    none is larger."""
    config, stream, url = group["config"], group["stream"], group["url"]
    total = 1000
    put(url, stream, 0, total, key=lambda i: f"k{i}")
    sizes: list[int] = []
    count = [0]
    lock = threading.Lock()

    def handle(records: list[Record]) -> None:
        time.sleep(0.02)
        with lock:
            sizes.append(len(records))
            count[0] += len(records)

    consumer = Kinesumer(config)
    run = Run(
        consumer, [stream], handle, concurrency=2, ordering="none", batch=Batch(25, max_wait=0.5)
    )
    wait_until(lambda: count[0] >= total, 60, "every record handled")
    run.stop()
    assert max(sizes) == 25
    full = sum(1 for size in sizes if size == 25)
    assert full * 25 >= total * 0.8, f"batches did not fill: {sizes}"


async def test_async_run_orders_keys_and_stops_on_aclose(group: dict[str, Any]) -> None:
    """AsyncKinesumer.run with 32 tasks: per-key order, every record once, aclose() from
    another task ends it with the checkpoints at each shard's last record."""
    config, stream = group["config"], group["stream"]
    total = 600
    put(group["url"], stream, 0, total, key=lambda i: f"k{i % 61}")
    seen: dict[str, list[int]] = defaultdict(list)
    busy: set[str] = set()
    overlaps: list[str] = []
    last_of_shard: dict[str, int] = {}
    rng = random.Random(11)

    async def handle(record: Record) -> None:
        key = record.partition_key
        if key in busy:
            overlaps.append(key)
        busy.add(key)
        await asyncio.sleep(rng.random() * 0.004)
        busy.discard(key)
        seen[key].append(int(record.data))
        sequence = int(record.sequence_number)
        last_of_shard[record.shard_id] = max(last_of_shard.get(record.shard_id, 0), sequence)

    consumer = AsyncKinesumer(config)
    run = asyncio.create_task(consumer.run([stream], handle, concurrency=32, ordering="key"))
    await eventually(lambda: sum(map(len, seen.values())) >= total, 60, "every record handled")
    await consumer.aclose()
    await asyncio.wait_for(run, 30)
    assert not overlaps
    for key, numbers in seen.items():
        assert numbers == sorted(numbers), f"key {key} out of order: {numbers}"
    assert sorted(n for numbers in seen.values() for n in numbers) == list(range(total))
    assert checkpoints(config, stream) == last_of_shard
    assert list(consumer.stats().handled.values()) == [{"ok": total}]


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_async_handler_failure_is_raised(group: dict[str, Any], concurrency: int) -> None:
    """Inline (concurrency 1) and in tasks: the handler's exception comes out of run() after
    the consumer closed, the failing record's shard checkpointed before it."""
    config, stream = group["config"], group["stream"]
    put(group["url"], stream, 0, 200)
    failing: list[Record] = []

    async def handle(record: Record) -> None:
        if int(record.data) == 120:
            failing.append(record)
            raise KeyError("missing")

    consumer = AsyncKinesumer(config)
    with pytest.raises(KeyError):
        await consumer.run([stream], handle, concurrency=concurrency)
    assert consumer.stats().state == "closed"
    mark = checkpoints(config, stream).get(failing[0].shard_id)
    assert mark is None or mark < int(failing[0].sequence_number)


async def test_async_run_rejects_a_plain_function(group: dict[str, Any]) -> None:
    consumer = AsyncKinesumer(group["config"])
    with pytest.raises(ConfigError, match=r"run\(handler\)"):
        await consumer.run([group["stream"]], print)
    await consumer.aclose()


async def test_async_batches_keep_shard_order(group: dict[str, Any]) -> None:
    """Batch handler in tasks, ordering by shard: batches of at most max_size, a partial one
    after max_wait (95 is not a multiple of 10), each shard's records in order."""
    config, stream = group["config"], group["stream"]
    put(group["url"], stream, 0, 95)
    sizes: list[int] = []
    by_shard: dict[str, list[int]] = defaultdict(list)

    async def handle(records: list[Record]) -> None:
        sizes.append(len(records))
        for record in records:
            by_shard[record.shard_id].append(int(record.sequence_number))
        await asyncio.sleep(0.01)

    consumer = AsyncKinesumer(config)
    run = asyncio.create_task(
        consumer.run([stream], handle, concurrency=2, batch=Batch(10, max_wait=0.05))
    )
    await eventually(lambda: sum(sizes) >= 95, 30, "every record handled")
    await consumer.aclose()
    await asyncio.wait_for(run, 30)
    assert sum(sizes) == 95 and max(sizes) <= 10
    for shard, sequences in by_shard.items():
        assert sequences == sorted(sequences), f"{shard} out of order"
