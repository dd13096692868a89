"""A whole group in one process, on kinesumer.testing's MemoryKinesis and MemoryState: what a
user's own test does (docs/testing.md). Members share the in-memory stream and state table as
processes share AWS's; nothing here opens a socket.

The waits are for events (every record seen, a shard claimed) with long bounds: the group's
timers (heartbeats, commits) run on the real clock, so a busy machine only makes them slower.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest

from kinesumer import AsyncKinesumer, Config, ConfigError, Kinesumer
from kinesumer.handlers.deadletter import read_envelope
from kinesumer.handlers.policies import DeadLetter, Retry
from kinesumer.models import Record
from kinesumer.sinks import DynamoDBTransactions
from kinesumer.testing import MemoryKinesis, MemoryState

STREAM = "orders"
WAIT = 60.0  # a bound for a busy machine, not a figure: the group needs about a second


def config(client_id: str) -> Config:
    return Config(
        app="shop",
        dynamodb_table="kinesumer-state",
        region="us-east-1",
        client_id=client_id,
        initial_position="TRIM_HORIZON",
        heartbeat_interval=0.5,
        client_timeout=5.0,
        commit_interval=0.2,
    )


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT:.0f} s: {what}")
        time.sleep(0.05)


def put(memory: MemoryKinesis, first: int, last: int, keys: int = 13) -> list[bytes]:
    """Records ``first``..``last - 1``, each ``key:index`` under partition key ``key``."""
    sent = []
    for index in range(first, last):
        data = f"k{index % keys}:{index}".encode()
        memory.put(STREAM, data, f"k{index % keys}")
        sent.append(data)
    return sent


def in_key_order(seen: list[bytes]) -> bool:
    """Every key's records arrived in the order they were put."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for data in seen:
        key, index = data.decode().split(":")
        by_key[key].append(int(index))
    return all(indexes == sorted(indexes) for indexes in by_key.values())


class Members:
    """Members running ``run(STREAM, handler)`` on threads of their own, closed at the end."""

    def __init__(self, memory: MemoryKinesis, state: MemoryState) -> None:
        self.memory, self.state = memory, state
        self.seen: list[bytes] = []
        self.lock = threading.Lock()
        self.running: dict[str, tuple[Kinesumer, threading.Thread]] = {}
        self.failures: list[BaseException] = []

    def handler(self, record: Record) -> None:
        with self.lock:
            self.seen.append(record.data)

    def start(self, client_id: str, **run: object) -> Kinesumer:
        member = Kinesumer(config(client_id), kinesis=self.memory, state=self.state)

        def run_member() -> None:
            try:
                member.run([STREAM], self.handler, **run)  # type: ignore[arg-type]
            except BaseException as exc:  # reported by the test, not lost on the thread
                self.failures.append(exc)

        thread = threading.Thread(target=run_member, name=client_id, daemon=True)
        thread.start()
        self.running[client_id] = (member, thread)
        return member

    def close(self, client_id: str) -> None:
        member, thread = self.running.pop(client_id)
        member.close()
        thread.join(WAIT)
        assert not thread.is_alive(), f"{client_id}'s run() did not end after close()"

    def shards_of(self, client_id: str) -> set[str]:
        member = self.running[client_id][0]
        return {s.shard_id for s in member.stats().shards if s.status == "active"}

    def seen_set(self) -> set[bytes]:
        with self.lock:
            return set(self.seen)

    def close_all(self) -> None:
        for client_id in list(self.running):
            self.close(client_id)
        assert not self.failures, self.failures


@pytest.fixture
def memory() -> MemoryKinesis:
    kinesis = MemoryKinesis()
    kinesis.create_stream(STREAM, shards=4)
    return kinesis


@pytest.fixture
def group(memory: MemoryKinesis) -> Iterator[Members]:
    members = Members(memory, MemoryState())
    yield members
    members.close_all()


def test_two_members_split_the_shards_and_read_every_record_in_key_order(
    memory: MemoryKinesis, group: Members
) -> None:
    sent = put(memory, 0, 300)
    group.start("m1")
    group.start("m2")
    until(lambda: group.seen_set() == set(sent), "every record read")
    until(
        lambda: len(group.shards_of("m1")) == len(group.shards_of("m2")) == 2,
        "each member holds two of the four shards",
    )
    assert group.shards_of("m1").isdisjoint(group.shards_of("m2"))
    assert len(group.seen) == len(sent)  # no record read twice
    assert in_key_order(group.seen)


def test_a_member_that_closes_hands_its_shards_over_where_reading_stopped(
    memory: MemoryKinesis, group: Members
) -> None:
    first = put(memory, 0, 200)
    group.start("m1")
    group.start("m2")
    until(lambda: group.seen_set() >= set(first), "the first records read")
    until(lambda: len(group.shards_of("m2")) == 2, "m2 holds its two shards")
    group.close("m2")  # a graceful close: the processed positions are checkpointed, then freed
    later = put(memory, 200, 400)
    until(lambda: group.seen_set() >= set(later), "m1 reads the shards m2 held")
    until(lambda: len(group.shards_of("m1")) == 4, "m1 holds all four shards")
    assert len(group.seen) == len(first) + len(later)  # the handover read nothing twice
    assert in_key_order(group.seen)


def test_a_split_shard_is_read_to_its_end_before_its_children(
    memory: MemoryKinesis, group: Members
) -> None:
    before = put(memory, 0, 100)
    group.start("m1")
    until(lambda: group.seen_set() >= set(before), "the records before the split read")
    # shardId-000000000000 covers the first quarter of the hash keys: split it in its middle.
    memory.split_shard(STREAM, "shardId-000000000000", 2**125)
    after = put(memory, 100, 300)
    until(lambda: group.seen_set() >= set(before + after), "the records after the split read")
    until(
        lambda: {"shardId-000000000004", "shardId-000000000005"} <= group.shards_of("m1"),
        "the split's children claimed",
    )
    assert len(group.seen) == len(before) + len(after)
    assert in_key_order(group.seen)  # a key of the parent: its records there come first


def test_failed_records_go_to_a_dead_letter_stream_of_the_same_memory(
    memory: MemoryKinesis, group: Members
) -> None:
    memory.create_stream("orders-dead", shards=1)
    failing = b"k3:3"

    def handler(record: Record) -> None:
        if record.data == failing:
            raise ValueError("bad order")
        group.handler(record)

    sent = put(memory, 0, 50)
    member = Kinesumer(config("m1"), kinesis=memory, state=group.state)
    thread = threading.Thread(
        target=member.run,
        args=([STREAM], handler),
        kwargs={"on_failure": DeadLetter("orders-dead", Retry(attempts=1))},
        daemon=True,
    )
    thread.start()
    try:
        until(lambda: group.seen_set() == set(sent) - {failing}, "the other records handled")
        until(lambda: len(memory.records("orders-dead")) == 1, "the failed record dead-lettered")
    finally:
        member.close()
        thread.join(WAIT)
    envelope = read_envelope(memory.records("orders-dead")[0].data)
    assert envelope.data == failing
    assert (envelope.error_type, envelope.error_message) == ("builtins.ValueError", "bad order")


def test_async_members_read_the_memory_stream(memory: MemoryKinesis) -> None:
    sent = put(memory, 0, 100)
    state = MemoryState()

    async def read_all() -> list[bytes]:
        seen: list[bytes] = []
        async with AsyncKinesumer(config("a1"), kinesis=memory, state=state) as consumer:
            async for record in consumer.consume([STREAM]):
                seen.append(record.data)
                if len(seen) == len(sent):
                    break
        return seen

    seen = asyncio.run(asyncio.wait_for(read_all(), WAIT))
    assert sorted(seen) == sorted(sent)
    assert in_key_order(seen)


def test_a_dynamodb_sink_refuses_a_memory_state_table_by_name(memory: MemoryKinesis) -> None:
    member = Kinesumer(config("m1"), kinesis=memory, state=MemoryState())
    try:
        with pytest.raises(ConfigError, match=r"run\(sink\).*state table in DynamoDB"):
            member.run([STREAM], lambda record, tx: None, sink=DynamoDBTransactions())
    finally:
        member.close()


def test_enhanced_fan_out_subscribes_through_the_memory_stream(memory: MemoryKinesis) -> None:
    sent = put(memory, 0, 100)
    efo = dataclasses.replace(config("m1"), enhanced_fan_out=True)
    member = Kinesumer(efo, kinesis=memory, state=MemoryState())
    try:
        seen: list[bytes] = []
        for record in member.consume([STREAM]):
            seen.append(record.data)
            if len(seen) == len(sent):
                break
        later = put(memory, 100, 150)  # pushed to the open subscriptions
        for record in member.consume([STREAM]):
            seen.append(record.data)
            if len(seen) == len(sent) + len(later):
                break
        assert sorted(seen) == sorted(sent + later)
        assert in_key_order(seen)
        assert not any(shard.efo_polling for shard in member.stats().shards)
        stream_arn = f"arn:aws:kinesis:{memory.region}:{memory.account}:stream/{STREAM}"
        consumers = asyncio.run(memory.list_stream_consumers(stream_arn))["Consumers"]
        assert [c["ConsumerName"] for c in consumers] == [efo.effective_consumer_name]
    finally:
        member.close()


def test_a_handler_that_fails_after_close_still_dead_letters_its_record(
    memory: MemoryKinesis,
) -> None:
    """A handler still running when close() returned (past ``handoff_timeout``) writes its
    dead letter after the member's loop stopped: the write is made, and run() ends cleanly."""
    memory.create_stream("orders-dead", shards=1)
    memory.put(STREAM, b"slow", "k")
    started, closed = threading.Event(), threading.Event()

    def handler(record: Record) -> None:
        started.set()
        closed.wait(WAIT)
        raise ValueError("failed after the close")

    quick_handoff = dataclasses.replace(config("m1"), handoff_timeout=0.5)
    member = Kinesumer(quick_handoff, kinesis=memory, state=MemoryState())
    failures: list[BaseException] = []

    def run() -> None:
        try:
            member.run([STREAM], handler, on_failure=DeadLetter("orders-dead", Retry(attempts=1)))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(WAIT)
    member.close()  # returns once handoff_timeout passed, the handler still in its call
    closed.set()
    thread.join(WAIT)
    assert not thread.is_alive(), "run() did not end after its handler's dead letter"
    assert failures == []
    assert [r.partition_key for r in memory.records("orders-dead")] == ["k"]


def test_kinesis_must_be_a_transport(memory: MemoryKinesis) -> None:
    import boto3

    client = boto3.client("kinesis", region_name="us-east-1")
    for kinesis in (object(), client):
        with pytest.raises(ConfigError, match=r"Kinesumer\(kinesis\): .* not a Kinesis transport"):
            Kinesumer(config("m1"), kinesis=kinesis, state=MemoryState())  # type: ignore[arg-type]


def test_a_deregistered_consumer_is_registered_again_and_reading_goes_on(
    memory: MemoryKinesis,
) -> None:
    """Deregistering the app's stream consumer ends its subscriptions (as on AWS): the member
    registers it again and resumes where it was, nothing read twice."""
    efo = dataclasses.replace(config("m1"), enhanced_fan_out=True)
    member = Kinesumer(efo, kinesis=memory, state=MemoryState())
    stream_arn = f"arn:aws:kinesis:{memory.region}:{memory.account}:stream/{STREAM}"
    seen: list[bytes] = []

    def read(count: int) -> None:
        deadline = time.monotonic() + WAIT
        while len(seen) < count and time.monotonic() < deadline:
            seen.extend(record.data for record in member.poll(100, 0.5))

    try:
        member.subscribe([STREAM])
        first = put(memory, 0, 40)
        read(len(first))
        asyncio.run(memory.deregister_stream_consumer(stream_arn, efo.effective_consumer_name))
        later = put(memory, 40, 80)
        read(len(first) + len(later))
        assert sorted(seen) == sorted(first + later)
        consumers = asyncio.run(memory.list_stream_consumers(stream_arn))["Consumers"]
        assert [c["ConsumerName"] for c in consumers] == [efo.effective_consumer_name]
    finally:
        member.close()


def test_weighted_assignment_on_a_given_state_store_says_it_assigns_by_range(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The load and weights items are the DynamoDB table's: a member given a MemoryState and
    configured ``weighted`` says at its join that it splits by range, and reads on."""
    memory, state = MemoryKinesis(), MemoryState()
    memory.create_stream(STREAM, shards=2)
    sent = put(memory, 0, 6)
    weighted = dataclasses.replace(config("m1"), assignment="weighted")
    seen: list[bytes] = []
    with (
        caplog.at_level("WARNING", logger="kinesumer"),
        Kinesumer(weighted, kinesis=memory, state=state) as consumer,
    ):
        for record in consumer.consume([STREAM]):
            seen.append(record.data)
            if len(seen) == len(sent):
                break
    assert sorted(seen) == sorted(sent)
    assert any("assigns by range" in r.getMessage() for r in caplog.records), caplog.text
