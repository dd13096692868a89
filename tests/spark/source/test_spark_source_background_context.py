"""A read ahead is started by a task and outlives it: it runs in a context of its own, so the
task's outage clock (which bounds the task's calls and dates its outage) is not the read
ahead's: a read ahead answering must not reset the clock of the step that started it."""

from __future__ import annotations

import asyncio

from kinesumer.aws.retry import OutageClock, current_outage_clock, outage_clock
from kinesumer.spark.source.executor.read import start_in_background


def test_a_background_read_ahead_does_not_carry_the_tasks_outage_clock() -> None:
    seen: list[OutageClock | None] = []

    async def read_ahead() -> None:
        seen.append(current_outage_clock())

    async def task() -> None:
        with outage_clock(OutageClock(20.0)) as clock:
            assert current_outage_clock() is clock
            start_in_background(read_ahead())
        await asyncio.sleep(0.05)

    asyncio.run(task())
    assert seen == [None]
