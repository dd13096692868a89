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
