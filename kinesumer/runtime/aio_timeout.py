"""``await_within``: a bounded await whose caller's cancellation is never lost.

``asyncio.wait_for`` on Python 3.10 and 3.11 returns the awaited result, and drops the caller's
cancellation, when the cancellation lands in the same loop iteration as the awaited thing
completes (CPython gh-86296, fixed in 3.12). A loop around such a wait (a fetcher reading the
next event, a writer waiting for its wake-up, ``poll`` waiting for a batch) then never sees its
cancellation and runs on. Every bounded await in kinesumer that sits in such a loop goes
through :func:`await_within`.

``GroupMember.close`` and ``BroadcastEngine.close`` keep ``wait_for``: a lost cancellation only
lets the close run on to its end (it is bounded), and a cancelled close leaves the member
CLOSING with its heartbeat still running, which a later ``close()`` does not finish.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def await_within(waiting: Awaitable[T], timeout: float | None) -> T:
    """The result of ``waiting``; ``asyncio.TimeoutError`` (it is then cancelled) when it did
    not finish within ``timeout`` seconds (None: no bound).

    The caller's cancellation always raises ``CancelledError``, even when it lands as
    ``waiting`` finishes. On Python 3.11+ ``asyncio.timeout`` awaits in the caller's own task,
    so the cancellation is thrown in there; on 3.10 ``asyncio.wait`` raises the caller's
    cancellation in every case. Wrap ``waiting`` in ``asyncio.shield`` to let it run on after
    a timeout or cancellation.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await waiting
    step = asyncio.ensure_future(waiting)  # pragma: no cover (Python 3.10)
    try:
        done, _ = await asyncio.wait({step}, timeout=timeout)
    finally:
        if not step.done():  # cancelled, or timed out: it must stop before the caller goes on
            step.cancel()
            await asyncio.wait({step})
    if not done:
        raise asyncio.TimeoutError(f"not done within {timeout}s")
    return step.result()
