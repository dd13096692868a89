"""A cancellation that lands in the same loop iteration as the awaited thing completes is never
lost (CPython gh-86296: ``asyncio.wait_for`` on 3.10 and 3.11 returns the result and drops it).

Deterministic: the awaited future is resolved and the waiting task cancelled one after the other
in the test's own step, so both land before the task runs again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kinesumer.config import Config
from kinesumer.kinesis.transport import AwsKinesisTransport
from kinesumer.models import Checkpoint, Record
from kinesumer.producer.options import ProducerOptions
from kinesumer.producer.records import PendingRecord
from kinesumer.producer.stream import StreamWriter
from kinesumer.read.delivery import Cursor
from kinesumer.read.engine import Engine
from kinesumer.read.progress import ShardLease, shard_lease
from kinesumer.runtime.aio_timeout import await_within

STREAM, SHARD = "s", "shardId-000000000000"


async def settle() -> None:
    """Let every ready callback run: the waiting task is then parked on its await."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_cancel_landing_as_the_awaited_future_finishes_is_raised() -> None:
    arrived: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(await_within(arrived, 30))
    await settle()
    arrived.set_result(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_the_result_comes_back_and_a_timeout_raises_and_cancels_the_awaited() -> None:
    arrived: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    arrived.set_result(7)
    assert await await_within(arrived, 30) == 7
    assert await await_within(asyncio.sleep(0, "now"), None) == "now"
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.TimeoutError):
        await await_within(never, 0.01)
    assert never.cancelled()


async def test_a_shielded_task_runs_on_after_a_timeout() -> None:
    release = asyncio.Event()
    inner = asyncio.create_task(release.wait())
    with pytest.raises(asyncio.TimeoutError):
        await await_within(asyncio.shield(inner), 0.01)
    assert not inner.done()
    release.set()
    assert await inner is True


class PollOnly(Engine):
    """Just what ``poll`` uses: the delivery cursor, and batches the test hands over."""

    def __init__(self) -> None:  # no AWS, no tasks: poll alone is under test
        self.cursor = Cursor(Config(app="a", dynamodb_table="state").auto_commit)  # the default
        self.batches: asyncio.Queue[asyncio.Future[tuple[ShardLease, list[Record]]]] = (
            asyncio.Queue()
        )
        self.asked = 0

    async def next_batch(self) -> tuple[ShardLease, list[Record]]:
        self.asked += 1
        batch: asyncio.Future[tuple[ShardLease, list[Record]]] = (
            asyncio.get_running_loop().create_future()
        )
        self.batches.put_nowait(batch)
        return await batch


async def test_poll_cancelled_as_a_batch_arrives_raises_the_cancellation() -> None:
    """A consumer task cancelled while ``poll`` waits must end, even when its cancellation lands
    with the batch: with ``wait_for`` poll returned the records and the task ran on."""
    engine = PollOnly()
    lease = shard_lease(Checkpoint(STREAM, SHARD, sequence_number="0", owner="m", lease=1))
    record = Record(STREAM, SHARD, "1", 0, "k", b"one", None)
    task = asyncio.create_task(engine.poll(1, 30))
    batch = await asyncio.wait_for(engine.batches.get(), 5)
    await settle()
    batch.set_result((lease, [record]))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


class OneShardStream:
    """A Kinesis client with one shard and no other call: the writer only lists it here."""

    async def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        hash_range = {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)}
        return {"Shards": [{"ShardId": SHARD, "HashKeyRange": hash_range}]}


class NoOutcomes:
    """The core's side: nothing may be written, failed or retried in this test."""

    flushing = False

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the writer called {name} of the core")


async def test_a_producer_writer_cancelled_as_it_is_woken_stops() -> None:
    """A writer holding a lingering record waits for its wake-up with a bound; cancelled as the
    wake-up arrives (the loop shutting down) it must stop, not wait again for ever."""
    kinesis = AwsKinesisTransport(OneShardStream(), lean=False)
    writer = StreamWriter(STREAM, kinesis, ProducerOptions(linger=30), NoOutcomes())
    record = PendingRecord(STREAM, b"one", "k", None, None)
    record.put_time = time.monotonic()  # as the core stamps it at put()
    record.deadline = record.put_time + 600
    writer.add(record)
    task = asyncio.create_task(writer.run())
    await settle()
    writer.wake.clear()  # the add's wake-up was taken: the writer now waits out the linger
    await settle()
    assert not task.done() and writer.pending == 1
    writer.wake.set()
    task.cancel()
    await settle()
    assert task.done(), "the writer's cancellation was lost: it waits again"
    assert task.cancelled()
