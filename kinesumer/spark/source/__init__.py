"""The Structured Streaming source ``spark.readStream.format("kinesumer")``.

Shared by both sides: :mod:`.datasource` (the data source, its reader, :func:`read_stream`),
:mod:`.options` (Spark options -> Config) and :mod:`.aliases` (other connectors' option names),
:mod:`.offsets` (the offset JSON), :mod:`.partition` (what an executor task gets),
:mod:`.ledger` (per-batch ranges in the state table), :mod:`.outage` (outages ridden out, then
:class:`SourceOutageError`), :mod:`.errors` (named errors first at load()), :mod:`.logs`,
:mod:`.compat` (pyspark 4.2+). The driver side is :mod:`.driver` (a group member planning
micro-batches), the executors' :mod:`.executor` (GetRecords -> Arrow).

``register(spark)`` makes ``format("kinesumer")`` known to a session (else Spark answers
``DATA_SOURCE_NOT_FOUND``, which happens before any code of ours runs).
"""

import typing as _typing

from ... import lazy_imports as _lazy_imports

if _typing.TYPE_CHECKING:
    from .compat import HAVE_SOURCE_API, REQUIRED_PYSPARK
    from .datasource import (
        SCHEMA,
        KinesumerDataSource,
        KinesumerStreamReader,
        option_strings,
        read_stream,
        register,
    )
    from .driver.cleanup import forget_query, query_of_checkpoint
    from .driver.groups import group_of
    from .executor.shard_read import ReplayMismatchError
    from .options import (
        SENSITIVE_OPTIONS,
        SOURCE_DEFAULTS,
        SourceOptions,
        parse_options,
        redact_sensitive_options,
    )
    from .outage import SourceOutageError

# Bound on first use (kinesumer.lazy_imports): an executor's read task imports ``executor`` and
# ``partition`` through this package; the planner (the driver side) is not theirs to import.
#: The lazily bound names, each with the module that defines it (relative to this package).
_LAZY_NAMES = {
    "HAVE_SOURCE_API": ".compat",
    "KinesumerDataSource": ".datasource",
    "KinesumerStreamReader": ".datasource",
    "REQUIRED_PYSPARK": ".compat",
    "ReplayMismatchError": ".executor.shard_read",
    "SCHEMA": ".datasource",
    "SENSITIVE_OPTIONS": ".options",
    "SOURCE_DEFAULTS": ".options",
    "SourceOptions": ".options",
    "SourceOutageError": ".outage",
    "forget_query": ".driver.cleanup",
    "group_of": ".driver.groups",
    "option_strings": ".datasource",
    "parse_options": ".options",
    "query_of_checkpoint": ".driver.cleanup",
    "read_stream": ".datasource",
    "redact_sensitive_options": ".options",
    "register": ".datasource",
}

if not _typing.TYPE_CHECKING:  # so that a misspelt name stays a type error
    __getattr__ = _lazy_imports.module_getattr(__name__, _LAZY_NAMES)
__dir__ = _lazy_imports.module_dir(__name__, _LAZY_NAMES)

__all__ = [
    "HAVE_SOURCE_API",
    "REQUIRED_PYSPARK",
    "SCHEMA",
    "SENSITIVE_OPTIONS",
    "SOURCE_DEFAULTS",
    "KinesumerDataSource",
    "KinesumerStreamReader",
    "ReplayMismatchError",
    "SourceOptions",
    "SourceOutageError",
    "forget_query",
    "group_of",
    "option_strings",
    "parse_options",
    "query_of_checkpoint",
    "read_stream",
    "redact_sensitive_options",
    "register",
]
