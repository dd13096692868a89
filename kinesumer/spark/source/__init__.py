"""The Structured Streaming source ``spark.readStream.format("kinesumer")``.

Modules: :mod:`.datasource` (the data source, its reader, :func:`read_stream`), :mod:`.options`
(Spark options -> Config), :mod:`.offsets` (the offset JSON), :mod:`.planner` (the driver side:
a group member planning micro-batches), :mod:`.partition` (what an executor task gets),
:mod:`.executor` (GetRecords -> Arrow on executors), :mod:`.ledger` (per-batch ranges in the
state table), :mod:`.driverio` (the planner's own AWS calls), :mod:`.compat` (pyspark 4.2+),
:mod:`.aliases` (other connectors' option names), :mod:`.errors` (named errors first at load()),
:mod:`.groups` (which consumer group a query joins), :mod:`.cleanup` (removing a
per-query group's state), :mod:`.outage` (outages ridden out, then
:class:`SourceOutageError`).

``register(spark)`` makes ``format("kinesumer")`` known to a session (else Spark answers
``DATA_SOURCE_NOT_FOUND``, which happens before any code of ours runs).
"""

from .cleanup import forget_query, query_of_checkpoint
from .compat import HAVE_SOURCE_API, REQUIRED_PYSPARK
from .datasource import (
    SCHEMA,
    KinesumerDataSource,
    KinesumerStreamReader,
    option_strings,
    read_stream,
    register,
)
from .executor import ReplayMismatchError
from .groups import group_of
from .options import (
    SENSITIVE_OPTIONS,
    SOURCE_DEFAULTS,
    SourceOptions,
    parse_options,
    redact_sensitive_options,
)
from .outage import SourceOutageError

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
