"""Helpers to test an application that uses kinesumer.

- Under moto's in-process ``mock_aws`` kinesumer works as it is: its aiobotocore clients get
  moto's answers in a form they can await (:mod:`kinesumer.aws.moto_adapter`, used only while
  moto is loaded).
- :func:`record`, :func:`aggregate` and :class:`HandlerDriver`: a handler tested in memory,
  through the same calls, policies, decoding and dead letters as ``run()`` (:mod:`.driver`).
- :class:`MemoryState`: the state table in memory, with DynamoDB's conditional writes
  (:mod:`.memory_state`).
- :class:`MemoryKinesis`: Kinesis in memory (streams, resharding, iterators, retention,
  failures on demand, its own clock), a Kinesis transport the reader calls as it calls AWS.
- :mod:`.plugin`: pytest fixtures on moto in server mode (registered by the ``testing`` extra's
  ``pytest11`` entry point).

Importing this package imports neither moto nor pytest.
"""

from __future__ import annotations

import typing as _typing

from .. import lazy_imports as _lazy_imports
from ..errors import InProcessMockUnsupportedError

if _typing.TYPE_CHECKING:  # what mypy and IDEs see; at run time, __getattr__ below binds these
    from .driver import HandlerDriver
    from .kinesis import MemoryKinesis
    from .memory import MemorySink, VirtualClock
    from .memory_state import MemoryState
    from .records import aggregate, record
    from .waiting import RecordsDidNotArriveError, put, wait_for, wait_for_async

# Bound on first use (kinesumer.lazy_imports): the pytest plugin, loaded wherever kinesumer is
# installed, imports this package as its parent, and the driver alone imports the engine and boto3.
#: The lazily bound names, each with the module that defines it (relative to this package).
_LAZY_NAMES = {
    "HandlerDriver": ".driver",
    "MemoryKinesis": ".kinesis",
    "MemorySink": ".memory",
    "MemoryState": ".memory_state",
    "RecordsDidNotArriveError": ".waiting",
    "VirtualClock": ".memory",
    "aggregate": ".records",
    "put": ".waiting",
    "record": ".records",
    "wait_for": ".waiting",
    "wait_for_async": ".waiting",
}


if not _typing.TYPE_CHECKING:  # so that a misspelt name stays a type error
    __getattr__ = _lazy_imports.module_getattr(__name__, _LAZY_NAMES)
__dir__ = _lazy_imports.module_dir(__name__, _LAZY_NAMES)

__all__ = [
    "HandlerDriver",
    "InProcessMockUnsupportedError",
    "MemoryKinesis",
    "MemorySink",
    "MemoryState",
    "RecordsDidNotArriveError",
    "VirtualClock",
    "aggregate",
    "put",
    "record",
    "wait_for",
    "wait_for_async",
]
