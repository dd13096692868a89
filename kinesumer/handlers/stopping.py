"""The ``stopping`` signal an invocation waits on, for the runners that have no dispatcher.

An invocation backing off, blocking (``Block``) or waiting for a retry-later record's due time
waits on ``stopping`` and gives up (``AbandonedError``) once it is set. The pooled runners set
it themselves when they see the engine closing. The inline runners (``concurrency=1``) call the
handler on the very thread (or task) that would watch the engine, so nothing would set it: a
``close()`` from elsewhere would wait out its handoff and ``run()`` would block for ever. These
events read as set once the engine is closing, closed or failed, checked every
:data:`CHECK` seconds while waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from ..engine.engine import Engine
from ..engine.lifecycle import EngineState

#: How often a waiter looks at the engine's state: how late a close is seen.
CHECK = 0.25


def engine_stopping(engine: Engine) -> bool:
    """The engine is closing, closed or failed: a waiting call should give up."""
    return engine.lifecycle.closing_or_closed or engine.state is EngineState.FAILED


class EngineStopping(threading.Event):
    """A :class:`threading.Event` that also reads as set once ``engine`` stops."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self._engine = engine

    def is_set(self) -> bool:
        return super().is_set() or engine_stopping(self._engine)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = CHECK if deadline is None else min(CHECK, deadline - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


class AsyncEngineStopping(asyncio.Event):
    """An :class:`asyncio.Event` that also reads as set once ``engine`` stops."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self._engine = engine

    def is_set(self) -> bool:
        return super().is_set() or engine_stopping(self._engine)

    async def wait(self) -> bool:  # type: ignore[override]  # Literal[True] in typeshed
        while not self.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(super().wait(), CHECK)
        return True
