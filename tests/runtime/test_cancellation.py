"""A cancelled task ends: the engine's and the runners' bounded waits never swallow a cancel.

On Python 3.10 and 3.11, ``asyncio.wait_for`` returns normally when its caller is cancelled at
the moment the awaited thing finishes (CPython gh-86296). A loop around it (the async runner
waiting for its wake-up event, a watchdog, a flush loop) then never sees the cancellation and
runs for ever: a task cancelled from outside, such as ``AsyncKinesumer.run()`` under a
``TaskGroup`` or at ``asyncio.run`` shutdown, hung. :func:`kinesumer.runtime.supervisor.wait_done`
is the one bounded wait those loops use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.runtime.supervisor import wait_done


async def _loop_until_cancelled(event: asyncio.Event, rounds: list[int]) -> None:
    while True:
        await wait_done(event.wait(), 10)
        event.clear()
        rounds.append(1)


async def test_a_cancel_arriving_as_the_event_fires_ends_the_loop() -> None:
    for _ in range(20):  # the race is deterministic; a few rounds in case the loop's order moves
        event, rounds = asyncio.Event(), []
        task = asyncio.create_task(_loop_until_cancelled(event, rounds))
        await asyncio.sleep(0.01)
        event.set()  # the waited-for event fires and the cancel lands in the same loop turn:
        task.cancel()  # asyncio.wait_for would return normally here and the loop go on
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done, "the loop swallowed its cancellation and kept running"
        assert task.cancelled()


async def test_wait_done_says_whether_it_finished_and_cancels_what_timed_out() -> None:
    event = asyncio.Event()
    assert await wait_done(event.wait(), 0.01) is False
    event.set()
    assert await wait_done(event.wait(), 1) is True
    never = asyncio.ensure_future(asyncio.Event().wait())
    assert await wait_done(never, 0.01) is False
    await asyncio.sleep(0)
    assert never.cancelled()


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    return {"config": config, "stream": stream, "url": kinesalite.url}


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_cancelling_async_run_ends_it(group: dict[str, Any], concurrency: int) -> None:
    """The task running ``AsyncKinesumer.run()`` is cancelled while records flow: it ends."""
    config, stream = group["config"].replace(initial_position="TRIM_HORIZON"), group["stream"]
    put(group["url"], stream, 0, 200)
    handled: list[str] = []

    async def handle(record: Record) -> None:
        handled.append(record.sequence_number)
        await asyncio.sleep(0.001)

    consumer = AsyncKinesumer(config)
    run = asyncio.create_task(consumer.run([stream], handle, concurrency=concurrency))
    await eventually(lambda: len(handled) >= 20, 30, "the handler receiving records")
    run.cancel()
    done, _ = await asyncio.wait({run}, timeout=20)
    assert done, "AsyncKinesumer.run() did not end when its task was cancelled"
    assert run.cancelled() or run.exception() is None
    await asyncio.wait_for(consumer.aclose(discard=True), 30)
