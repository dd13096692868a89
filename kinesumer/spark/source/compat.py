"""pyspark's data source API (4.2 and later), or inert stand-ins so the package still imports.

``import kinesumer.spark`` must work without pyspark, and on pyspark 4.0/4.1, which lack
admission control (``latestOffset(start, limit)``) and ``SupportsTriggerAvailableNow``. There
the classes below are plain stand-ins: :data:`HAVE_SOURCE_API` is False and using the source
raises :class:`~kinesumer.spark.SparkNotInstalledError` naming the version it needs.
"""

from __future__ import annotations

from typing import Any

#: The pyspark the source needs (the ``spark`` extra requires it).
REQUIRED_PYSPARK = "pyspark>=4.2"

try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAVE_SOURCE_API = True
except ImportError:  # pragma: no cover - exercised only without pyspark 4.2+
    HAVE_SOURCE_API = False

    class DataSource:  # type: ignore[no-redef]
        def __init__(self, options: Any) -> None:
            self.options = options

    class DataSourceStreamReader:  # type: ignore[no-redef]
        pass

    class InputPartition:  # type: ignore[no-redef]
        pass

    class ReadLimit:  # type: ignore[no-redef]
        pass

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        def prepareForTriggerAvailableNow(self) -> None:
            pass


def require_source_api() -> None:
    """Raise :class:`~kinesumer.spark.SparkNotInstalledError` unless pyspark 4.2+ is here."""
    if HAVE_SOURCE_API:
        return
    from .. import SparkNotInstalledError

    raise SparkNotInstalledError(
        f"the kinesumer streaming source needs {REQUIRED_PYSPARK} (admission control and "
        f"availableNow) and pyarrow: pip install 'kinesumer[spark]'",
        name="pyspark",
    )


__all__ = [
    "HAVE_SOURCE_API",
    "REQUIRED_PYSPARK",
    "DataSource",
    "DataSourceStreamReader",
    "InputPartition",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "SupportsTriggerAvailableNow",
    "require_source_api",
]
