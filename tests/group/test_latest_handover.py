"""At ``LATEST`` (the default), whoever opens a shard first, every later owner starts at or
before that first open: a Spark query in the app's group (``shared_group=true``), a plain
member, an enhanced fan-out member and a ``foreach_batch`` driver, each handing the shard to each
other one at the worst moment: the first holder opened it, 20 records arrived and reached the
first holder's hands in a batch it never committed, and it stopped. The later owner must read all
20. On kinesis-local (enhanced fan-out) + dynalite, one shard.

The query is the source's driver side as Spark's source worker runs it (the planner with its
real group member) and its executors' reads (``read_records``), without a streaming query
around them: the handover then falls exactly between a batch's read and Spark's commit.

A later owner reads until a marker record, put after it began reading, arrives: one shard keeps
order, so whatever it did not read by then it never will.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.spark_source import checkpoints, local_spark
from support.wait import wait_until

from kinesumer import Config, Kinesumer
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.options import SourceOptions

FACES = ("query", "plain", "efo", "foreach_batch")
ORDERS = [(first, later) for first in FACES for later in FACES if first != later]
#: The longest any one step may take on a busy machine.
DEADLINE = 120.0


class Refused(Exception):
    """The first holder's batch function fails: its batch is never committed."""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark(app="kinesumer-latest-handover") as session:
        yield session


@dataclass
class World:
    config: Config
    stream: str
    url: str
    spark: Callable[[], Any]
    names: Iterator[int]

    def face_config(self, face: str) -> Config:
        """A member's Config (one app for all faces: one group)."""
        config = self.config.replace(client_id=f"{face}-{next(self.names)}")
        return config.replace(enhanced_fan_out=True) if face == "efo" else config

    def started_at(self) -> int | None:
        """The group checkpoint's recorded LATEST start of the only shard."""
        items = list(checkpoints(self.config, self.stream).values())
        if not items or "started_at" not in items[0]:
            return None
        return int(items[0]["started_at"]["N"])

    def put(self, start: int, count: int) -> list[bytes]:
        return put(self.url, self.stream, start, count)


@pytest.fixture
def world(
    kinesis_local: Any, dynalite: Any, unique_name: Any, request: pytest.FixtureRequest
) -> World:
    config = make_config(
        kinesis_local.url, dynalite.url, unique_name("app"), unique_name("state"),
        initial_position="LATEST",
    )  # fmt: skip
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesis_local.url, stream, 1)
    return World(
        config, stream, kinesis_local.url, lambda: request.getfixturevalue("spark"),
        itertools.count(1),
    )  # fmt: skip


# -- the query's driver and executors --------------------------------------------------------


def new_query(world: World) -> tuple[Planner, dict[str, Any]]:
    options = SourceOptions(config=world.face_config("query"), streams=(world.stream,),
                            shared_group=True)  # fmt: skip
    planner = Planner(options)
    return planner, planner.initial_offset()


def read_batch(planner: Planner, end: dict[str, Any]) -> list[bytes]:
    """The executors' reads of the batch ending at ``end`` (each partition pickled, as Spark
    ships it)."""
    out: list[bytes] = []
    for partition in planner.partitions(end):
        records = asyncio.run(read_records(pickle.loads(pickle.dumps(partition))))
        out.extend(r.data for r in records)
    return out


# -- first holders: open the shard, take the 20 records into a batch never committed, stop ----


def query_first(world: World) -> list[bytes]:
    planner, offset = new_query(world)
    try:
        first = planner.latest_offset(offset, None)
        assert first["batch"] == 1 and first["shards"], "the query planned the shard"
        sent = world.put(0, 20)
        read = read_batch(planner, first)  # Spark ran the batch; the query stops before its commit
        assert sorted(read) == sorted(sent)
        return sent
    finally:
        planner.close()


def member_first(world: World, face: str) -> list[bytes]:
    consumer = Kinesumer(world.face_config(face).replace(auto_commit=False))
    try:
        consumer.subscribe([world.stream])
        wait_until(lambda: world.started_at() is not None, DEADLINE, "the member opened the shard")
        sent = world.put(0, 20)
        got: list[bytes] = []
        wait_until(
            lambda: bool(got.extend(r.data for r in consumer.poll(100, 0.25)) or got),
            DEADLINE, "records in the member's hands",
        )  # fmt: skip
        return sent  # delivered, never committed
    finally:
        consumer.close(discard=True)


def foreach_batch_first(world: World) -> list[bytes]:
    from kinesumer.spark import foreach_batch

    spark = world.spark()
    seen: list[bytes] = []
    failures: list[BaseException] = []

    def refuse(df: Any, batch_id: int) -> None:
        seen.extend(bytes(row.data) for row in df.collect())
        raise Refused

    def run() -> None:
        try:
            foreach_batch(spark, world.face_config("foreach_batch"), [world.stream], refuse,
                          max_interval=0.5, handle_signals=False)  # fmt: skip
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: world.started_at() is not None, DEADLINE, "the driver opened the shard")
    sent = world.put(0, 20)
    thread.join(DEADLINE)
    assert not thread.is_alive() and failures and isinstance(failures[0], Refused)
    assert seen, "records reached the batch function"
    return sent


def hold_then_stop(world: World, face: str) -> list[bytes]:
    if face == "query":
        return query_first(world)
    if face == "foreach_batch":
        return foreach_batch_first(world)
    return member_first(world, face)


# -- later owners: read until a marker put after they began arrives ----------------------------


class Markers:
    """Marker records put every second once the later owner began (``b"marker-<n>"``)."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._count = 0
        self._last = 0.0

    def tick(self) -> None:
        if time.monotonic() - self._last >= 1.0:
            self._last = time.monotonic()
            kinesis(self._world.url).put_record(
                StreamName=self._world.stream, Data=b"marker-%d" % self._count, PartitionKey="m"
            )
            self._count += 1

    @staticmethod
    def arrived(got: list[bytes]) -> bool:
        return any(data.startswith(b"marker-") for data in got)


def query_later(world: World) -> list[bytes]:
    planner, offset = new_query(world)
    markers, got = Markers(world), []
    try:
        deadline = time.monotonic() + DEADLINE
        while not markers.arrived(got):
            assert time.monotonic() < deadline, f"no marker arrived; read {len(got)}"
            markers.tick()
            end = planner.latest_offset(offset, None)
            if end != offset:
                got += read_batch(planner, end)
                planner.commit(end)
                offset = end
            else:
                time.sleep(0.2)
        return got
    finally:
        planner.close()


def member_later(world: World, face: str) -> list[bytes]:
    markers, got = Markers(world), []
    with Kinesumer(world.face_config(face)) as consumer:
        consumer.subscribe([world.stream])
        deadline = time.monotonic() + DEADLINE
        while not markers.arrived(got):
            assert time.monotonic() < deadline, f"no marker arrived; read {len(got)}"
            markers.tick()
            got += [r.data for r in consumer.poll(100, 0.25)]
    return got


def foreach_batch_later(world: World) -> list[bytes]:
    from kinesumer.spark import foreach_batch

    spark, markers, got = world.spark(), Markers(world), []
    stop = threading.Event()

    def collect(df: Any, batch_id: int) -> None:
        got.extend(bytes(row.data) for row in df.collect())

    thread = threading.Thread(
        target=foreach_batch,
        args=(spark, world.face_config("foreach_batch"), [world.stream], collect),
        kwargs={"max_interval": 0.5, "stop": stop, "handle_signals": False},
        daemon=True,
    )
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while not markers.arrived(got):
            assert thread.is_alive(), "the driver ended"
            assert time.monotonic() < deadline, f"no marker arrived; read {len(got)}"
            markers.tick()
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(DEADLINE)
    return got


def read_after(world: World, face: str) -> list[bytes]:
    if face == "query":
        return query_later(world)
    if face == "foreach_batch":
        return foreach_batch_later(world)
    return member_later(world, face)


@pytest.mark.parametrize(("first", "later"), ORDERS, ids=[f"{a}-then-{b}" for a, b in ORDERS])
def test_the_later_owner_reads_what_reached_an_uncommitted_batch_of_the_first(
    world: World, first: str, later: str
) -> None:
    sent = hold_then_stop(world, first)
    got = read_after(world, later)
    missed = sorted(set(sent) - set(got), key=lambda data: int(data))
    assert not missed, f"{later} after {first}: {len(missed)} of {len(sent)} never read"


def test_a_query_whose_settled_batches_read_nothing_hands_its_start_to_a_plain_member(
    world: World,
) -> None:
    """The query settles a batch that read no record (no position to write) and stops; then
    records arrive while nobody holds the shard: the plain member that takes it reads them
    all, from the query's start, not from its own "now"."""
    planner, offset = new_query(world)
    try:
        first = planner.latest_offset(offset, None)
        assert first["shards"] and read_batch(planner, first) == []
        planner.latest_offset(first, None)  # settles batch 1 (nothing read: no position)
        planner.commit(first)
    finally:
        planner.close()
    recorded = world.started_at()
    sent = world.put(0, 20)
    got = read_after(world, "plain")
    missed = set(sent) - set(got)
    assert not missed, f"plain after an idle query: {len(missed)} of {len(sent)} never read"
    assert recorded is not None, "the start outlives a settled empty batch"
