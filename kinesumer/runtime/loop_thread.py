"""An event loop on a thread of its own, for blocking faces over the asyncio engine.

The first call starts the loop; :meth:`LoopThread.run` submits a coroutine and blocks the
calling thread for its result; :meth:`LoopThread.stop` ends the loop and the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..errors import ConsumerClosedError

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False

    @property
    def started(self) -> bool:
        return self._loop is not None

    @property
    def stopped(self) -> bool:
        return self._stopping

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop (started on first use) and wait for its result. Raises
        ConsumerClosedError once :meth:`stop` began, also for a call it cut short."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            if self._stopping:
                coro.close()
                raise ConsumerClosedError("this consumer was closed; create a new one")
            # Submitted under the lock: stop() cannot slip in between the check and the submit.
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ConsumerClosedError("this consumer was closed while the call ran") from None

    def stop(self) -> None:
        """Cancel what still runs on the loop (its callers get ConsumerClosedError), stop the
        loop, wait for its thread, close it. Idempotent."""
        with self._lock:
            self._stopping = True
            loop, thread = self._loop, self._thread
        if loop is None or loop.is_closed():
            return
        if thread is not None and thread.is_alive():
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        if not loop.is_running():
            loop.close()


async def _cancel_pending() -> None:
    """Cancel every other task on this loop and wait for them to end (so that no caller of
    :meth:`LoopThread.run` waits forever on a loop that stopped)."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
