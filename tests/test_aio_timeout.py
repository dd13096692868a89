"""A cancellation that lands in the same loop iteration as the awaited thing completes is never
lost (CPython gh-86296: ``asyncio.wait_for`` on 3.10 and 3.11 returns the result and drops it).

Deterministic: the awaited future is resolved and the waiting task cancelled one after the other
in the test's own step, so both land before the task runs again.
"""

from __future__ import annotations

import asyncio

import pytest

from kinesumer.aio_timeout import await_within
from kinesumer.config import Config
from kinesumer.engine.delivery import Cursor
from kinesumer.engine.engine import Engine
from kinesumer.engine.leases import Lease
from kinesumer.models import Checkpoint, Record

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
        self.batches: asyncio.Queue[asyncio.Future[tuple[Lease, list[Record]]]] = asyncio.Queue()
        self.asked = 0

    async def next_batch(self) -> tuple[Lease, list[Record]]:
        self.asked += 1
        batch: asyncio.Future[tuple[Lease, list[Record]]] = (
            asyncio.get_running_loop().create_future()
        )
        self.batches.put_nowait(batch)
        return await batch


async def test_poll_cancelled_as_a_batch_arrives_raises_the_cancellation() -> None:
    """A consumer task cancelled while ``poll`` waits must end, even when its cancellation lands
    with the batch: with ``wait_for`` poll returned the records and the task ran on."""
    engine = PollOnly()
    lease = Lease(Checkpoint(STREAM, SHARD, sequence_number="0", owner="m", lease=1))
    record = Record(STREAM, SHARD, "1", 0, "k", b"one", None)
    task = asyncio.create_task(engine.poll(1, 30))
    batch = await asyncio.wait_for(engine.batches.get(), 5)
    await settle()
    batch.set_result((lease, [record]))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
