"""The benchmark suite: every figure of the site's Measured page from one command.

    ./scripts/bench            (installs the bench extra, then runs this)
    .venv/bin/python benchmarks/run.py [--quick] [--no-readme]

On kinesalite + dynalite started here on free loopback ports (stopped by pid). Writes
``benchmarks/results/results.json`` (raw), ``benchmarks/results/results.md`` (tables) and
``benchmarks/results/summary.png`` (plots), and replaces the section of ``docs/measured.md``
between ``<!-- benchmarks:begin -->`` and ``<!-- benchmarks:end -->`` with the tables (naming the
command, ``--quick`` included): the site's figures come from this command, never from hand
edits. Every figure is a ratio or a side by side from the same run (the machines are shared and
noisy).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

import bench_assignment  # noqa: E402
import bench_core  # noqa: E402
import bench_cost  # noqa: E402
import bench_failover  # noqa: E402
import bench_group  # noqa: E402
import bench_handlers  # noqa: E402
import bench_handlers_keys  # noqa: E402
import bench_idle  # noqa: E402
import bench_limits  # noqa: E402
from support.scenario import Scenario  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import create_state_table  # noqa: E402

RESULTS = HERE / "results"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"


def run_all(quick: bool) -> dict[str, Any]:
    scale = 0.3 if quick else 1.0
    out: dict[str, Any] = {"machine": machine(), "started": now(), "quick": quick}
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    kurl, durl = kinesalite.url, dynalite.url
    timings: dict[str, float] = {}
    try:
        create_state_table(bench_core.bench_config(None, durl, "bench"))
        started = time.monotonic()
        out["throughput"] = []
        # Steady state must last seconds, not a fraction of one, or the ratios are noise.
        for shards, size, records in (
            (4, 100, 150_000),
            (16, 100, 150_000),
            (4, 10_240, 15_000),
            (16, 10_240, 15_000),
        ):
            cell = bench_core.compare(kurl, durl, shards, size, int(records * scale), 3)
            out["throughput"].append(cell)
            print(
                f"  throughput {shards} shards x {size} B: {cell['rate_ratio']:.2f}x records/s, "
                f"{cell['cpu_ratio']:.2f}x CPU of the plain loop",
                flush=True,
            )
        timings["throughput"] = time.monotonic() - started

        started = time.monotonic()
        out["scaling"] = bench_group.scaling(kurl, durl, int(100_000 * scale), (1, 2, 4))
        timings["scaling"] = time.monotonic() - started

        started = time.monotonic()
        out["failover"] = failover(kurl, durl, rounds=1 if quick else 2)
        timings["failover"] = time.monotonic() - started

        started = time.monotonic()
        out["cost"] = bench_group.cost(kurl, durl, (1, 10, 50), 16, 10.0 if quick else 15.0, 400)
        timings["cost"] = time.monotonic() - started

        started = time.monotonic()
        sizes = (1, 10, 200) if quick else (1, 10, 50, 200, 1000)
        out["flat_cost"] = bench_cost.cost(kurl, durl, sizes, 8.0 if quick else 15.0)
        out["go_timing_cost"] = bench_cost.cost(
            kurl, durl, (10,) if quick else (1, 10, 200), 30.0, go_timing=True
        )
        timings["flat_cost"] = time.monotonic() - started

        started = time.monotonic()
        out["assignment"] = bench_limits.assignment_scale()
        out["items"] = bench_limits.item_sizes()
        out["memory"] = bench_limits.memory(
            kurl, durl, (20_000, int(1_000_000 * scale)), 10.0 if quick else 15.0
        )
        timings["limits"] = time.monotonic() - started

        started = time.monotonic()
        out["assignment_modes"] = {
            "movement": bench_assignment.movement(),
            "scale": bench_assignment.scale(),
        }
        timings["assignment_modes"] = time.monotonic() - started

        started = time.monotonic()
        out["handlers"] = bench_handlers.run(kurl, durl, quick)
        print(bench_handlers.report(out["handlers"]), flush=True)
        timings["handlers"] = time.monotonic() - started

        # Short settings even in the full suite (about 1 and 2 minutes): the few-key table and
        # the idle delays (issue 23).
        started = time.monotonic()
        out["handler_keys"] = bench_handlers_keys.run(kurl, durl, quick=True)
        print(bench_handlers_keys.report(out["handler_keys"]), flush=True)
        timings["handler_keys"] = time.monotonic() - started

        started = time.monotonic()
        out["idle"] = bench_idle.run(kurl, durl, quick=True)
        print(bench_idle.report(out["idle"]), flush=True)
        timings["idle"] = time.monotonic() - started

        started = time.monotonic()
        out["sinks"] = sinks(kurl, durl, quick)
        timings["sinks"] = time.monotonic() - started

        started = time.monotonic()
        out["producer"] = producer(kurl, quick)
        timings["producer"] = time.monotonic() - started

        started = time.monotonic()
        out["read"] = read(kurl, durl, quick)
        timings["read"] = time.monotonic() - started

        started = time.monotonic()
        out["efo"] = efo(quick)
        timings["efo"] = time.monotonic() - started

        started = time.monotonic()
        out["dynamodb_streams"] = dynamodb_streams(quick)
        timings["dynamodb_streams"] = time.monotonic() - started

        started = time.monotonic()
        out["streams_by_arn"] = streams_by_arn(quick)
        timings["streams_by_arn"] = time.monotonic() - started

        started = time.monotonic()
        out["spark"] = spark(kurl, durl, quick)
        timings["spark"] = time.monotonic() - started

        started = time.monotonic()
        out["spark_sink"] = spark_sink(kurl, quick)
        timings["spark_sink"] = time.monotonic() - started
    finally:
        kinesalite.stop()
        dynalite.stop()
    out["seconds"] = timings
    out["finished"] = now()
    return out


def failover(kurl: str, durl: str, rounds: int) -> list[dict[str, float]]:
    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as workdir:
        world = Scenario(kurl, durl, f"fo-{os.getpid()}", "bench-state", Path(workdir))
        for number in range(rounds):
            world.app = f"fo-{os.getpid()}-{number}"
            try:
                results.append(bench_failover.one_round(world, number, 6))
            finally:
                world.close()
                world.members.clear()
                world.producers.clear()
            print(f"  failover round {number + 1}: {results[-1]}", flush=True)
    return results


def sinks(kurl: str, durl: str, quick: bool) -> dict[str, Any]:
    """Exactly-once sinks beside plain ones (bench_sinks.py: starts moto and PostgreSQL)."""
    import bench_sinks

    result = bench_sinks.run_with_servers(kurl, durl, quick)
    print(bench_sinks.report(result), flush=True)
    return result


def producer(kurl: str, quick: bool) -> dict[str, Any]:
    """The Producer vs a plain boto3 put_records loop (bench_producer.py)."""
    import bench_producer

    result = bench_producer.run(kurl, 6_000 if quick else 30_000)
    print(bench_producer.report(result), flush=True)
    return result


def read(kurl: str, durl: str, quick: bool) -> dict[str, Any]:
    """The lean GetRecords path vs botocore's parser vs plain loops (bench_read.py)."""
    import bench_read

    records, rounds = (40_000, 1) if quick else (160_000, 3)
    table = bench_read.run(kurl, durl, records, rounds)
    print(bench_read.report(table, records, rounds), flush=True)
    return {"table": table, "records": records, "rounds": rounds}


def spark_sink(kurl: str, quick: bool) -> dict[str, Any] | None:
    """The Spark sink vs foreachBatch writing with boto3 (bench_spark_sink.py); None without
    the spark extra."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        return None
    import bench_spark_sink

    records = 6_000 if quick else 20_000
    table = bench_spark_sink.run(kurl, records, 1, "local[2]")
    print(bench_spark_sink.report(table, records, "local[2]"), flush=True)
    return {"table": table, "records": records, "master": "local[2]"}


def efo(quick: bool) -> dict[str, Any]:
    """Enhanced fan-out vs polling (bench_efo.py: on its own kinesis-local + dynalite)."""
    import bench_efo

    result = bench_efo.run_with_servers(quick)
    print(bench_efo.report(result), flush=True)
    return result


def dynamodb_streams(quick: bool) -> dict[str, Any]:
    """A table's stream read by kinesumer vs a boto3 loop (bench_dynamodb_streams.py: moto)."""
    import bench_dynamodb_streams

    result = bench_dynamodb_streams.run(quick)
    print(bench_dynamodb_streams.report(result), flush=True)
    return result


def streams_by_arn(quick: bool) -> dict[str, Any]:
    """Three streams of two accounts and two regions vs one stream, one member
    (bench_streams_by_arn.py: its own moto server process)."""
    import bench_streams_by_arn

    records, rounds = (12_000, 2) if quick else (30_000, 3)
    result = bench_streams_by_arn.run(records, rounds)
    print(bench_streams_by_arn.report(result), flush=True)
    return result


def spark(kurl: str, durl: str, quick: bool) -> dict[str, Any] | None:
    """foreach_batch vs the streaming source, local[1] and local[2] (bench_spark.py); None
    without the spark extra."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        print("  spark: skipped (pip install 'kinesumer[spark]')", flush=True)
        return None
    import bench_arrow_build
    import bench_spark
    import bench_spark_latency

    if quick:  # the two paths side by side on local[2], no Parquet: one JVM, two short runs
        noop = ("foreach_batch/noop", "source/noop")
        result = bench_spark.suite(
            kurl, durl, records=20_000, rounds=1, masters=("local[2]",), contenders=noop
        )
    else:
        result = bench_spark.suite(kurl, durl, records=60_000, rounds=1)
    result["latency"] = bench_spark_latency.suite(kurl, durl, quick)  # the source, under load
    rounds = 9 if quick else 25  # a GetRecords answer into the executors' Arrow, no Spark
    result["arrow_build"] = bench_arrow_build.run(10_000, rounds)
    print(bench_arrow_build.report(result["arrow_build"], 10_000, rounds), flush=True)
    return result


def machine() -> str:
    return (
        f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at start"
    )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


if __name__ == "__main__":
    from _report import main

    main(run_all, RESULTS, ROOT / "docs" / "measured.md", BEGIN, END)
