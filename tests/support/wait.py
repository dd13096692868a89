"""The one bounded wait of the test suite: poll a condition until it holds, or fail the test.

Tests never assert on timing; they wait for a state. Every wait is bounded (``timeout``) so a
regression fails with a message naming what was awaited (``what``), never hangs the suite.
:func:`wait_until` blocks (threads, subprocesses, the sync API); :func:`eventually` is the same
wait for coroutines, yielding to the event loop between checks so the engine under test runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Seconds between two checks: short enough not to slow tests, long enough not to spin a core.
INTERVAL = 0.02


def timed_out(timeout: float, what: str, diagnose: Callable[[], str] | None) -> AssertionError:
    detail = f"\n{diagnose()}" if diagnose is not None else ""
    return AssertionError(f"timed out after {timeout:g}s waiting for {what}{detail}")


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 30.0,
    what: str = "",
    diagnose: Callable[[], str] | None = None,
    interval: float = INTERVAL,
) -> float:
    """Block until ``predicate()`` holds; the seconds it took. After ``timeout`` seconds fail
    with ``what`` (default: the predicate's repr) and whatever ``diagnose()`` says."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise timed_out(timeout, what or repr(predicate), diagnose)
        time.sleep(interval)
    return time.monotonic() - started


async def eventually(
    predicate: Callable[[], bool],
    timeout: float = 30.0,
    what: str = "",
    diagnose: Callable[[], str] | None = None,
    interval: float = INTERVAL,
) -> float:
    """:func:`wait_until` for coroutines: sleeps on the event loop between checks."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise timed_out(timeout, what or repr(predicate), diagnose)
        await asyncio.sleep(interval)
    return time.monotonic() - started
