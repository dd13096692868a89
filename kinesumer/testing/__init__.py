"""Helpers to test an application that uses kinesumer.

- Under moto's in-process ``mock_aws`` kinesumer works as it is: its aiobotocore clients get
  moto's answers in a form they can await (:mod:`.inprocess`, used only while moto is loaded).
- :func:`record`, :func:`aggregate` and :class:`HandlerDriver`: a handler tested in memory,
  through the same calls, policies, decoding and dead letters as ``run()`` (:mod:`.driver`).
- :mod:`.plugin`: pytest fixtures on moto in server mode (registered by the ``testing`` extra's
  ``pytest11`` entry point).

Importing this package imports neither moto nor pytest.
"""

from __future__ import annotations

from ..errors import InProcessMockUnsupportedError
from .driver import HandlerDriver
from .memory import MemorySink, VirtualClock
from .records import aggregate, record
from .waiting import RecordsDidNotArriveError, put, wait_for, wait_for_async

__all__ = [
    "HandlerDriver",
    "InProcessMockUnsupportedError",
    "MemorySink",
    "RecordsDidNotArriveError",
    "VirtualClock",
    "aggregate",
    "put",
    "record",
    "wait_for",
    "wait_for_async",
]
