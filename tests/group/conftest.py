"""The group tests' safety net: a member a failing test left running is closed at its end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from support.group import RUNNING


@pytest.fixture(autouse=True)
async def close_left_members() -> AsyncIterator[None]:
    """Close, in the test's own event loop, the members it started and did not close or crash
    (a failed assertion skips the test's own close): the failure stays the test's, not the
    next tests' (a leaked member heartbeats on and loads the worker). Members other tests left
    are forgotten first: they belong to event loops of their own."""
    RUNNING.clear()
    yield
    left = list(RUNNING)
    RUNNING.clear()
    for member in left:
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(member.close(), 30)
