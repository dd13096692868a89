"""The handover between enhanced fan-out and the polling interlude of a stalled shard, in
process (an in-memory shard behind both a fake GetRecords reader and a fake subscriber): where
the next subscription starts after polling, so that nothing is replayed or skipped.

The stall window and the polling period are shortened (module constants); the stall limit is
the default. Fast: no stand-in, no member process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pytest

from kinesumer.config import Config
from kinesumer.kinesis.kpl import to_records
from kinesumer.kinesis.reader import ShardBatch
from kinesumer.models import Checkpoint, Position, Record
from kinesumer.observability.metrics import Metrics
from kinesumer.read import efo_fallback, efo_fetcher
from kinesumer.read.buffer import RecordBuffer
from kinesumer.read.efo_fetcher import EfoShardFetcher
from kinesumer.read.progress import ShardLease, shard_lease

STREAM, SHARD = "s", "shardId-000000000000"


def raw(seq: int) -> dict[str, Any]:
    return {
        "SequenceNumber": str(seq),
        "PartitionKey": "k",
        "Data": b"r%d" % seq,
        "ApproximateArrivalTimestamp": datetime(2026, 1, 1, tzinfo=timezone.utc),
    }


class Refused(Exception):
    code = "ResourceInUseException"


@dataclass(frozen=True)
class Event:
    records: list[dict[str, Any]]
    continuation_sequence_number: str | None
    millis_behind_latest: int | None
    child_shards: list[dict[str, Any]] | None = None


@dataclass
class Shard:
    """One open shard's records, read by GetRecords (the reader's methods the interlude uses)
    and by subscriptions (refused while ``refusing``)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    refusing: bool = True
    positions: list[dict[str, Any]] = field(default_factory=list)

    def _index(self, kind: str, seq: str | None) -> int:
        seqs = [int(r["SequenceNumber"]) for r in self.records]
        if kind == "TRIM_HORIZON":
            return 0
        assert seq is not None
        at = next((i for i, s in enumerate(seqs) if s >= int(seq)), len(seqs))
        if kind == "AFTER_SEQUENCE_NUMBER" and at < len(seqs) and seqs[at] == int(seq):
            at += 1
        return at

    async def shard_iterator(
        self, stream: str, shard_id: str, after: Position | None, initial: Any
    ) -> str:
        if after is not None:
            return str(self._index("AT_SEQUENCE_NUMBER", after.sequence_number))
        assert initial == "TRIM_HORIZON", initial
        return "0"

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int, skip: Position | None
    ) -> ShardBatch[list[Record]]:
        start = int(iterator)
        batch = self.records[start : start + limit]
        return ShardBatch(
            records=to_records(stream, shard_id, batch, skip),
            next_iterator=str(start + len(batch)),
            millis_behind=0,
            raw_count=len(batch),
        )

    def subscribe(self, arn: str, shard_id: str, position: dict[str, Any]) -> AsyncIterator[Event]:
        self.positions.append(dict(position))
        return self._events(position)

    async def _events(self, position: dict[str, Any]) -> AsyncIterator[Event]:
        if self.refusing:
            raise Refused("refused")
        at = self._index(position["Type"], position.get("SequenceNumber"))
        while True:
            records = self.records[at:]
            at = len(self.records)
            last = self.records[-1]["SequenceNumber"] if self.records else "0"
            yield Event(records, last, 0)
            await asyncio.sleep(0.01)


async def read(buffer: RecordBuffer, count: int) -> list[Record]:
    got: list[Record] = []
    while len(got) < count:
        _, records, _ = await asyncio.wait_for(buffer.get(), 10)
        got.extend(records)
    return got


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(efo_fetcher, "STALL_AFTER", 0.3)
    monkeypatch.setattr(efo_fallback, "STALL_AFTER", 0.3)
    monkeypatch.setattr(efo_fallback, "POLL_FOR", 1.0)
    monkeypatch.setattr(efo_fetcher, "MIN_SUBSCRIBE_INTERVAL", 0.01)
    monkeypatch.setattr(efo_fetcher, "MAX_FAILURE_PAUSE", 0.01)


def fetcher(
    shard: Shard, lease: ShardLease, buffer: RecordBuffer, subscriber: Any = None
) -> EfoShardFetcher:
    """An enhanced fan-out fetcher of ``shard`` (subscriptions from ``subscriber`` if given)."""

    async def arn(stream: str) -> str:
        return "arn"

    async def parents_finished() -> bool:
        return True

    config = Config(app="a", dynamodb_table="state", enhanced_fan_out=True)
    return EfoShardFetcher(
        lease,
        subscriber or shard,
        arn,
        buffer,
        config,
        "LATEST",
        parents_finished,
        lambda _: None,
        "m",
        Metrics(),
        reader=shard,  # type: ignore[arg-type]
    )


async def stop(lease: ShardLease, task: asyncio.Task[None]) -> None:
    """As a handoff does: the lease ends, then the fetcher is cancelled (a cancellation alone
    can be lost in Python 3.11's ``asyncio.wait_for`` when the awaited event lands with it)."""
    lease.claim.begin_handoff()
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)


async def until(done: Callable[[], bool], what: str) -> None:
    """Until ``done()``, for at most 10 s."""
    for _ in range(1000):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_checkpointed_record_polled_again_is_not_replayed_by_the_next_subscription(
    quick: None,
) -> None:
    """Resumed from a checkpoint on an idle shard, the subscriptions stall: polling reads the
    checkpointed record again (skipped: it was processed) and nothing else. The subscription
    after polling must still skip it (AT the checkpoint) or start after it."""
    shard = Shard(records=[raw(100)])
    lease = shard_lease(Checkpoint(STREAM, SHARD, sequence_number="100", owner="m", lease=1))
    buffer = RecordBuffer(1000, 1 << 20)
    task = asyncio.create_task(fetcher(shard, lease, buffer).run())
    try:
        await until(lambda: lease.progress.efo_polling, "polling")
        await until(lambda: not lease.progress.efo_polling, "subscriptions again")
        shard.refusing = False
        shard.records.append(raw(101))
        got = await read(buffer, 1)
        await asyncio.sleep(0.1)  # anything replayed after it arrives meanwhile
        replayed = buffer.size[0]
    finally:
        await stop(lease, task)
    assert [r.sequence_number for r in got] == ["101"]
    assert replayed == 0


@dataclass
class Behind:
    """A subscriber whose events are empty and say the shard is 5 s behind; the continuation
    moves on with every event (``moving``: a stretch of the shard with no records, as AWS
    crosses it) or stays put (a subscription that delivers nothing)."""

    moving: bool
    events: int = 0

    def subscribe(self, arn: str, shard_id: str, position: dict[str, Any]) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while True:
            self.events += 1
            yield Event([], str(1000 + self.events if self.moving else 1000), 5000)
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("moving", [True, False])
async def test_empty_events_while_behind_are_a_stall_only_when_the_continuation_stays(
    quick: None, moving: bool
) -> None:
    subscriber = Behind(moving)
    lease = shard_lease(Checkpoint(STREAM, SHARD, sequence_number="100", owner="m", lease=1))
    buffer = RecordBuffer(1000, 1 << 20)
    efo = fetcher(Shard(records=[raw(100)], refusing=False), lease, buffer, subscriber)
    task = asyncio.create_task(efo.run())
    try:
        for _ in range(400):  # 100 events (1 s+: 3 stall windows), or 20 s of polling
            if subscriber.events >= 100:
                break
            await asyncio.sleep(0.05)
    finally:
        await stop(lease, task)
    assert (efo.stalls == 0) is moving, efo.stalls


@dataclass
class Reset:
    """A subscriber whose first subscription sends ``first`` then resets; later ones send
    empty events at the tip of the shard (caught up: progress)."""

    first: list[Event]
    subscriptions: int = 0
    events: int = 0

    def subscribe(self, arn: str, shard_id: str, position: dict[str, Any]) -> AsyncIterator[Event]:
        self.subscriptions += 1
        return self._events(self.subscriptions == 1)

    async def _events(self, first: bool) -> AsyncIterator[Event]:
        if first:
            for event in self.first:
                yield event
            raise Refused("reset")
        while True:
            self.events += 1
            yield Event([], "20", 0)
            await asyncio.sleep(0.01)


async def test_waiting_for_room_in_the_buffer_is_no_stall(quick: None) -> None:
    """The application is slow: the second event waits for room in the buffer for longer than
    STALL_AFTER (our own backpressure), then the subscription resets. Not a stall."""
    subscriber = Reset([Event([raw(i) for i in range(1, 11)], "10", 0)])
    subscriber.first.append(Event([raw(i) for i in range(11, 21)], "20", 0))
    lease = shard_lease(Checkpoint(STREAM, SHARD, sequence_number="0", owner="m", lease=1))
    buffer = RecordBuffer(10, 1 << 20)  # the first event fills it
    efo = fetcher(Shard(refusing=False), lease, buffer, subscriber)
    task = asyncio.create_task(efo.run())
    try:
        await until(lambda: buffer.size[0] == 10, "the buffer full")
        await asyncio.sleep(3 * efo_fetcher.STALL_AFTER)  # the application is busy
        got = await read(buffer, 20)
        await until(lambda: subscriber.events >= 5, "subscribed again after the reset")
    finally:
        await stop(lease, task)
    assert [r.sequence_number for r in got] == [str(i) for i in range(1, 21)]
    assert (efo.stalls, lease.progress.efo_stalls) == (0, 0)


@dataclass
class CancelledOnArrival:
    """A subscriber that cancels the fetcher's task just as its second event arrives, as the
    engine's close (``Supervisor.cancel_all``) may while the lease is still ACTIVE."""

    task: asyncio.Task[None] | None = None
    asked_after_cancel: bool = False

    def subscribe(self, arn: str, shard_id: str, position: dict[str, Any]) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        yield Event([raw(1)], "1", 0)
        assert self.task is not None
        self.task.cancel()
        yield Event([raw(2)], "2", 0)
        while True:
            await asyncio.sleep(0)
            self.asked_after_cancel = True  # the fetcher read on: its cancellation was lost
            yield Event([], "2", 0)
            await asyncio.sleep(0.01)


async def test_a_fetcher_cancelled_as_an_event_arrives_stops_while_its_lease_is_active(
    quick: None,
) -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the event and drops a cancellation that lands
    with it; the fetcher must stop on the cancellation alone (the lease stays ACTIVE)."""
    subscriber = CancelledOnArrival()
    lease = shard_lease(Checkpoint(STREAM, SHARD, sequence_number="0", owner="m", lease=1))
    buffer = RecordBuffer(1000, 1 << 20)
    task = asyncio.create_task(fetcher(Shard(refusing=False), lease, buffer, subscriber).run())
    subscriber.task = task
    try:
        await until(lambda: task.done() or subscriber.asked_after_cancel, "the fetcher ended")
        assert lease.claim.deliverable
    finally:
        await stop(lease, task)
    assert not subscriber.asked_after_cancel
    assert task.cancelled()
