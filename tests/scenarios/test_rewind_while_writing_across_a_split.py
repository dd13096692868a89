"""A rewind to a time while two members run, records keep arriving, and a shard was split after
that time (kinesalite + dynalite; the members are asyncio tasks of this process, each its own
:class:`~kinesumer.AsyncKinesumer` with its own clients and rebalance hooks).

A writer thread puts numbered records without pause (data ``b"<n>"``, 32 partition keys spread
over the hash range, each key at most once per PutRecords call so that a key's records arrive
in the order they were numbered). Mid-way the first shard is split in two. The rewind's time
``T`` is the ApproximateArrivalTimestamp of a record put before the split (Kinesis's clock:
kinesalite stamps arrivals itself), taken in whole milliseconds, so that records in ``T``'s own
millisecond (its PutRecords batch) exist: the docs say a record that arrived in the given
millisecond is read again, so the boundary is ``arrival_ms >= T`` (included) and ``arrival_ms <
T`` (excluded), both with records on each side. The writer goes on after the rewind, then
stops, and the test waits until everything is delivered.

What "after the move" means (an order of events the test observes, not a clock): every
delivery, and every ``on_assigned`` / ``on_revoked`` hook call, is appended to one log in the
order the event loop ran them, and the rewind's start is marked in it. A **run** is a member's
deliveries of a shard since its last ``on_assigned`` or ``on_revoked`` for that shard. A
shard's **move point** is the first ``on_assigned`` for it logged after the rewind began (the
rewind removes every moved shard's owner, so the shard must be claimed again, and a claim
calls ``on_assigned`` before the first record). A delivery is **after the move** when its run
began at or after the move point; deliveries the old reader made before it noticed the move
are not (they came after its old position, later than ``T``, and are at-least-once repeats).

Asserted:

- every record put is delivered at least once;
- after the move, every record of the shard with arrival >= T is delivered (again), and none
  with arrival < T;
- within each run, the shard's sequence numbers rise and each key's numbers rise;
- parents before children after the rewind: every child delivery after the child's move comes
  after the parent's last delivery after its move (which reopened it: it was finished).

Nothing asserts on timing; every wait is for a state, bounded (``WAIT``) far above what an idle
machine needs (the whole test: about 10-15 s).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from support.group import create_stream, kinesis, make_config, setup_table, state_store
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import AsyncKinesumer, Config, Record
from kinesumer.admin import rewind_stream

Names = Callable[[str], str]

#: Bound of every wait (an idle machine needs a few seconds at most for any of them).
WAIT = 60.0
#: Partition keys: md5 spreads them over the hash range (checked: each shard gets some).
KEYS = [f"key-{i:02d}" for i in range(32)]
#: Records per PutRecords call (distinct keys: a key's records arrive in number order).
BATCH = 8
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

Event = tuple[str, str, Any]  # ("record", client id, Record) | ("assigned"/"revoked", id, shard)


def ms_of(arrival: datetime | None) -> int:
    """Whole epoch milliseconds of an arrival stamp (exact: no float rounding)."""
    assert arrival is not None
    return (arrival - EPOCH) // timedelta(milliseconds=1)


def instant(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def key_hash(key: str) -> int:
    return int(hashlib.md5(key.encode()).hexdigest(), 16)


class Writer(threading.Thread):
    """Puts numbered records continuously until stopped; ``count`` records put so far."""

    def __init__(self, url: str, stream: str) -> None:
        super().__init__(daemon=True)
        self.client = kinesis(url)
        self.stream = stream
        self.count = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                numbers = range(self.count, self.count + BATCH)
                answer = self.client.put_records(
                    StreamName=self.stream,
                    Records=[
                        {"Data": str(n).encode(), "PartitionKey": KEYS[n % len(KEYS)]}
                        for n in numbers
                    ],
                )
                assert answer.get("FailedRecordCount", 0) == 0, answer
                self.count += BATCH
                time.sleep(0.02)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(WAIT)
        assert not self.is_alive()
        assert self.error is None, self.error


class LoggedMember:
    """A member whose deliveries and rebalance hooks all go to one shared log."""

    def __init__(self, config: Config, stream: str, log: list[Event]) -> None:
        self.log = log
        self.stream = stream
        self.consumer = AsyncKinesumer(
            config, on_assigned=self._hook("assigned"), on_revoked=self._hook("revoked")
        )
        self.task: asyncio.Task[None] | None = None

    def _hook(self, kind: str) -> Callable[[list[tuple[str, str]]], None]:
        def hook(shards: list[tuple[str, str]]) -> None:
            for _, shard_id in shards:
                self.log.append((kind, self.consumer.client_id, shard_id))

        return hook

    def start(self) -> LoggedMember:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for record in self.consumer.consume([self.stream]):
            self.log.append(("record", self.consumer.client_id, record))

    def failed(self) -> BaseException | None:
        if self.task is not None and self.task.done() and not self.task.cancelled():
            return self.task.exception()
        return None

    async def close(self) -> None:
        await self.consumer.aclose()
        if self.task is not None:
            await asyncio.wait_for(self.task, WAIT)


def records(log: list[Event]) -> list[tuple[int, str, Record]]:
    return [(i, cid, r) for i, (kind, cid, r) in enumerate(list(log)) if kind == "record"]


def runs(log: list[Event]) -> dict[tuple[str, str, int], list[tuple[int, Record]]]:
    """(client id, shard id, index of the hook call that began it) -> the run's deliveries
    (log index, record); a run before any hook call begins at -1."""
    began: dict[tuple[str, str], int] = {}
    found: dict[tuple[str, str, int], list[tuple[int, Record]]] = defaultdict(list)
    for i, (kind, cid, payload) in enumerate(list(log)):
        if kind in ("assigned", "revoked"):
            began[(cid, payload)] = i
        elif kind == "record":
            start = began.get((cid, payload.shard_id), -1)
            found[(cid, payload.shard_id, start)].append((i, payload))
    return found


def move_points(log: list[Event], rewind_at: int) -> dict[str, int]:
    """Shard id -> log index of its first ``on_assigned`` after the rewind began."""
    points: dict[str, int] = {}
    for i, (kind, _, shard_id) in enumerate(list(log)):
        if i > rewind_at and kind == "assigned":
            points.setdefault(shard_id, i)
    return points


def after_move(log: list[Event], rewind_at: int) -> dict[str, list[tuple[int, Record]]]:
    """Shard id -> its deliveries after the move (in runs that began at or after it)."""
    points = move_points(log, rewind_at)
    found: dict[str, list[tuple[int, Record]]] = defaultdict(list)
    for (_, shard_id, start), run in runs(log).items():
        if shard_id in points and start >= points[shard_id]:
            found[shard_id] += run
    return {shard_id: sorted(run, key=lambda x: x[0]) for shard_id, run in found.items()}


async def test_a_rewind_while_writing_replays_exactly_from_the_time_across_a_split(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names
) -> None:
    url = kinesalite.url
    config = make_config(url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("stream")
    create_stream(url, stream, 2)
    client = kinesis(url)
    first = min(client.list_shards(StreamName=stream)["Shards"], key=lambda s: s["ShardId"])
    parent = first["ShardId"]
    low, high = (int(first["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    middle = (low + high) // 2 + 1
    # Each shard, before and after the split, gets keys (md5 is fixed: this checks the list).
    assert sum(low <= key_hash(k) < middle for k in KEYS) >= 2
    assert sum(middle <= key_hash(k) <= high for k in KEYS) >= 2
    assert sum(key_hash(k) > high for k in KEYS) >= 2

    log: list[Event] = []
    members = [LoggedMember(config, stream, log).start() for _ in range(2)]
    writer = Writer(url, stream)

    def delivered() -> dict[bytes, Record]:
        return {r.data: r for _, _, r in records(log)}

    def healthy() -> str:
        errors = [m.failed() for m in members] + [writer.error]
        return f"errors: {[e for e in errors if e is not None]}; put {writer.count}"

    async def until(predicate: Callable[[], bool], what: str) -> None:
        def check() -> bool:
            assert writer.error is None and not any(m.failed() for m in members), healthy()
            return predicate()

        await eventually(check, WAIT, what, healthy, interval=0.05)

    try:
        writer.start()
        await until(lambda: writer.count >= 400, "400 records put")
        await until(
            lambda: {str(n).encode() for n in range(400)} <= delivered().keys(),
            "the first 400 records delivered",
        )
        # T: the arrival (whole ms) of record 150; its batch shares that millisecond.
        seen = delivered()
        t_ms = ms_of(seen[b"150"].approximate_arrival_timestamp)
        assert any(ms_of(r.approximate_arrival_timestamp) < t_ms for r in seen.values())

        client.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(middle))
        await asyncio.to_thread(
            client.get_waiter("stream_exists").wait,
            StreamName=stream,
            WaiterConfig={"Delay": 0.1, "MaxAttempts": 600},
        )
        shards = {s["ShardId"] for s in client.list_shards(StreamName=stream)["Shards"]}
        children = sorted(shards - {parent, "shardId-000000000001"})
        assert len(children) == 2, shards

        async with state_store(config) as store:

            async def settled() -> bool:
                """The parent finished, every open shard read and checkpointed past T."""
                items = await store.get_checkpoints(stream)
                if not (parent in items and items[parent].finished):
                    return False
                for shard_id in [*children, "shardId-000000000001"]:
                    item = items.get(shard_id)
                    if item is None or item.sequence_number is None:
                        return False
                    past = [
                        r
                        for r in delivered().values()
                        if r.shard_id == shard_id and ms_of(r.approximate_arrival_timestamp) >= t_ms
                    ]
                    if not any(int(item.sequence_number) >= int(r.sequence_number) for r in past):
                        return False
                return True

            deadline = time.monotonic() + WAIT
            while not await settled():
                assert time.monotonic() < deadline, (
                    f"the group to settle after the split; {healthy()}"
                )
                assert writer.error is None and not any(m.failed() for m in members), healthy()
                await asyncio.sleep(0.1)

        rewind_at = len(log)
        log.append(("rewind", "", t_ms))
        result = await rewind_stream(config, stream, to_time=instant(t_ms))
        assert result.instant_ms == t_ms
        assert set(result.moved) >= {parent, *children, "shardId-000000000001"}, result
        put_at_rewind = writer.count
        await until(lambda: writer.count >= put_at_rewind + 400, "400 more records put")
        writer.stop()
        put = {str(n).encode() for n in range(writer.count)}

        def not_replayed() -> dict[str, list[bytes]]:
            """Shard id -> its records at or after T not delivered after its move (yet)."""
            later = after_move(log, rewind_at)
            found = {}
            for shard_id in shards:
                due = {
                    r.data
                    for r in delivered().values()
                    if r.shard_id == shard_id and ms_of(r.approximate_arrival_timestamp) >= t_ms
                }
                due -= {r.data for _, r in later.get(shard_id, [])}
                if due:
                    found[shard_id] = sorted(due, key=int)[:10]
            return found

        def replayed() -> bool:
            return put <= delivered().keys() and not not_replayed()

        def missing() -> str:
            gone = sorted(put - delivered().keys(), key=int)[:20]
            return (
                f"T {t_ms}; never delivered: {gone}; not replayed: {not_replayed()}; "
                f"move points {move_points(log, rewind_at)}"
            )

        await eventually(replayed, WAIT, "every record delivered, and replayed from T", missing)
    finally:
        writer.halt.set()
        for member in members:
            await member.close()
        writer.join(WAIT)
    assert all(m.failed() is None for m in members)

    # Every record put delivered at least once.
    everything = delivered()
    assert put <= everything.keys()
    arrival = {d: ms_of(r.approximate_arrival_timestamp) for d, r in everything.items()}
    # The boundary: records on both sides of T, and some in T's own millisecond.
    assert any(ms < t_ms for ms in arrival.values())
    in_t = [d for d, ms in arrival.items() if ms == t_ms]
    assert b"150" in in_t

    later = after_move(log, rewind_at)
    points = move_points(log, rewind_at)
    assert set(points) >= shards, points  # every shard was claimed again after the rewind
    for shard_id in shards:
        got = {r.data for _, r in later[shard_id]}
        due = {d for d, r in everything.items() if r.shard_id == shard_id and arrival[d] >= t_ms}
        assert due <= got, (shard_id, sorted(due - got, key=int)[:20])
        early = sorted((d for d in got if arrival[d] < t_ms), key=int)
        assert not early, (shard_id, early[:20])
    assert set(in_t) <= {r.data for run in later.values() for _, r in run}

    # Within each run: the shard's sequence numbers rise, and each key's numbers rise.
    for (cid, shard_id, start), run in runs(log).items():
        numbers = [int(r.sequence_number) for _, r in run]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), (
            cid,
            shard_id,
            start,
        )
        by_key: dict[str, list[int]] = defaultdict(list)
        for _, r in run:
            by_key[r.partition_key].append(int(r.data))
        for key, ns in by_key.items():
            assert ns == sorted(ns) and len(set(ns)) == len(ns), (cid, shard_id, key)

    # Parents before children after the rewind.
    assert later[parent], "the reopened parent was read again"
    last_of_parent = max(i for i, _ in later[parent])
    for child in children:
        assert min(i for i, _ in later[child]) > last_of_parent, child
    print(
        f"rewind across a split: {len(put)} records put, {len(records(log))} deliveries, "
        f"{len(in_t)} in T's millisecond, "
        f"{sum(len(v) for v in later.values())} after the move"
    )
