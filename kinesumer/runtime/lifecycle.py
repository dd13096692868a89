"""The engine's lifecycle: one state (an enum with a message per state), moved only here.

::

    NEW ──join()──► JOINING ──joined(ok)──► RUNNING ──fail()──► FAILED
                       │  └──joined(failed)──► NEW (the join may be tried again)
    NEW, JOINING, RUNNING, FAILED ──begin_close()──► CLOSING ──closed()──► CLOSED

A close that starts while the join runs waits for the join (``wait_joined``); if that close is
cancelled meanwhile, ``close_cancelled`` puts back the state the join left. The error that
stopped the engine is kept in :attr:`Lifecycle.failure` through closing and closed.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Coroutine
from typing import Any

from ..errors import ConsumerClosedError


class EngineState(enum.Enum):
    NEW = "new"
    JOINING = "joining"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    EngineState.NEW: "created; not joined yet",
    EngineState.JOINING: "joining: checking the table and streams, claiming the first shards",
    EngineState.RUNNING: "running: a member of the group",
    EngineState.CLOSING: "closing: handing its shards off",
    EngineState.CLOSED: "this consumer was closed; create a new one",
    EngineState.FAILED: "stopped by an error",
}


class Lifecycle:
    """The engine's state, the error that stopped it, and the join in progress."""

    def __init__(self) -> None:
        self.state = EngineState.NEW
        self.failure: BaseException | None = None
        self._join_ended: asyncio.Event | None = None
        # Whether a join succeeded: what a close must tear down (kept through CLOSING).
        self.joined = False

    @property
    def joining(self) -> bool:
        return self._join_ended is not None

    @property
    def closing_or_closed(self) -> bool:
        return self.state in (EngineState.CLOSING, EngineState.CLOSED)

    def check(self) -> None:
        """Raise the error that stopped the engine, or ConsumerClosedError once closing."""
        if self.failure is not None:
            raise self.failure
        if self.closing_or_closed:
            raise ConsumerClosedError(EngineState.CLOSED.message)

    def begin_join(self) -> None:
        """Engine.start: NEW → JOINING."""
        if self.closing_or_closed:
            raise ConsumerClosedError(EngineState.CLOSED.message)
        self.state = EngineState.JOINING
        self._join_ended = asyncio.Event()

    def end_join(self, ok: bool) -> None:
        """Engine.start, when the join returned (ok) or raised: JOINING → RUNNING or NEW. A
        close requested meanwhile keeps CLOSING (it goes on once the join ended)."""
        self.joined = ok
        if self.state is EngineState.JOINING:
            self.state = EngineState.RUNNING if ok else EngineState.NEW
        assert self._join_ended is not None
        self._join_ended.set()
        self._join_ended = None

    async def wait_joined(self) -> None:
        """Wait for a join in progress, if any, to end."""
        if self._join_ended is not None:
            await self._join_ended.wait()

    def fail(self, error: BaseException) -> bool:
        """Supervisor: a background task failed. → FAILED, keeping ``error`` for the caller.
        False (nothing changed) when it already failed or is closing: only logged then."""
        if self.failure is not None or self.closing_or_closed:
            return False
        self.failure = error
        self.state = EngineState.FAILED
        return True

    def begin_close(self) -> EngineState | None:
        """Engine.close: → CLOSING; the state it had, or None when already closing or closed."""
        if self.closing_or_closed:
            return None
        before, self.state = self.state, EngineState.CLOSING
        return before

    def close_cancelled(self) -> None:
        """The close was cancelled while it waited for the join: back to what the join left."""
        if self.failure is not None:
            self.state = EngineState.FAILED
        elif self.joining:
            self.state = EngineState.JOINING
        else:
            self.state = EngineState.RUNNING if self.joined else EngineState.NEW

    def closed(self) -> None:
        """Engine.close, at the end: → CLOSED."""
        self.state = EngineState.CLOSED


async def run_to_the_end(last_step: Coroutine[Any, Any, None]) -> None:
    """Run a close's ``last_step`` to its end even when the caller is cancelled meanwhile (once
    more, or at every await as an anyio cancel scope does), then raise that cancellation. Cut
    short, it left the clients open and the state CLOSING, which no later close can finish."""
    step = asyncio.ensure_future(last_step)
    cancelled = False
    while not step.done():
        try:
            await asyncio.shield(step)
        except asyncio.CancelledError:
            if step.done():  # the step itself was cancelled (the loop shutting down)
                raise
            cancelled = True
    step.result()
    if cancelled:
        raise asyncio.CancelledError
