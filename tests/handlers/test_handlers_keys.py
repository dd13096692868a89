"""Few keys, several shards: ``run(ordering="key")`` lets every shard's keys into the in-flight
window (issue 23). The engine hands out one shard's GetRecords batch at a time; admitted alone,
a large batch filled the whole ``max_in_flight`` bound with that shard's few keys and the other
shards' keys waited until nearly all of it had started. Now the dispatcher holds the batches of
several shards and shares the bound out among them, keeping the bound and the low-water marks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from support.group import create_stream, make_config, put, setup_table
from support.handlers import Run, checkpoints
from support.wait import wait_until

from kinesumer import Config, Kinesumer, Record
from kinesumer.handlers.dispatch import Dispatch
from kinesumer.handlers.options import run_options
from kinesumer.models import Checkpoint
from kinesumer.read.delivery import Cursor
from kinesumer.read.progress import ShardLease, shard_lease

#: Two partition keys that hash to the two shards of a 2-shard stream (MD5, as Kinesis does).
KEY_OF_SHARD = {"shardId-000000000000": "key-1", "shardId-000000000001": "key-0"}


def test_a_second_shards_key_starts_before_the_first_shards_backlog(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    """3,000 records of one key on each of two shards, concurrency 8: the second shard's key
    starts while the first's backlog is still queued (it waited for ~2,900 of them before), per
    key order holds, every record once, checkpoints at each shard's last record."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    per_key = 3000
    keys = sorted(KEY_OF_SHARD.values())
    put(kinesalite.url, stream, 0, 2 * per_key, key=lambda i: keys[i % 2])
    lock = threading.Lock()
    seen: dict[str, list[int]] = {key: [] for key in keys}
    #: How many records of the first key had started when the other key's first one started.
    first_key_before_second: list[int] = []
    last_of_shard: dict[str, int] = {}

    def handle(record: Record) -> None:
        with lock:
            mine = seen[record.partition_key]
            other = seen[keys[1 - keys.index(record.partition_key)]]
            if not mine and other:
                first_key_before_second.append(len(other))
            mine.append(int(record.data))
            sequence = int(record.sequence_number)
            last_of_shard[record.shard_id] = max(last_of_shard.get(record.shard_id, 0), sequence)
        time.sleep(0.001)

    consumer = Kinesumer(config)
    run = Run(consumer, [stream], handle, concurrency=8, ordering="key")
    wait_until(lambda: sum(map(len, seen.values())) >= 2 * per_key, 120, "every record handled")
    run.stop()
    assert first_key_before_second, "the two keys started at the same moment"
    assert first_key_before_second[0] < per_key // 2, (
        f"the second shard's key waited for {first_key_before_second[0]} records of the first"
    )
    for key, numbers in seen.items():
        assert numbers == sorted(numbers), f"key {key} out of order"
    every = sorted(n for numbers in seen.values() for n in numbers)
    assert every == list(range(2 * per_key)), "a record was lost or handled twice"
    assert checkpoints(config, stream) == last_of_shard


def lease(shard: str) -> ShardLease:
    return shard_lease(Checkpoint("s", shard, owner="me", lease=1))


def records(shard: str, key: str, count: int, start: int = 0) -> list[Record]:
    return [
        Record(
            stream="s",
            shard_id=shard,
            sequence_number=str(1000 + i),
            sub_sequence_number=0,
            partition_key=key,
            data=b"%d" % i,
            approximate_arrival_timestamp=None,
        )
        for i in range(start, start + count)
    ]


def dispatcher(hold: int, **options: Any) -> Dispatch:
    every = {"batch": None, "decode": None, "sink": None, "name": None, "on_failure": None}
    every.update(options)
    made = run_options(lambda record: None, is_async=False, **every)
    return Dispatch(made, Cursor(auto_commit=True), hold)


def test_the_dispatcher_shares_the_bound_among_the_leases_and_holds_at_most_hold() -> None:
    dispatch = dispatcher(
        hold=300, concurrency=4, ordering="key", max_in_flight=10, on_failure=None
    )
    a, b = lease("shard-a"), lease("shard-b")
    dispatch.set_batch(a, records("shard-a", "ka", 200))
    dispatch.admit()
    assert dispatch.scheduler.room() == 0
    assert dispatch.wants_records, "a pending batch of another lease may come"
    dispatch.set_batch(b, records("shard-b", "kb", 200))
    dispatch.admit()
    assert not dispatch.wants_records, "400 records pending: no more than hold (300)"
    started = [dispatch.next_call(0.0), dispatch.next_call(0.0)]
    assert [call.keys for call in started if call is not None] == [[("s", "ka")]]
    # Room freed by a's call is shared between a and b: b's key starts next.
    assert started[0] is not None
    tracked = started[0].items[0].tracker
    for entry in started[0].items:
        tracked.finish(entry)
    dispatch.finished(started[0], None)
    dispatch.admit()
    keys = []
    while (call := dispatch.next_call(0.0)) is not None:
        keys += call.keys
    assert ("s", "kb") in keys
    assert dispatch.scheduler.room() >= 0, "the in-flight bound holds"
    # Dropping a lease forgets its pending batches too.
    dispatch.drop(b)
    assert dispatch.wants_records


def test_a_shard_with_few_keys_does_not_fill_the_window() -> None:
    """Shard a has one key, shard b five; both have long backlogs. Each round every call in
    flight finishes and the freed room is admitted again: a drains one record a round, b five.
    Shared by records admitted, a's backlog grew until it held nearly the whole window and b ran
    one key at a time; shared by records held, b keeps its five keys busy."""
    dispatch = dispatcher(hold=10_000, concurrency=6, ordering="key", max_in_flight=12)
    a, b = lease("shard-a"), lease("shard-b")
    dispatch.set_batch(a, records("shard-a", "ka", 1000))
    dispatch.set_batch(
        b,
        [
            record._replace(partition_key=f"kb{i % 5}")
            for i, record in enumerate(records("shard-b", "", 1000))
        ],
    )
    calls_of = {"shard-a": 0, "shard-b": 0}
    running: list[Any] = []
    for _ in range(60):
        for call in running:
            for entry in call.items:
                entry.tracker.finish(entry)
            dispatch.finished(call, None)
        dispatch.admit()
        assert dispatch.scheduler.room() >= 0, "the in-flight bound holds"
        running = []
        while (call := dispatch.next_call(0.0)) is not None:
            running.append(call)
            calls_of[call.items[0].record.shard_id] += 1
    assert calls_of["shard-a"] <= 60
    assert calls_of["shard-b"] >= 4 * 55, calls_of


def test_held_batches_are_bounded_by_bytes_too() -> None:
    """The batches the runner holds have left the engine's buffer, and its byte bound
    (Config.max_buffered_bytes) with them: counted by records only, 20 000 held records of
    100 KB would be 2 GB past a 64 MB bound. The runner holds batches up to the byte bound too
    (and, as before, one batch past it)."""
    dispatch = dispatcher(hold=20_000, concurrency=4, ordering="key", max_in_flight=10)
    config = Config("app", "state")
    bounded = Dispatch(
        dispatch.options,
        dispatch.cursor,
        config.max_buffered_records,
        hold_bytes=config.max_buffered_bytes,
    )
    big = b"x" * 100_000
    taken, leases = 0, []
    while bounded.wants_records and taken < 20_000:  # the engine hands out batches of 500
        leases.append(lease(f"shard-{taken // 500}"))
        batch = [r._replace(data=big) for r in records(leases[-1].key[1], f"k{taken}", 500)]
        bounded.set_batch(leases[-1], batch)
        bounded.admit()
        taken += 500
    held = taken - bounded.scheduler.admitted
    assert held * len(big) <= config.max_buffered_bytes + 500 * len(big), held
    # Once the held batches are gone (their shards dropped), more are asked for again.
    for held_lease in leases:
        bounded.drop(held_lease)
    assert bounded.wants_records
