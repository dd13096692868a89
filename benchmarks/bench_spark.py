"""Rows per second through kinesumer.spark.foreach_batch, and Arrow vs row lists for DataFrames.

    .venv/bin/python benchmarks/bench_spark.py [--records 100000] [--batch-sizes 10000,50000]
                                               [--build-rows 10000,50000] [--rounds 3]
                                               [--build-rounds 5]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid) and local Spark
(``local[2]``, no UI):

1. A pre-filled 4-shard stream (``--records`` records of 100 B) drained by
   ``foreach_batch(..., available_now=True, max_records=<batch size>)`` (a fresh group each run,
   from TRIM_HORIZON, library defaults otherwise) into
   - ``poll loop (no Spark)``: the same member polling and committing batches of the same size,
     without Spark: the consumer's own ceiling, for reference;
   - ``fn: nothing``: the DataFrame is built (Arrow -> JVM) and handed to a no-op fn;
   - ``fn: noop write``: ``df.write.format("noop")``, a Spark job that materializes every row;
   - ``fn: Parquet write``: ``df.write.mode("append").parquet(tmp)``.
   Steady rate: records / (last fn end - first record), where the first record is placed
   ``collect_seconds`` before the first batch's DataFrame build; the whole run (joining the group,
   and the two coordinator ticks ``available_now`` waits before it returns) is shown beside it.
2. Building one DataFrame from ``--build-rows`` records: ``records_to_dataframe`` (a
   ``pyarrow.Table`` -> ``spark.createDataFrame``) against ``spark.createDataFrame(list_of_rows,
   schema)``, both followed by a noop write so each is fully materialized in the JVM. Medians of
   ``--build-rounds``, alternating; wall time and the driver's Python CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _standins import start_dynalite, start_kinesalite  # noqa: E402
from bench_core import fill  # noqa: E402

import kinesumer.spark as kspark  # noqa: E402
from kinesumer import Config, Kinesumer, Record, create_state_table  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
REGION = "us-east-1"
TABLE = "bench-spark-state"


def start_spark() -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kinesumer-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def config(kurl: str, durl: str) -> Config:
    return Config(
        app=f"bench-{uuid.uuid4().hex[:8]}",  # a fresh group: reads the stream from the start
        dynamodb_table=TABLE,
        region=REGION,
        kinesis_endpoint=kurl,
        dynamodb_endpoint=durl,
        initial_position="TRIM_HORIZON",
    )


class Timing:
    """First record and last fn end of one run (see the module docstring)."""

    def __init__(self) -> None:
        self.first_build: float | None = None
        self.first_record: float | None = None
        self.last_end = 0.0
        self.batch_sizes: list[int] = []


def run_spark(
    spark: Any, cfg: Config, stream: str, batch: int, sink: str, out: str
) -> dict[str, Any]:
    timing = Timing()
    build = kspark.records_to_dataframe

    def timed_build(session: Any, records: Any) -> Any:
        if timing.first_build is None:
            timing.first_build = time.monotonic()
        return build(session, records)

    def fn(df: Any, batch_id: int, info: kspark.BatchInfo) -> None:
        if batch_id == 0 and timing.first_build is not None:
            timing.first_record = timing.first_build - info.collect_seconds
        if sink == "noop":
            df.write.format("noop").mode("overwrite").save()
        elif sink == "parquet":
            df.write.mode("append").parquet(out)
        timing.batch_sizes.append(info.records)
        timing.last_end = time.monotonic()

    kspark.records_to_dataframe = timed_build  # instrumentation only: times the first build
    try:
        started = time.monotonic()
        summary = kspark.foreach_batch(
            spark, cfg, [stream], fn, max_records=batch, available_now=True
        )
        whole = time.monotonic() - started
    finally:
        kspark.records_to_dataframe = build
    assert timing.first_record is not None
    return {
        "records": summary.records,
        "steady": summary.records / (timing.last_end - timing.first_record),
        "whole": whole,
        "batches": summary.batches,
        "mean_batch": statistics.mean(timing.batch_sizes),
    }


def run_poll_loop(cfg: Config, stream: str, batch: int, total: int) -> dict[str, Any]:
    """The consumer alone: poll batches of the same size and commit each, no Spark."""
    count = batches = 0
    first: float | None = None
    started = time.monotonic()
    with Kinesumer(cfg.replace(auto_commit=False)) as consumer:
        consumer.subscribe([stream])
        while count < total:
            got = consumer.poll(max_records=batch, timeout=2.0)
            if got and first is None:
                first = time.monotonic()
            count += len(got)
            batches += bool(got)
            consumer.commit()
        end = time.monotonic()
    assert first is not None
    return {
        "records": count,
        "steady": count / (end - first),
        "whole": time.monotonic() - started,
        "batches": batches,
        "mean_batch": count / batches,
    }


def synthetic(n: int) -> list[Record]:
    """Records shaped like kinesalite's: 56-digit sequence numbers, 100 B of data, UTC times."""
    now = datetime.now(timezone.utc)
    base = 49_680_412_823_098_765_506_474_831_640_804_325_254_116_639_976_898_691_090
    return [
        Record(
            "bench",
            f"shardId-00000000000{i % 4}",
            str(base + i),
            0,
            f"k{i}",
            b"%08d" % i + b"x" * 92,
            now,
        )
        for i in range(n)
    ]


def build_ratio(spark: Any, n: int, rounds: int) -> dict[str, float]:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("stream", T.StringType(), False),
            T.StructField("shard_id", T.StringType(), False),
            T.StructField("sequence_number", T.StringType(), False),
            T.StructField("sub_sequence_number", T.LongType(), False),
            T.StructField("partition_key", T.StringType(), False),
            T.StructField("data", T.BinaryType(), False),
            T.StructField("approximate_arrival_timestamp", T.TimestampType(), True),
        ]
    )
    records = synthetic(n)

    def arrow() -> Any:
        return kspark.records_to_dataframe(spark, records)

    def rows() -> Any:
        return spark.createDataFrame(records, schema)

    def measure(make: Callable[[], Any]) -> tuple[float, float, float]:
        started, cpu = time.perf_counter(), time.process_time()
        df = make()
        built, built_cpu = time.perf_counter(), time.process_time()
        df.write.format("noop").mode("overwrite").save()
        return built - started, time.perf_counter() - started, built_cpu - cpu

    results: dict[str, list[tuple[float, float, float]]] = {"arrow": [], "rows": []}
    for _ in range(rounds):
        for name, make in (("arrow", arrow), ("rows", rows)):
            results[name].append(measure(make))
    out: dict[str, float] = {}
    for name, runs in results.items():
        out[f"{name}_build"] = statistics.median(r[0] for r in runs)
        out[f"{name}_total"] = statistics.median(r[1] for r in runs)
        out[f"{name}_cpu"] = statistics.median(r[2] for r in runs)
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median steady rate (its other figures come with it)."""
    return sorted(runs, key=lambda r: r["steady"])[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch-sizes", default="10000,50000")
    parser.add_argument("--build-rows", default="10000,50000")
    parser.add_argument("--rounds", type=int, default=3, help="runs per stream figure")
    parser.add_argument("--build-rounds", type=int, default=5, help="runs per build figure")
    args = parser.parse_args()
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    build_rows = [int(x) for x in args.build_rows.split(",")]

    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    spark = None
    rows: list[tuple[str, int, dict[str, Any]]] = []
    builds: list[tuple[int, dict[str, float]]] = []
    try:
        create_state_table(
            Config(app="bench", dynamodb_table=TABLE, region=REGION, dynamodb_endpoint=dynalite.url)
        )
        stream = f"bench-{uuid.uuid4().hex[:8]}"
        print(f"filling {stream}: {args.records} records of 100 B on 4 shards ...", flush=True)
        fill(kinesalite.url, stream, 4, args.records)
        print("starting Spark ...", flush=True)
        spark = start_spark()
        with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
            # Warm the JVM up (first jobs compile code): not part of any figure.
            warm = synthetic(1000)
            kspark.records_to_dataframe(spark, warm).write.format("noop").mode("overwrite").save()
            kspark.records_to_dataframe(spark, warm).write.parquet(f"{tmp}/warm")
            build_ratio(spark, 1000, 1)
            for n in build_rows:
                print(f"DataFrame build, {n} rows ...", flush=True)
                builds.append((n, build_ratio(spark, n, args.build_rounds)))
            for batch in batch_sizes:
                for sink in ("poll", "nothing", "noop", "parquet"):
                    runs = []
                    for n in range(args.rounds):
                        cfg = config(kinesalite.url, dynalite.url)
                        print(f"batch {batch}, {sink}, round {n + 1} ...", flush=True)
                        if sink == "poll":
                            result = run_poll_loop(cfg, stream, batch, args.records)
                        else:
                            out = f"{tmp}/{sink}-{batch}-{n}"
                            result = run_spark(spark, cfg, stream, batch, sink, out)
                        assert result["records"] == args.records, result
                        runs.append(result)
                    rows.append((sink, batch, median_run(runs)))
    finally:
        if spark is not None:
            spark.stop()
        kinesalite.stop()
        dynalite.stop()

    import pyarrow
    import pyspark

    labels = {
        "poll": "poll loop (no Spark)",
        "nothing": "fn: nothing",
        "noop": "fn: noop write",
        "parquet": "fn: Parquet write",
    }
    print()
    print(
        f"foreach_batch, {args.records} records x 100 B, 4 shards, kinesalite + dynalite, "
        f"local[2], median of {args.rounds} ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"pyspark {pyspark.__version__}, pyarrow {pyarrow.__version__})"
    )
    print(
        f"| {'sink':22s} | {'max_records':>11s} | {'batches':>7s} | {'mean batch':>10s} | "
        f"{'rows/s steady':>13s} | {'whole run':>9s} |"
    )
    print(f"|{'-' * 24}|{'-' * 13}|{'-' * 9}|{'-' * 12}|{'-' * 15}|{'-' * 11}|")
    for sink, batch, r in rows:
        print(
            f"| {labels[sink]:22s} | {batch:11d} | {r['batches']:7d} | {r['mean_batch']:10.0f} | "
            f"{r['steady']:13.0f} | {r['whole']:8.1f}s |"
        )
    print()
    print(
        f"DataFrame from records (100 B each): createDataFrame (build, and the Python CPU it "
        f"takes), then a noop write; median of {args.build_rounds}"
    )
    print(
        f"| {'rows':>6s} | {'Arrow build':>11s} | {'rows build':>10s} | {'ratio':>6s} | "
        f"{'Arrow CPU':>9s} | {'rows CPU':>9s} | {'ratio':>6s} | "
        f"{'Arrow +write':>12s} | {'rows +write':>11s} | {'ratio':>6s} |"
    )
    print(
        f"|{'-' * 8}|{'-' * 13}|{'-' * 12}|{'-' * 8}|{'-' * 11}|{'-' * 11}|{'-' * 8}|"
        f"{'-' * 14}|{'-' * 13}|{'-' * 8}|"
    )
    for n, b in builds:
        print(
            f"| {n:6d} | {b['arrow_build']:10.3f}s | {b['rows_build']:9.3f}s | "
            f"{b['rows_build'] / b['arrow_build']:5.1f}x | {b['arrow_cpu']:8.3f}s | "
            f"{b['rows_cpu']:8.3f}s | {b['rows_cpu'] / b['arrow_cpu']:5.1f}x | "
            f"{b['arrow_total']:11.3f}s | {b['rows_total']:10.3f}s | "
            f"{b['rows_total'] / b['arrow_total']:5.1f}x |"
        )


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
