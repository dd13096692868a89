"""Task supervision: the engine's background tasks, and failures surfaced to the caller.

Every background task is spawned here. One that fails with anything but a cancellation stops
the engine (:meth:`Supervisor.fail`): the lifecycle moves to FAILED and keeps the error, and the
``on_failure`` callbacks stop the rest (heartbeats, fetchers, the buffer's waiters, which then
raise the error to the application from its next step). The watchdog runs a check (the fence)
every few tenths of a second, independent of any DynamoDB call that may hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .lifecycle import Lifecycle

log = logging.getLogger("kinesumer")


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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), step)

    async def cancel_all(self) -> None:
        """Cancel every background task still running and wait for them to end."""
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
