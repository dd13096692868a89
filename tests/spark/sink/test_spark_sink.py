"""The Spark sink on local Spark and kinesalite: ``df.write.format("kinesumer")`` writes every
row through the Producer (routed per row by a ``stream`` column or the ``stream`` option, placed
by an ``explicit_hash_key`` column); a bad option or column fails at ``save()``, or stops a
streaming query at its first micro-batch, with the option's name; a task failing after some of
its rows were written is run again, its earlier rows written twice (at least once)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from support.group import create_stream
from support.produced import by_key, kinesis, read_all
from support.spark_source import local_spark, run_to_end
from support.standins import NodeStandIn

from kinesumer.spark import KinesumerDataSource


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark(app="kinesumer-sink-tests") as session:
        session.dataSource.register(KinesumerDataSource)
        yield session


def test_a_batch_write_puts_every_row_and_routes_by_the_stream_column(
    spark: Any, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    first, second = unique_name("sink"), unique_name("sink")
    create_stream(kinesalite.url, first, 2)
    create_stream(kinesalite.url, second, 1)
    rows = [(f"{i}".encode(), f"k{i % 5}", first if i % 3 else second) for i in range(300)]
    frame = spark.createDataFrame(rows, "data binary, partition_key string, stream string")
    (
        frame.repartition(1)
        .write.format("kinesumer")
        .mode("append")
        .option("region", "us-east-1")
        .option("kinesis_endpoint", kinesalite.url)
        .option("aggregate", "true")
        .save()
    )
    written = read_all(kinesalite.url, first) + read_all(kinesalite.url, second)
    assert sorted(int(r.data) for r in written) == list(range(300))
    assert {int(r.data) for r in read_all(kinesalite.url, second)} == set(range(0, 300, 3))
    for datas in by_key(read_all(kinesalite.url, first)).values():
        numbers = [int(d) for d in datas]
        assert numbers == sorted(numbers)  # one task: its rows in order per key


def test_a_bad_column_or_option_fails_at_save_with_its_name(
    spark: Any, kinesalite: NodeStandIn
) -> None:
    frame = spark.createDataFrame([("x", 1)], "data string, partition_key int")
    writer = frame.write.format("kinesumer").mode("append").option("stream", "s")
    with pytest.raises(Exception, match=r"sink\(partition_key\)"):
        writer.option("kinesis_endpoint", kinesalite.url).save()
    good = spark.createDataFrame([("x", "k")], "data string, partition_key string")
    with pytest.raises(Exception, match=r"\(ordering\): must be"):
        good.write.format("kinesumer").mode("append").option("stream", "s").option(
            "ordering", "shard"
        ).save()


def test_a_pipeline_from_the_source_to_the_sink_with_failed_tasks_retried(
    spark: Any,
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
    tmp_path: Any,
) -> None:
    """readStream.format("kinesumer") -> transform -> writeStream.format("kinesumer"), the
    first read of every (batch, shard) failing once after its ledger write (its answer refused
    on the way; Spark runs the task again): nothing lost."""
    from support.group import put
    from support.spark_source import FirstLedgerWritesRefused, spark_group

    from kinesumer.spark.source import option_strings

    group = spark_group(kinesalite, dynalite, unique_name)
    source, out = group["stream"], unique_name("out")
    create_stream(kinesalite.url, source, 2)
    create_stream(kinesalite.url, out, 2)
    produced = put(kinesalite.url, source, 0, 200, key=lambda i: f"k{i % 7}")
    faults = FirstLedgerWritesRefused(group["config"])
    frame = (
        spark.readStream.format("kinesumer")
        .options(**option_strings(faults.config, [source]))
        .load()
    )
    transformed = frame.selectExpr("concat(data, X'21') AS data", "partition_key")
    query = (
        transformed.writeStream.format("kinesumer")
        .option("stream", out)
        .option("region", "us-east-1")
        .option("kinesis_endpoint", kinesalite.url)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        run_to_end(query)
    finally:
        faults.stop()
    assert query.exception() is None
    written = read_all(kinesalite.url, out)
    assert sorted(r.data for r in written) == sorted(d + b"!" for d in produced)
    assert faults.rule.fired >= 1  # the reads did fail once


def test_a_string_data_column_and_an_explicit_hash_key_column_are_written(
    spark: Any, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """``data`` as a string (written as UTF-8) and each row on the shard of its
    ``explicit_hash_key`` (one partition key for all: by its MD5 they would share a shard)."""
    stream = unique_name("sink")
    create_stream(kinesalite.url, stream, 3)
    shards = kinesis(kinesalite.url).list_shards(StreamName=stream)["Shards"]
    starts = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards}
    shard_ids = sorted(starts)
    rows = [(f"é{i}✓", "same", starts[shard_ids[i % 3]]) for i in range(60)]
    frame = spark.createDataFrame(
        rows, "data string, partition_key string, explicit_hash_key string"
    )
    (
        frame.write.format("kinesumer")
        .mode("append")
        .option("stream", stream)
        .option("region", "us-east-1")
        .option("kinesis_endpoint", kinesalite.url)
        .save()
    )
    landed = {r.data.decode("utf-8"): r.shard_id for r in read_all(kinesalite.url, stream)}
    assert landed == {f"é{i}✓": shard_ids[i % 3] for i in range(60)}


def test_a_bad_option_or_column_stops_a_streaming_query_at_its_first_batch_with_its_name(
    spark: Any, kinesalite: NodeStandIn, tmp_path: Any
) -> None:
    """Spark makes a streaming sink's writer when it plans the first micro-batch, in the query's
    thread: ``start()`` returns, and the query stops with the ``ConfigError`` (naming the option
    or column) before it writes a row; ``awaitTermination()`` raises it."""
    rate = spark.readStream.format("rate").option("rowsPerSecond", "10").load()
    good = rate.selectExpr(
        "CAST(value AS STRING) AS data", "CAST(value AS STRING) AS partition_key"
    )
    bad_column = rate.selectExpr("CAST(value AS STRING) AS data", "value AS partition_key")
    cases = [
        (good, {"ordering": "shard"}, r"ConfigError: Producer\(ordering\): must be"),
        (bad_column, {}, r"ConfigError: sink\(partition_key\): the sink needs a string"),
    ]
    for number, (frame, options, named) in enumerate(cases):
        query = (
            frame.writeStream.format("kinesumer")
            .option("stream", "s")
            .option("region", "us-east-1")
            .option("kinesis_endpoint", kinesalite.url)
            .option("checkpointLocation", str(tmp_path / f"ck{number}"))
            .options(**options)
            .start()
        )
        try:
            with pytest.raises(Exception, match=named):
                query.awaitTermination(60)
        finally:
            query.stop()
        assert not query.isActive and query.lastProgress is None  # not one batch ran


def test_a_task_failing_after_some_rows_were_written_is_retried_and_only_its_rows_repeat(
    spark: Any, kinesalite: NodeStandIn, unique_name: Callable[[str], str], tmp_path: Any
) -> None:
    """The duplicates case of docs/spark/sink.md: a Python UDF raises once (first attempt only,
    a file marks it) on row 5,500 of the first of two partitions of 6,000 rows, after the sink put
    earlier rows of that task (Spark hands the writer 100 rows at a time here; by default 10,000,
    and no row would reach it first). Spark runs the task again: every row arrives, and only rows
    of that partition before row 5,500 arrive twice."""
    from pyspark.sql.functions import col as spark_col
    from pyspark.sql.functions import udf

    stream = unique_name("sink")
    create_stream(kinesalite.url, stream, 4)
    marker = str(tmp_path / "failed-once")

    def fail_once(value: int) -> str:
        import os
        import time

        if value == 5500 and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(1.5)  # lets the sink's producer write the rows it was handed (linger)
            raise RuntimeError("the first attempt of this task fails here")
        return str(value)

    numbered = udf(fail_once, "string", useArrow=False)
    frame = spark.range(0, 12000, 1, 2).select(
        numbered("id").alias("data"), (spark_col("id") % 20).cast("string").alias("partition_key")
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        (
            frame.write.format("kinesumer")
            .mode("append")
            .option("stream", stream)
            .option("region", "us-east-1")
            .option("kinesis_endpoint", kinesalite.url)
            .option("aggregate", "true")  # 12,000+ rows: not paced at 1,000 records/s a shard
            .save()
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    counts = Counter(int(r.data) for r in read_all(kinesalite.url, stream))
    assert set(counts) == set(range(12000))  # every row at least once
    twice = {row for row, seen in counts.items() if seen > 1}
    assert os.path.exists(marker) and twice  # the task did fail after writing some rows
    assert twice <= set(range(5500)) and max(counts.values()) == 2


def test_their_option_names_write_and_a_refusal_reaches_the_user_as_one_named_line(
    spark: Any, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """A user switching from the AWS Labs or Databricks connector keeps their option names;
    a refused option reaches them as the library's named error, not a Python traceback."""
    stream = unique_name("sink")
    create_stream(kinesalite.url, stream, 1)
    frame = spark.createDataFrame([(b"x", "k")], "data binary, partition_key string")
    (
        frame.write.format("kinesumer")
        .mode("append")
        .option("kinesis.streamName", stream)
        .option("kinesis.region", "us-east-1")
        .option("kinesis.endpointUrl", kinesalite.url)
        .save()
    )
    assert [r.data for r in read_all(kinesalite.url, stream)] == [b"x"]
    with pytest.raises(Exception) as refused:
        (
            frame.write.format("kinesumer")
            .mode("append")
            .option("streamName", stream)
            .option("region", "us-east-1")
            .option("kinesis_endpoint", kinesalite.url)
            .option("ordering", "shard")
            .save()
        )
    text = str(refused.value)
    assert "ConfigError: Producer(ordering): must be" in text, text
    assert "Traceback (most recent call last)" not in text, text


def _out_of_key_order(records: list[Any]) -> int:
    """Records whose number is below an earlier one of the same key (as read, shard by shard:
    a key lives on one shard)."""
    seen: dict[str, int] = {}
    late = 0
    for record in records:
        number = int(record.data)
        if number < seen.get(record.partition_key, -1):
            late += 1
        seen[record.partition_key] = max(number, seen.get(record.partition_key, -1))
    return late


def test_rows_repartitioned_by_key_and_sorted_are_written_in_key_order(
    spark: Any, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """What docs/spark/sink.md tells: a key's rows in one task, in the order to keep."""
    stream = unique_name("sink")
    create_stream(kinesalite.url, stream, 2)
    rows = [(f"{i}", f"k{i % 40}", i) for i in range(4000)]
    frame = spark.createDataFrame(rows, "data string, partition_key string, n long").repartition(4)
    (
        frame.repartition(4, "partition_key")
        .sortWithinPartitions("n")
        .drop("n")
        .write.format("kinesumer")
        .mode("append")
        .option("stream", stream)
        .option("region", "us-east-1")
        .option("kinesis_endpoint", kinesalite.url)
        .save()
    )
    written = read_all(kinesalite.url, stream)
    assert sorted(int(r.data) for r in written) == list(range(4000))
    assert _out_of_key_order(written) == 0
