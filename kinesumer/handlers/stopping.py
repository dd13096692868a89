"""When a waiting handler call gives up: the run's ``stopping`` signal, and one call's own.

An invocation backing off, blocking (``Block``) or waiting for a retry-later record's due time
waits on ``stopping`` and gives up (``AbandonedError``) once it is set. The pooled runners set
it themselves when they see the engine closing. The inline runners (``concurrency=1``) call the
handler on the very thread (or task) that would watch the engine, so nothing would set it: a
``close()`` from elsewhere would wait out its handoff and ``run()`` would block for ever. These
events read as set once the engine is closing, closed or failed, checked every
:data:`CHECK` seconds while waiting. :class:`SyncCallEnds` / :class:`AsyncCallEnds` are what
one invocation waits on: the run's signal, or its shard handed off.
"""

from __future__ import annotations

import asyncio
import threading
import time

from ..group.leases import LeaseStatus
from ..models import Record
from ..read.engine import Engine
from ..read.progress import ShardLease
from ..runtime.lifecycle import EngineState
from ..runtime.supervisor import wait_done

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
            await wait_done(super().wait(), CHECK)
        return True


class CallEnds:
    """When one waiting call gives up: the run stops (``stopping``), or the lease of its
    records is handed off or ended (a rebalance moved the shard: the next owner handles them;
    waiting on would hold the handoff, then handle them on a released lease). Only when every
    record of the call is of ``lease``: abandoning a call that spans shards would strand the
    other shard's records under a live lease (without a sink a batch may span shards)."""

    def __init__(self, lease: ShardLease, records: list[Record]) -> None:
        key = lease.key
        self._lease = lease if all((r.stream, r.shard_id) == key for r in records) else None

    def lease_ended(self) -> bool:
        lease = self._lease
        return lease is not None and lease.claim.status is not LeaseStatus.ACTIVE


class SyncCallEnds(CallEnds):
    def __init__(self, stopping: threading.Event, lease: ShardLease, records: list[Record]) -> None:
        super().__init__(lease, records)
        self._stopping = stopping

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds``; True (at once) when the call should give up."""
        deadline = time.monotonic() + seconds
        while not self.lease_ended():
            left = deadline - time.monotonic()
            if left <= 0:
                return self._stopping.is_set()
            if self._stopping.wait(min(left, CHECK)):
                return True
        return True


class AsyncCallEnds(CallEnds):
    def __init__(self, stopping: asyncio.Event, lease: ShardLease, records: list[Record]) -> None:
        super().__init__(lease, records)
        self._stopping = stopping

    async def wait(self, seconds: float) -> bool:
        """Wait ``seconds``; True (at once) when the call should give up."""
        stopping = self._stopping
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not (stopping.is_set() or self.lease_ended()):
            left = deadline - loop.time()
            if left <= 0:
                return False
            await wait_done(stopping.wait(), min(left, CHECK))
        return True
