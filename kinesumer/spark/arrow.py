"""Records as Arrow and as Spark DataFrames: the one conversion both Spark paths use.

:func:`foreach_batch` builds each micro-batch's DataFrame with :func:`records_to_dataframe`; a
Python data source's ``read()`` yields :func:`records_to_batches` for the schema
:data:`SCHEMA_DDL` (or :func:`spark_schema`). Spark (4.3) accepts an Arrow batch from a Python
data source only when its schema *equals* the expected one, nullability included, so
:func:`arrow_schema` is exactly ``to_arrow_schema(spark_schema(), timezone="UTC")``: all three
are derived from :data:`FIELDS` (a test pins the equalities).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..models import Record
from .deps import require_pyarrow, require_spark

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ..kinesis.columns import EpochColumns

#: The columns, in order, with their kind and nullability: the fields of :class:`~kinesumer.Record`.
#: Kinds: ``string`` (Arrow string, Spark string), ``long`` (int64, bigint), ``binary``,
#: ``timestamp`` (Arrow ``timestamp[us, tz=UTC]``, a Spark timestamp: a UTC instant). Only the
#: arrival time may be missing (records built by hand); Kinesis always sets it.
FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("stream", "string", False),
    ("shard_id", "string", False),
    ("sequence_number", "string", False),
    ("sub_sequence_number", "long", False),
    ("partition_key", "string", False),
    ("data", "binary", False),
    ("approximate_arrival_timestamp", "timestamp", True),
)

#: The DataFrame's column names, in order (a test pins them to :data:`FIELDS`).
COLUMNS: tuple[str, ...] = Record._fields

_DDL_TYPES = {"string": "STRING", "long": "BIGINT", "binary": "BINARY", "timestamp": "TIMESTAMP"}

#: The Spark schema as a DDL string (``stream STRING NOT NULL, ...``): what a data source's
#: ``schema()`` may return without importing pyspark; Spark parses it into :func:`spark_schema`.
SCHEMA_DDL = ", ".join(
    f"{name} {_DDL_TYPES[kind]}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in FIELDS
)


def arrow_schema() -> pyarrow.Schema:
    """The Arrow schema of a batch of records (string, string, string, int64, string, binary,
    ``timestamp[us, tz=UTC]``; non-null but for the arrival time)."""
    pa = require_pyarrow()
    types = {
        "string": pa.string(),
        "long": pa.int64(),
        "binary": pa.binary(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    return pa.schema([pa.field(name, types[kind], nullable) for name, kind, nullable in FIELDS])


def spark_schema() -> StructType:
    """The Spark schema of the same columns (string, string, string, bigint, string, binary,
    timestamp); Arrow batches of :func:`arrow_schema` are what Spark expects for it."""
    require_spark()
    from pyspark.sql import types as T

    types: dict[str, Any] = {
        "string": T.StringType(),
        "long": T.LongType(),
        "binary": T.BinaryType(),
        "timestamp": T.TimestampType(),
    }
    return T.StructType(
        [T.StructField(name, types[kind], nullable) for name, kind, nullable in FIELDS]
    )


def records_to_arrow(records: Sequence[Record]) -> pyarrow.Table:
    """Records as one Arrow table (no per-row Python objects on the way to the JVM). Arrival
    timestamps become UTC instants whatever their tzinfo.

    The tuples go to Arrow as they are, as one struct array, then split into columns: turning
    them into seven column lists first (``zip(*records)``) cost a third of the time, measured."""
    pa = require_pyarrow()
    schema = arrow_schema()
    if not records:
        return schema.empty_table()
    rows = pa.array(records, type=pa.struct(list(schema)))
    return pa.Table.from_arrays(rows.flatten(), schema=schema)


def epoch_columns_to_arrow(columns: EpochColumns) -> pyarrow.Table:
    """:func:`records_to_arrow` for the Spark executors' columns
    (:class:`~kinesumer.kinesis.columns.EpochColumns`, arrival times as epoch seconds): the
    same table, one Arrow array per column list, the stream and shard repeated in C, the
    timestamp column computed from the floats in C (:func:`epoch_to_timestamp`).

    From a GetRecords answer to this table, decoding included: 0.52x the CPU of building
    ``Record`` tuples with datetimes and then an array per column, 0.79x that of
    ``EpochRecord`` tuples and one struct array (``benchmarks/bench_arrow_build.py``)."""
    pa = require_pyarrow()
    schema = arrow_schema()
    count = len(columns)
    if not count:
        return schema.empty_table()
    zeros = pa.nulls(count, pa.int32()).fill_null(0)
    arrays = [
        pa.array([columns.stream], pa.string()).take(zeros),
        pa.array([columns.shard_id], pa.string()).take(zeros),
        pa.array(columns.sequence_numbers, pa.string()),
        pa.array(columns.sub_sequence_numbers, pa.int64()),
        pa.array(columns.partition_keys, pa.string()),
        pa.array(columns.datas, pa.binary()),
        epoch_to_timestamp(pa.array(columns.arrivals, pa.float64())),
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def epoch_to_timestamp(seconds: pyarrow.Array) -> pyarrow.Array:
    """Epoch seconds (float64) as ``timestamp[us, tz=UTC]``, each rounded to the microsecond as
    msgspec's decoder rounds it (the library's GetRecords path: a :class:`~kinesumer.Record`'s
    arrival): whole seconds, then the fraction's microseconds, half up. Multiplying the whole
    float by a million first is off by one microsecond for about one value in sixteen (the
    product's own rounding), measured. ``datetime.fromtimestamp`` (botocore's parser) rounds an
    exact half microsecond to even instead: a float Kinesis never sends (its arrival times are
    whole milliseconds)."""
    pa = require_pyarrow()
    import pyarrow.compute as pc

    whole = pc.floor(seconds)
    fraction = pc.round(pc.multiply(pc.subtract(seconds, whole), 1e6), round_mode="half_up")
    micros = pc.add(pc.multiply(whole.cast(pa.int64()), 1_000_000), fraction.cast(pa.int64()))
    return micros.cast(pa.timestamp("us", tz="UTC"))


def records_to_batches(
    records: Sequence[Record], rows: int = 10_000
) -> Iterator[pyarrow.RecordBatch]:
    """``records`` as Arrow record batches of at most ``rows`` rows each, in
    :func:`arrow_schema`: what a Python data source's ``read()`` yields (nothing for no
    records)."""
    for start in range(0, len(records), rows):
        yield from records_to_arrow(records[start : start + rows]).to_batches()


def table_to_records(table: pyarrow.Table) -> list[Record]:
    """A table of :func:`arrow_schema` as records: the inverse of :func:`records_to_arrow`
    (tests and diagnostics; the read path hands tables to Spark as they are)."""
    columns = [table.column(name).to_pylist() for name in COLUMNS]
    return [Record(*values) for values in zip(*columns, strict=True)]


def records_to_dataframe(spark: SparkSession, records: Sequence[Record]) -> DataFrame:
    """One DataFrame for ``records``, through Arrow (``spark.createDataFrame(pyarrow.Table)``).

    pyspark 4 ships an Arrow table to the JVM as Arrow record batches (one partition per
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), several times faster than a list
    of rows, which it would verify, pickle and convert row by row.
    """
    require_spark()
    return spark.createDataFrame(records_to_arrow(records))
