"""Task supervision: the engine's background tasks, and failures surfaced to the caller.

Every background task is spawned here. One that fails with anything but a cancellation stops
the engine (:meth:`Supervisor.fail`): the lifecycle moves to FAILED and keeps the error, and the
``on_failure`` callbacks stop the rest (heartbeats, fetchers, the buffer's waiters, which then
raise the error to the application from its next step). The watchdog runs a check (the fence)
every few tenths of a second, independent of any DynamoDB call that may hang.

:func:`wait_done` is the one bounded wait of every loop in the engine and the handler runners.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .lifecycle import Lifecycle

log = logging.getLogger("kinesumer")


async def wait_done(waiting: Awaitable[object], timeout: float | None) -> bool:
    """Await ``waiting`` for at most ``timeout`` seconds: True when it finished, False when the
    time ran out (it is then cancelled).

    Not ``asyncio.wait_for``: on Python 3.10 and 3.11 that returns normally when the caller is
    cancelled at the moment ``waiting`` finishes (CPython gh-86296), and a loop around it, such
    as a runner waiting for its wake-up event, then never sees its cancellation and runs for
    ever. ``asyncio.wait`` raises the caller's cancellation in every case.
    """
    task = asyncio.ensure_future(waiting)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
    return bool(done)


class Supervisor:
    def __init__(self, client_id: str, lifecycle: Lifecycle) -> None:
        self._client_id = client_id
        self._lifecycle = lifecycle
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Called once, on the loop, with the error that stopped the engine.
        self.on_failure: list[Callable[[BaseException], None]] = []
        #: Set when the engine stops (failure or close): every loop of background work ends.
        self.stop = asyncio.Event()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; its failure stops the engine."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                self.fail(exc, name)

        task.add_done_callback(done)
        return task

    def fail(self, exc: BaseException, where: str) -> None:
        """``where`` failed with ``exc``: stop the engine and keep the error for the caller
        (only logged once the engine already failed or is closing)."""
        if not self._lifecycle.fail(exc):
            log.warning("[%s] %s failed after the engine stopped: %r", self._client_id, where, exc)
            return
        log.error("[%s] %s failed, stopping: %r", self._client_id, where, exc, exc_info=exc)
        self.stop.set()
        for callback in self.on_failure:
            callback(exc)

    async def watch(self, check: Callable[[], None], step: float) -> None:
        """The watchdog: run ``check`` every ``step`` seconds until the engine stops."""
        while not self.stop.is_set():
            check()
            await wait_done(self.stop.wait(), step)

    async def cancel_all(self) -> None:
        """Cancel every background task still running and wait for them to end."""
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
