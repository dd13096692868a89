"""The library's named error as the first line of what a Spark user sees at ``load()``.

Spark calls the source's ``schema()`` / ``streamReader()`` in a short-lived Python worker; an
exception there reaches the user as ``AnalysisException: [PYTHON_DATA_SOURCE_ERROR] Failed to
create Python data source instance: <what the worker wrote>``, and the worker writes
``traceback.TracebackException(...).format()``: ``Traceback (most recent call last):``, a dozen
lines of frames, and our error last. pyspark's ``handle_worker_exception`` writes only
``ConfigError: Config.colour: ...`` when the worker's environment has ``SPARK_HIDE_TRACEBACK``,
read when the exception is handled. :func:`named_error_first` sets it in that worker, only for
the library's own errors (whose message says what to fix; a frame list adds nothing), and only
in a Spark worker process, which exits right after reporting the error
(``pyspark.sql.worker.utils``: ``handle_worker_exception`` then ``sys.exit(-1)``), so nothing
else runs with the setting. Any other exception keeps its traceback.

:func:`named_errors` puts every method of the stream reader in such a block: the offset calls
of the query's long-lived source worker (whose failure ends the query:
``StreamingQueryException``), the planning worker's, and ``read()`` on the executors (a Python
worker exits after reporting a task's error too, ``pyspark.worker``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from ...errors import KinesumerError

P = ParamSpec("P")
T = TypeVar("T")

#: pyspark's switch (``pyspark.util.handle_worker_exception``): the exception's own lines only.
HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"


def in_spark_worker() -> bool:
    """True in a Python process that Spark started (its ``__main__`` is a pyspark module:
    ``pyspark.daemon`` or a ``pyspark.sql.worker`` entry point), False in the application's."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return bool(spec is not None and str(getattr(spec, "name", "")).startswith("pyspark."))


@contextlib.contextmanager
def named_error_first() -> Iterator[None]:
    """Let a :class:`~kinesumer.KinesumerError` leaving the block reach Spark as its class and
    message alone (see the module's docstring); everything else passes unchanged."""
    try:
        yield
    except KinesumerError:
        if in_spark_worker():
            os.environ[HIDE_TRACEBACK_ENV] = "1"
        raise


def named_errors(method: Callable[P, T]) -> Callable[P, T]:
    """``method`` inside :func:`named_error_first` (for the stream reader's methods)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with named_error_first():
            return method(*args, **kwargs)

    return wrapper
