"""The Spark extra's optional dependencies: pyspark and pyarrow, imported lazily.

``import kinesumer.spark`` works without them; the first use that needs them calls
:func:`require_pyarrow` or :func:`require_spark`, which raise :class:`SparkNotInstalledError`
naming the missing modules and the extra to install. Executors of the streaming source need only
pyarrow (they build Arrow batches), the driver side needs both.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import KinesumerError

#: What to run when the extra is missing: named in every SparkNotInstalledError.
EXTRA_HINT = "pip install 'kinesumer[spark]'"


class SparkNotInstalledError(KinesumerError, ImportError):
    """pyspark or pyarrow is missing: ``pip install 'kinesumer[spark]'``.

    Both a :class:`~kinesumer.KinesumerError` (the library's one exception tree) and an
    :class:`ImportError` (what code that probes optional dependencies already catches).
    """


def missing_error(modules: tuple[str, ...]) -> SparkNotInstalledError | None:
    """The error naming every module of ``modules`` that cannot be imported, or None."""
    missing: list[str] = []
    cause: ImportError | None = None
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(module.split(".")[0])
            cause = cause or exc
    if not missing:
        return None
    error = SparkNotInstalledError(
        f"kinesumer.spark needs pyspark and pyarrow; not installed: {', '.join(missing)}. "
        f"Install them with: {EXTRA_HINT}",
        name=missing[0],
    )
    error.__cause__ = cause  # the original ImportError, shown as "the direct cause"
    return error


def require_pyarrow() -> Any:
    """The ``pyarrow`` module; :class:`SparkNotInstalledError` when it is missing."""
    error = missing_error(("pyarrow",))
    if error is not None:
        raise error
    return importlib.import_module("pyarrow")


def require_spark() -> None:
    """Raises :class:`SparkNotInstalledError` unless both pyspark and pyarrow import."""
    error = missing_error(("pyspark.sql", "pyarrow"))
    if error is not None:
        raise error
