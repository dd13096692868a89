"""Building a DataFrame from records: through Arrow (``records_to_dataframe``) vs Python rows.

    .venv/bin/python benchmarks/bench_spark_arrow.py [--rows 10000,50000] [--rounds 5]

Local Spark (``local[2]``, no UI), no stand-ins. For each ``--rows``, synthetic records shaped
like kinesalite's (56-digit sequence numbers, 100 B of data, UTC times) become one DataFrame by
``kinesumer.spark.records_to_dataframe`` (a ``pyarrow.Table`` -> ``spark.createDataFrame``) and
by ``spark.createDataFrame(list_of_rows, schema)``, each followed by a noop write so it is fully
materialized in the JVM. Medians of ``--rounds``, alternating; wall time and the driver's Python
CPU time. This is why both Spark paths of kinesumer hand Spark Arrow, never rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from bench_spark import start_spark

from kinesumer import Record
from kinesumer.spark import records_to_dataframe, spark_schema

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


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
    records = synthetic(n)
    schema = spark_schema()

    def arrow() -> Any:
        return records_to_dataframe(spark, records)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10000,50000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    spark = start_spark("local[2]")
    builds: list[tuple[int, dict[str, float]]] = []
    try:
        build_ratio(spark, 1000, 1)  # warm the JVM up (first jobs compile code)
        for n in (int(x) for x in args.rows.split(",")):
            print(f"DataFrame build, {n} rows ...", flush=True)
            builds.append((n, build_ratio(spark, n, args.rounds)))
    finally:
        spark.stop()
    print(
        f"\nDataFrame from records (100 B each): createDataFrame (build, and the Python CPU it "
        f"takes), then a noop write; median of {args.rounds}"
    )
    print(
        "| rows | Arrow build | rows build | ratio | Arrow CPU | rows CPU | ratio | "
        "Arrow +write | rows +write | ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, b in builds:
        print(
            f"| {n} | {b['arrow_build']:.3f}s | {b['rows_build']:.3f}s | "
            f"{b['rows_build'] / b['arrow_build']:.1f}x | {b['arrow_cpu']:.3f}s | "
            f"{b['rows_cpu']:.3f}s | {b['rows_cpu'] / b['arrow_cpu']:.1f}x | "
            f"{b['arrow_total']:.3f}s | {b['rows_total']:.3f}s | "
            f"{b['rows_total'] / b['arrow_total']:.1f}x |"
        )


if __name__ == "__main__":
    main()
