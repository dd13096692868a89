"""Kinesis into PySpark: the optional ``spark`` extra (``pip install 'kinesumer[spark]'``).

Two paths (the site's Spark page, ``docs/spark/index.md``, says which to use when):

- ``spark.readStream.format("kinesumer")``: the Structured Streaming source; its executors read
  the shards, the driver side is one member of the consumer group.
- :func:`foreach_batch`: the driver-only path; this process is the group member, reads every
  record and hands each micro-batch to ``fn(df, batch_id[, info])`` as one DataFrame, and
  checkpoints only after ``fn`` returned::

    from kinesumer import Config
    from kinesumer.spark import BatchInfo, foreach_batch

    def write(df, batch_id, info: BatchInfo):
        df.write.mode("append").parquet("s3://bucket/orders/")

    config = Config(app="orders-etl", dynamodb_table="kinesumer-state", region="eu-west-1")
    summary = foreach_batch(spark, config, ["orders"], write, max_records=50_000)

pyspark and pyarrow are imported lazily, so ``import kinesumer.spark`` works without them; using
it without them raises :class:`SparkNotInstalledError`, which names the extra to install.

Modules: ``deps`` (the lazy imports), ``arrow`` (records as Arrow and DataFrames, the one
conversion both paths use), ``batches`` (what ``fn`` and the caller are told), ``drain``
(when ``available_now`` ends), ``driver`` (:func:`foreach_batch`), ``source`` (the streaming
source).
"""

import typing as _typing

from .. import lazy_imports as _lazy_imports

if _typing.TYPE_CHECKING:
    from .arrow import (
        COLUMNS,
        SCHEMA_DDL,
        arrow_schema,
        records_to_arrow,
        records_to_batches,
        records_to_dataframe,
        spark_schema,
    )
    from .batches import BatchFunction, BatchInfo, RunSummary, ShardRange
    from .deps import SparkNotInstalledError
    from .driver import BATCH_HANDOFF_TIMEOUT, foreach_batch
    from .source import KinesumerDataSource, ReplayMismatchError, SourceOutageError, read_stream

# Bound on first use (kinesumer.lazy_imports): every Spark worker that unpickles the source's
# reader or a partition imports this package as their parent; the driver path (foreach_batch)
# alone imports the consumer, the engine and the handlers.
#: The lazily bound names, each with the module that defines it (relative to this package).
_LAZY_NAMES = {
    "BATCH_HANDOFF_TIMEOUT": ".driver",
    "BatchFunction": ".batches",
    "BatchInfo": ".batches",
    "COLUMNS": ".arrow",
    "KinesumerDataSource": ".source",
    "ReplayMismatchError": ".source",
    "RunSummary": ".batches",
    "SCHEMA_DDL": ".arrow",
    "ShardRange": ".batches",
    "SourceOutageError": ".source",
    "SparkNotInstalledError": ".deps",
    "arrow_schema": ".arrow",
    "foreach_batch": ".driver",
    "read_stream": ".source",
    "records_to_arrow": ".arrow",
    "records_to_batches": ".arrow",
    "records_to_dataframe": ".arrow",
    "spark_schema": ".arrow",
}

if not _typing.TYPE_CHECKING:  # so that a misspelt name stays a type error
    __getattr__ = _lazy_imports.module_getattr(__name__, _LAZY_NAMES)
__dir__ = _lazy_imports.module_dir(__name__, _LAZY_NAMES)

__all__ = [
    "BATCH_HANDOFF_TIMEOUT",
    "COLUMNS",
    "SCHEMA_DDL",
    "BatchFunction",
    "BatchInfo",
    "KinesumerDataSource",
    "ReplayMismatchError",
    "RunSummary",
    "ShardRange",
    "SourceOutageError",
    "SparkNotInstalledError",
    "arrow_schema",
    "foreach_batch",
    "read_stream",
    "records_to_arrow",
    "records_to_batches",
    "records_to_dataframe",
    "spark_schema",
]
