"""kinesumer into Spark, side by side: ``foreach_batch`` against the Structured Streaming source.

    .venv/bin/python benchmarks/bench_spark.py [--records 100000] [--rounds 2] [--batch 40000]
                                               [--masters local[1],local[2]]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid), one pre-filled
4-shard stream (``--records`` records of 100 B) is drained, from TRIM_HORIZON by a fresh group
each run, by

- ``Kinesumer.poll`` (no Spark): one member polling and committing batches of ``--batch``
  records: what one Python process reads here, for reference;
- ``foreach_batch(available_now=True, max_records=--batch)`` with a sink, and
- ``spark.readStream.format("kinesumer")`` (``max_records_per_trigger=--batch``,
  ``trigger(availableNow=True)``) with the same sink,

where the sink is ``noop`` (``df.write.format("noop")`` inside ``foreachBatch``: every row is
materialized, nothing written; a ``foreachBatch`` that ignores ``df`` would not even read) or
``Parquet`` (the source: ``writeStream.format("parquet")``; foreach_batch: an append).
``--batch`` defaults to the source's own batch on 4 shards (``max_records_per_shard``, 10,000:
one GetRecords at the default ``scan_limit``, per shard). Each Spark master runs in its own
child process (a fresh JVM), contenders alternating over ``--rounds``; the table shows medians.

Figures per run: **rows/s** over the whole run (start to the end of the last batch: joining the
group, reading, the sink, and ``available_now``'s settle ticks) and **steady** (first to last
batch with rows); **driver CPU**: CPU seconds per 100k records of the driver-side Python
processes, read from ``/proc``: the application process (for foreach_batch: everything; for the
source: the ``foreachBatch`` callbacks) plus, for the source, the long-lived
``python_streaming_source_runner`` worker the JVM starts for the query (the reader: offsets,
group membership, the ledger), over the whole run and over the steady part. The worker's CPU is
sampled every 0.25 s while it lives (it ends with the query), so its last quarter second may be
missed. Beside them: the CPU of the executors' Python (PySpark's task worker daemon and the
workers it forks: the source's reads), of Spark's other Python workers (they look the source
up, create it and pickle its read function: a fixed cost per query, which a short run does
not amortize) and of the JVM. Every process under this one is sampled, so a worker that ends
during the run counts too; the meter's own sampling is not counted in ``app``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_core import bench_config, fill  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Config, Kinesumer, create_state_table  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

CONTENDERS = ("foreach_batch/noop", "source/noop", "foreach_batch/parquet", "source/parquet")
#: Also accepted in ``--contenders``: ``source-no-read-ahead/<sink>``, the source with
#: ``read_ahead=false`` (its tasks read for themselves), the same run's baseline for read-ahead.
RESULT_PREFIX = "BENCH_SPARK_RESULT "
SOURCE_RUNNER = "python_streaming_source_runner"
EXECUTOR_DAEMON = "pyspark.daemon pyspark.worker"
TICKS = os.sysconf("SC_CLK_TCK")


# -- process CPU from /proc ---------------------------------------------------------------------
def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: fields 14 and 15


def process_tree(root: int) -> dict[int, str]:
    """``pid -> command line`` of every descendant of ``root``."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                commands[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
    out: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in out:
                out[pid] = commands.get(pid, "")
                frontier.append(pid)
    return out


def role(command: str) -> str:
    """``reader`` (the query's long-lived source worker), ``executors`` (PySpark's worker daemon
    for tasks, ``pyspark.daemon pyspark.worker``, and the workers it forks: the source's reads),
    ``planning`` (the other Python workers: the daemons and workers that look the source up,
    create it, and pickle its read function, once per query), ``jvm`` or ``other``, by the
    executable and its module."""
    program = os.path.basename(command.split(" ", 1)[0])
    if program.startswith("java"):
        return "jvm"
    if program.startswith("python"):
        if SOURCE_RUNNER in command:
            return "reader"
        return "executors" if EXECUTOR_DAEMON in command else "planning"
    return "other"


class CpuMeter:
    """CPU seconds spent during a run by this process and by the Spark processes under it.

    While running (a context manager), a thread samples every 0.25 s the CPU of this process
    (``app``, less the meter's own sampling) and of every process under it, by :func:`role`,
    so a Python worker that ends during the run counts with its last sample (up to 0.25 s of
    its CPU may be missed). :meth:`between` gives ``app`` and ``reader`` for a window of
    wall-clock time (the steady part of a run); :meth:`result` the whole run, by role:
    ``workers`` is every Python worker but the reader (``executors`` + ``planning``).
    """

    INTERVAL = 0.25

    def __init__(self) -> None:
        me = os.getpid()
        tree = process_tree(me)
        self._before = {pid: cpu_seconds(pid) or 0.0 for pid in tree}
        self._before[me] = cpu_seconds(me) or 0.0
        self._last: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU seconds when last seen)
        self._own = 0.0  # CPU seconds this meter spent sampling (in this process)
        # (wall time, app, reader, executors), CPU seconds since the meter began
        self.series: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)

    def __enter__(self) -> CpuMeter:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            self.sample()

    def sample(self) -> None:
        began = time.thread_time()
        for pid, command in process_tree(os.getpid()).items():
            seconds = cpu_seconds(pid)
            if seconds is not None:
                self._last[pid] = (role(command), seconds)
        by_role = {"reader": 0.0, "executors": 0.0}
        for pid, (kind, seconds) in self._last.items():
            if kind in by_role:
                by_role[kind] += seconds - self._before.get(pid, 0.0)
        self._own += time.thread_time() - began
        app = (cpu_seconds(os.getpid()) or 0.0) - self._before[os.getpid()] - self._own
        self.series.append((time.time(), app, by_role["reader"], by_role["executors"]))

    def between(self, start: float, end: float) -> dict[str, float]:
        """``app``, ``reader`` and ``executors`` CPU seconds from the last sample before
        ``start`` to the first one after ``end`` (wall-clock times)."""
        before = [s for s in self.series if s[0] <= start] or self.series[:1]
        after = [s for s in self.series if s[0] >= end] or self.series[-1:]
        a, b = after[0], before[-1]
        return {"app": a[1] - b[1], "reader": a[2] - b[2], "executors": a[3] - b[3]}

    def result(self) -> dict[str, float]:
        out = {"app": self.series[-1][1], "reader": self.series[-1][2]}
        for pid, (kind, seconds) in self._last.items():
            if kind in ("executors", "planning", "jvm"):
                out[kind] = out.get(kind, 0.0) + seconds - self._before.get(pid, 0.0)
        out["workers"] = out.get("executors", 0.0) + out.get("planning", 0.0)
        return out


# -- one run per contender (in the child process, which owns a Spark session) --------------------
def start_spark(master: str) -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("kinesumer-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def noop_write(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def run_foreach_batch(
    spark: Any, cfg: Config, stream: str, batch: int, sink: str
) -> dict[str, Any]:
    from kinesumer.spark import BatchInfo, foreach_batch

    ends: list[tuple[float, float, int]] = []  # (first record, fn end, rows) per batch
    out = tempfile.mkdtemp(prefix="bench-spark-fb-")

    def fn(df: Any, batch_id: int, info: BatchInfo) -> None:
        began = time.time()
        if sink == "noop":
            noop_write(df)
        else:
            df.write.mode("append").parquet(out)
        # The batch's first record came collect_seconds (plus the DataFrame build) before fn.
        ends.append((began - info.collect_seconds, time.time(), info.records))

    with CpuMeter() as meter:
        started = time.monotonic()
        summary = foreach_batch(spark, cfg, [stream], fn, max_records=batch, available_now=True)
        whole = time.monotonic() - started
    return {
        "records": summary.records,
        "batches": summary.batches,
        "whole": whole,
        "steady": steady_rate(ends),
        "cpu": meter.result(),
        "steady_cpu": steady_cpu(meter, ends),
        **sustained(meter, ends),
    }


def run_source(
    spark: Any, cfg: Config, stream: str, batch: int, sink: str, read_ahead: bool = True
) -> dict[str, Any]:
    from kinesumer.spark import KinesumerDataSource

    spark.dataSource.register(KinesumerDataSource)
    work = tempfile.mkdtemp(prefix="bench-spark-src-")
    reader = spark.readStream.format("kinesumer")
    for name, value in source_options(cfg, stream, batch).items():
        reader = reader.option(name, value)
    reader = reader.option("read_ahead", str(read_ahead).lower())
    writer = reader.load().writeStream.option("checkpointLocation", f"{work}/checkpoint")
    if sink == "noop":
        writer = writer.foreachBatch(lambda df, batch_id: noop_write(df))
    else:
        writer = writer.format("parquet").option("path", f"{work}/out")
    with CpuMeter() as meter:
        started = time.monotonic()
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        whole = time.monotonic() - started
    cpu = meter.result()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    every = query.recentProgress
    phases: dict[str, float] = {}  # where the query's time went (ms), every trigger summed
    for p in every:
        for phase, ms in p["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + ms
    progress = [p for p in every if p["numInputRows"]]
    ends = [
        (
            datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp(),
            datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            + p["durationMs"]["triggerExecution"] / 1000,
            int(p["numInputRows"]),
        )
        for p in progress
    ]
    return {
        "records": sum(rows for _, _, rows in ends),
        "batches": len(ends),
        "whole": whole,
        "steady": steady_rate(ends),
        "cpu": cpu,
        "steady_cpu": steady_cpu(meter, ends),
        **sustained(meter, ends),
        "triggers": len(every),
        "phases_ms": phases,
    }


def source_options(cfg: Config, stream: str, batch: int) -> dict[str, str]:
    options = {
        "app": cfg.app,
        "dynamodb_table": cfg.dynamodb_table,
        "region": cfg.region or "us-east-1",
        "streams": stream,
        "initial_position": "TRIM_HORIZON",
        "max_records_per_trigger": str(batch),
    }
    if cfg.kinesis_endpoint:
        options["kinesis_endpoint"] = cfg.kinesis_endpoint
    if cfg.dynamodb_endpoint:
        options["dynamodb_endpoint"] = cfg.dynamodb_endpoint
    return options


def steady_cpu(meter: CpuMeter, ends: list[tuple[float, float, int]]) -> dict[str, float]:
    """Driver-side CPU from the first batch's start to the last batch's end: without the
    start-up (a new worker's imports, joining the group) and the end of the run."""
    if not ends:
        return {"app": 0.0, "reader": 0.0}
    return meter.between(min(s for s, _, _ in ends), max(e for _, e, _ in ends))


def sustained(meter: CpuMeter, ends: list[tuple[float, float, int]]) -> dict[str, Any]:
    """Rows/s and CPU from the end of the first batch with rows to the end of the last: the
    pipeline once running (the first batch's start-up, joining the group and, for the source,
    a read with nothing read ahead yet, left out; both paths alike)."""
    ordered = sorted(ends, key=lambda e: e[1])
    if len(ordered) < 2:
        return {}
    start, end = ordered[0][1], ordered[-1][1]
    rows = sum(r for _, _, r in ordered[1:])
    return {
        "sustained": rows / (end - start) if end > start else 0.0,
        "sustained_rows": rows,
        "sustained_cpu": meter.between(start, end),
    }


def steady_rate(ends: list[tuple[float, float, int]]) -> float:
    """Rows per second from the first batch's start to the last batch's end."""
    if not ends:
        return 0.0
    span = max(end for _, end, _ in ends) - min(start for start, _, _ in ends)
    return sum(rows for _, _, rows in ends) / span if span > 0 else 0.0


def child(args: argparse.Namespace) -> None:
    """One Spark master: every contender, alternating, ``rounds`` times; results on stdout."""
    spark = start_spark(args.master)
    try:
        warm = spark.range(1000).selectExpr("id", "cast(id as string) as s")  # JIT, first jobs
        warm.write.format("noop").mode("overwrite").save()
        results: list[dict[str, Any]] = []
        for number in range(args.rounds):
            for contender in args.contenders.split(","):
                face, sink = contender.split("/")
                cfg = bench_config(
                    args.kinesis, args.dynamodb, f"bench-spark-{uuid.uuid4().hex[:8]}"
                )
                runs: dict[str, Callable[..., dict[str, Any]]] = {
                    "foreach_batch": run_foreach_batch,
                    "source": run_source,
                    "source-no-read-ahead": partial(run_source, read_ahead=False),
                }
                run = runs[face]
                print(f"  {args.master} {contender} round {number + 1} ...", flush=True)
                result = run(spark, cfg, args.stream, args.batch, sink)
                results.append({"master": args.master, "contender": contender, **result})
                print(f"    {summary_line(results[-1])}", flush=True)
        print(RESULT_PREFIX + json.dumps(results), flush=True)
    finally:
        spark.stop()


def summary_line(r: dict[str, Any]) -> str:
    per = 100_000 / max(1, r["records"])
    cpu = {k: f"{v * per:.2f}" for k, v in sorted(r["cpu"].items())}
    steady = {k: f"{v * per:.2f}" for k, v in sorted(r.get("steady_cpu", {}).items())}
    line = (
        f"{r['records']} records in {r['batches']} batches, {r['records'] / r['whole']:.0f} "
        f"rows/s whole, {r['steady']:.0f} steady, {r.get('sustained', 0):.0f} after the first "
        f"batch; CPU s/100k {cpu}, steady {steady}"
    )
    if "phases_ms" in r:
        phases = ", ".join(f"{k} {v / 1000:.1f}" for k, v in sorted(r["phases_ms"].items()))
        line += f"; {r['triggers']} triggers, seconds in: {phases}"
    return line


# -- the suite (parent process: stand-ins, the stream, one child per master) --------------------
def poll_reference(kurl: str, durl: str, stream: str, batch: int, total: int) -> dict[str, Any]:
    """``Kinesumer.poll`` batches, committed, no Spark: what one Python process reads here."""
    cfg = bench_config(kurl, durl, f"bench-spark-poll-{uuid.uuid4().hex[:8]}", auto_commit=False)
    count = batches = first_rows = 0
    first: float | None = None
    after_first = after_first_cpu = 0.0
    cpu = first_cpu = time.process_time()
    started = time.monotonic()
    with Kinesumer(cfg) as consumer:
        consumer.subscribe([stream])
        while count < total:
            asked, asked_cpu = time.monotonic(), time.process_time()
            got = consumer.poll(max_records=batch, timeout=2.0)
            if got and first is None:  # steady from the poll that brought the first records
                first, first_cpu = asked, asked_cpu
                after_first, after_first_cpu, first_rows = (
                    time.monotonic(),
                    time.process_time(),
                    len(got),
                )
            count += len(got)
            batches += bool(got)
            consumer.commit()
        end, end_cpu = time.monotonic(), time.process_time()
    return {
        "master": "-",
        "contender": "Kinesumer.poll/none",
        "records": count,
        "batches": batches,
        "whole": end - started,
        "steady": count / (end - (first or started)),
        "cpu": {"app": time.process_time() - cpu},
        "steady_cpu": {"app": end_cpu - first_cpu},
        "sustained": (count - first_rows) / (end - after_first),
        "sustained_rows": count - first_rows,
        "sustained_cpu": {"app": end_cpu - after_first_cpu},
    }


def suite(
    kurl: str,
    durl: str,
    records: int = 100_000,
    rounds: int = 2,
    batch: int = 40_000,
    masters: tuple[str, ...] = ("local[1]", "local[2]"),
    contenders: tuple[str, ...] = CONTENDERS,
) -> dict[str, Any]:
    """Fill one stream, measure every contender on every master; the raw runs and medians.
    ``kurl``/``durl``: running kinesalite/dynalite (the ``bench-state`` table is created if
    missing)."""
    import pyarrow
    import pyspark

    create_state_table(bench_config(None, durl, "bench"))
    stream = f"bench-spark-{uuid.uuid4().hex[:8]}"
    print(f"  spark: filling {stream} with {records} records of 100 B on 4 shards", flush=True)
    fill(kurl, stream, 4, records)
    runs = [poll_reference(kurl, durl, stream, batch, records)]
    print(f"    poll reference: {summary_line(runs[0])}", flush=True)
    for master in masters:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            f"--master={master}",
            f"--kinesis={kurl}",
            f"--dynamodb={durl}",
            f"--stream={stream}",
            f"--batch={batch}",
            f"--rounds={rounds}",
            f"--contenders={','.join(contenders)}",
        ]
        runs += child_runs(command)
    for run in runs:
        if run["records"] != records:
            raise AssertionError(f"{run['contender']} on {run['master']}: {run['records']} rows")
    return {
        "records": records,
        "batch": batch,
        "rounds": rounds,
        "shards": 4,
        "pyspark": pyspark.__version__,
        "pyarrow": pyarrow.__version__,
        "runs": runs,
        "cells": medians(runs),
    }


def child_runs(command: list[str]) -> list[dict[str, Any]]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout is not None
    result: list[dict[str, Any]] | None = None
    for line in process.stdout:
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
        else:
            print(line, end="", flush=True)
    if process.wait() != 0 or result is None:
        raise RuntimeError(f"{' '.join(command)} failed (exit {process.returncode})")
    return result


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (master, contender): median rows/s and CPU seconds per 100k records, by role."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["master"], run["contender"]), []).append(run)
    out = []
    for (master, contender), group in cells.items():
        per = [100_000 / r["records"] for r in group]
        roles = sorted({k for r in group for k in r["cpu"]})
        cpu = {
            k: statistics.median(r["cpu"].get(k, 0.0) * p for r, p in zip(group, per, strict=True))
            for k in roles
        }
        driver = statistics.median(
            (r["cpu"].get("app", 0.0) + r["cpu"].get("reader", 0.0)) * p
            for r, p in zip(group, per, strict=True)
        )
        steady = [r.get("steady_cpu", {}) for r in group]
        steady_driver = statistics.median(
            (c.get("app", 0.0) + c.get("reader", 0.0)) * p for c, p in zip(steady, per, strict=True)
        )
        out.append(
            {
                "master": master,
                "contender": contender,
                "rate": statistics.median(r["records"] / r["whole"] for r in group),
                "steady": statistics.median(r["steady"] for r in group),
                "batches": statistics.median(r["batches"] for r in group),
                "driver_cpu": driver,
                "steady_driver_cpu": steady_driver,
                "cpu": cpu,
                **sustained_cells(group),
            }
        )
    return out


def sustained_cells(group: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of the sustained part: rows/s, and CPU per 100k records of the driver side
    (app + reader) and of the executors' Python."""
    runs = [r for r in group if r.get("sustained_rows")]
    if not runs:
        return {}

    def per_100k(r: dict[str, Any], *roles: str) -> float:
        return sum(r["sustained_cpu"].get(k, 0.0) for k in roles) * 100_000 / r["sustained_rows"]

    return {
        "sustained": statistics.median(r["sustained"] for r in runs),
        "sustained_driver_cpu": statistics.median(per_100k(r, "app", "reader") for r in runs),
        "sustained_executors_cpu": statistics.median(per_100k(r, "executors") for r in runs),
    }


def sustained_table(r: dict[str, Any]) -> str:
    """The pipeline once running (after each path's first batch): rows/s and CPU per 100k."""
    lines = [
        "Once running (from the end of each path's first batch to the end of its last): rows/s "
        "and CPU seconds per 100k records, driver side (application + the source's reader) and "
        "executors' Python (the source's reads).",
        "",
        "| path | sink | master | rows/s | x foreach_batch | driver CPU | executors' CPU |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    base = {
        c["master"]: c.get("sustained", 0.0)
        for c in r["cells"]
        if c["contender"].startswith("foreach_batch/")
    }
    for c in r["cells"]:
        if "sustained" not in c:
            continue
        face, sink = c["contender"].split("/")
        ratio = c["sustained"] / base[c["master"]] if base.get(c["master"]) else None
        lines.append(
            f"| {face} | {sink} | {c['master']} | {c['sustained']:.0f} | "
            + (f"{ratio:.2f}x" if ratio else "-")
            + f" | {c['sustained_driver_cpu']:.2f} s | {c['sustained_executors_cpu']:.2f} s |"
        )
    return "\n".join(lines)


def table(r: dict[str, Any]) -> str:
    """The results as a Markdown table, for docs/measured.md and ``benchmarks/results``.
    Results measured before the Python workers' CPU was split (no ``executors`` figure) keep
    their one ``executors' Python`` column: every worker but the reader."""
    split = any("executors" in c["cpu"] for c in r["cells"])
    lines = [
        f"{r['records']} records x 100 B on {r['shards']} shards, kinesalite + dynalite, "
        f"batches of at most {r['batch']} records, median of {r['rounds']} (pyspark "
        f"{r['pyspark']}, pyarrow {r['pyarrow']}). CPU: seconds per 100k records. Driver: the "
        "driver-side Python processes (the application, plus the source's reader worker), "
        "over the whole run and from the first batch to the last (steady); "
        + (
            "beside it, whole run: the executors' Python (PySpark's task worker daemon and the "
            "workers it forks, which read the shards), Spark's other Python workers (looking "
            "the source up, creating it, pickling its read function: a fixed cost per query), "
            "and the JVM."
            if split
            else "beside it the executors' Python workers and the JVM, whole run."
        ),
        "",
        "| path | sink | master | batches | rows/s whole | rows/s steady | driver CPU | "
        "(app + reader) | driver CPU steady | executors' Python | "
        + ("other Python workers | JVM |" if split else "JVM |"),
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|" + ("---:|" if split else ""),
    ]
    for c in r["cells"]:
        face, sink = c["contender"].split("/")
        cpu = c["cpu"]
        parts = f"{cpu.get('app', 0.0):.2f} + {cpu.get('reader', 0.0):.2f}"
        workers = (
            f"{cpu.get('executors', 0.0):.2f} s | {cpu.get('planning', 0.0):.2f} s"
            if split
            else f"{cpu.get('workers', 0.0):.2f} s"
        )
        lines.append(
            f"| {face} | {sink} | {c['master']} | {c['batches']:.0f} | {c['rate']:.0f} | "
            f"{c['steady']:.0f} | {c['driver_cpu']:.2f} s | {parts} | "
            f"{c['steady_driver_cpu']:.2f} s | {workers} | {cpu.get('jvm', 0.0):.2f} s |"
        )
    if any("sustained" in c for c in r["cells"]):
        lines += ["", sustained_table(r)]
    if r.get("latency"):  # bench_spark_latency.py, as benchmarks/run.py measured it
        import bench_spark_latency

        lines += ["", bench_spark_latency.table(r["latency"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=40_000)
    parser.add_argument("--masters", default="local[1],local[2]")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", help="also write the results to this file")
    # The child process's arguments (one Spark master).
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--kinesis", help=argparse.SUPPRESS)
    parser.add_argument("--dynamodb", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        results = suite(
            kinesalite.url,
            dynalite.url,
            records=args.records,
            rounds=args.rounds,
            batch=args.batch,
            masters=tuple(args.masters.split(",")),
            contenders=tuple(args.contenders.split(",")),
        )
    finally:
        kinesalite.stop()
        dynalite.stop()
    print()
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
