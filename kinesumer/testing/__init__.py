"""Helpers to test an application that uses kinesumer.

- Under moto's in-process ``mock_aws`` kinesumer works as it is: its aiobotocore clients get
  moto's answers in a form they can await (:mod:`.inprocess`, used only while moto is loaded).
- :mod:`.plugin`: pytest fixtures on moto in server mode (registered by the ``testing`` extra's
  ``pytest11`` entry point).

Importing this package imports neither moto nor pytest.
"""

from __future__ import annotations

from ..errors import InProcessMockUnsupportedError
from .waiting import RecordsDidNotArriveError, put, wait_for, wait_for_async

__all__ = [
    "InProcessMockUnsupportedError",
    "RecordsDidNotArriveError",
    "put",
    "wait_for",
    "wait_for_async",
]
