"""An event loop on a thread of its own, for blocking faces over the asyncio engine.

The first call starts the loop; :meth:`LoopThread.run` submits a coroutine and blocks the
calling thread for its result; :meth:`LoopThread.stop` ends the loop and the thread.
"""

from __future__ import annotations

import asyncio
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

    @property
    def started(self) -> bool:
        return self._loop is not None

    @property
    def stopped(self) -> bool:
        return self._loop is not None and self._loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop (started on first use) and wait for its result."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            if self._loop.is_closed():
                coro.close()
                raise ConsumerClosedError("this consumer was closed; create a new one")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        """Stop the loop, wait for its thread, close it. Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or loop.is_closed():
                return
            if thread is not None and thread.is_alive():
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=10)
            if not loop.is_running():
                loop.close()
