"""Latency of the Structured Streaming source under a steady producer: batch duration and
put -> ``foreachBatch`` delay.

    .venv/bin/python benchmarks/bench_spark_latency.py [--rate 200] [--shards 4] [--trigger 1]
                                                       [--seconds 40] [--warmup 10]
                                                       [--master local[2]]
                                                       [--kinesis URL --dynamodb URL] [--json F]

On kinesalite + dynalite (started here on loopback, stopped by pid), a producer thread puts
``--rate`` records/s (in puts every 0.1 s, random partition keys over ``--shards`` shards), each
record's data its put time in epoch ms. One query, ``spark.readStream.format("kinesumer")``
with ``trigger(processingTime="<trigger> seconds")`` and a ``foreachBatch`` that collects the
rows, runs for ``--seconds``; the first ``--warmup`` seconds (the JVM, the group join, the first
batch) are left out: batches that started and records put before then. Figures: the batch
duration (``durationMs.triggerExecution`` of each query progress with rows) and the delay
from a record's put to its batch's ``foreachBatch`` call, as p50 / p90 / max. Producer and
sink run in this one process, so both times come from one clock. ``./scripts/bench`` runs it
short (45 s, 20 s warmup; 35 s with ``--quick``) on the suite's stand-ins, in a child process.
kinesalite reports ``MillisBehindLatest`` 0 always (see STANDINS.md), so the executor's stop at
the tip is judged there by an answer shorter than ``scan_limit``.

Measured on local[2] (2 shared cores), defaults (200/s, 4 shards, 1 s trigger, 50 s, 20 s
warmup): before the stop at the tip, batch p50 21.5 s and put -> sink p50 13.6 s; after, batch
p50 0.76 s (p90 1.2 s), put -> sink p50 1.0 s (p90 2.0 s). After, at 2,000/s: batch p50
0.45 s, put -> sink p50 0.86 s; at 200/s with a 5 s trigger: batch p50 0.57 s, put -> sink
p50 2.5 s (half the trigger interval, as expected).
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import boto3  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Config, create_state_table  # noqa: E402
from kinesumer.spark import KinesumerDataSource  # noqa: E402
from kinesumer.spark.source import option_strings  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def produce(url: str, stream: str, rate: int, stop: threading.Event) -> None:
    """Put ``rate`` records/s, in ten puts a second, until ``stop``."""
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    per_put = max(1, rate // 10)
    tick = time.monotonic()
    while not stop.is_set():
        now_ms = str(int(time.time() * 1000)).encode()
        client.put_records(
            StreamName=stream,
            Records=[{"Data": now_ms, "PartitionKey": uuid.uuid4().hex} for _ in range(per_put)],
        )
        tick += 0.1
        stop.wait(max(0.0, tick - time.monotonic()))


def run(args: argparse.Namespace) -> None:
    """One measurement on stand-ins of its own, or on ``--kinesis`` / ``--dynamodb``; printed,
    and written to ``--json`` if given."""
    if args.kinesis and args.dynamodb:
        result = measure(args.kinesis, args.dynamodb, args)
    else:
        with start_kinesalite() as kinesalite, start_dynalite() as dynalite:
            result = measure(kinesalite.url, dynalite.url, args)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


def measure(kurl: str, durl: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the query for ``args.seconds`` under the producer; the figures past the warmup."""
    from pyspark.sql import SparkSession

    stream = f"lat-{uuid.uuid4().hex[:8]}"
    client = boto3.client("kinesis", endpoint_url=kurl, region_name="us-east-1")
    client.create_stream(StreamName=stream, ShardCount=args.shards)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    config = Config(
        app=f"lat-{uuid.uuid4().hex[:8]}",
        dynamodb_table=f"bench-lat-{uuid.uuid4().hex[:8]}",
        region="us-east-1",
        kinesis_endpoint=kurl,
        dynamodb_endpoint=durl,
    )
    create_state_table(config)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("kinesumer-latency")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KinesumerDataSource)
    delays: list[tuple[float, float]] = []  # (when put, delay s)
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select("data").collect()
        now = time.time()
        with lock:
            for row in rows:
                put_at = int(bytes(row[0])) / 1000
                delays.append((put_at, now - put_at))

    stop = threading.Event()
    producer = threading.Thread(target=produce, args=(kurl, stream, args.rate, stop), daemon=True)
    producer.start()
    began = time.time()
    try:
        with tempfile.TemporaryDirectory() as checkpoint:
            frame = (
                spark.readStream.format("kinesumer")
                .options(**option_strings(config, [stream]))
                .load()
            )
            query = (
                frame.writeStream.foreachBatch(sink)
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime=f"{args.trigger} seconds")
                .start()
            )
            time.sleep(args.seconds)
            progress = list(query.recentProgress)
            query.stop()
    finally:
        stop.set()
        producer.join()
        spark.stop()
    cut = began + args.warmup
    durations = [
        p["durationMs"]["triggerExecution"] / 1000
        for p in progress
        if p.get("numInputRows") and _epoch(p["timestamp"]) >= cut
    ]
    with lock:
        seen = [d for put_at, d in delays if put_at >= cut]
    return {
        "rate": args.rate,
        "shards": args.shards,
        "trigger": args.trigger,
        "master": args.master,
        "measured_seconds": args.seconds - args.warmup,
        "batches": len(durations),
        "records": len(seen),
        "batch_seconds": quantile_values(durations),
        "delay_seconds": quantile_values(seen),
    }


def quantile_values(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {"p50": statistics.median(ordered), "p90": p90, "max": ordered[-1]}


def table(r: dict[str, Any]) -> str:
    """The figures as Markdown (for ``benchmarks/run.py``'s report and the command line)."""

    def q(v: dict[str, float] | None) -> str:
        return "no data" if not v else f"{v['p50']:.2f} s / {v['p90']:.2f} s / {v['max']:.2f} s"

    return "\n".join(
        [
            f"Latency under a steady producer: {r['rate']} records/s on {r['shards']} shards, "
            f"trigger {r['trigger']} s, {r['master']}, {r['measured_seconds']:.0f} s measured "
            "(kinesalite + dynalite; p50 / p90 / max).",
            "",
            "| figure | count | p50 / p90 / max |",
            "|---|---:|---|",
            f"| batch duration | {r['batches']} batches | {q(r['batch_seconds'])} |",
            f"| put -> foreachBatch | {r['records']} records | {q(r['delay_seconds'])} |",
        ]
    )


def suite(kurl: str, durl: str, quick: bool) -> dict[str, Any]:
    """For ``benchmarks/run.py``: one short run in a child process (its own JVM) on the
    suite's stand-ins: 45 s (35 s quick) with 20 s of warmup (the JVM, the join, the first
    batch: over 10 s on two busy cores), otherwise the defaults."""
    seconds = "35" if quick else "45"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "latency.json"
        subprocess.run(
            [sys.executable, __file__, "--kinesis", kurl, "--dynamodb", durl,
             "--seconds", seconds, "--warmup", "20", "--json", str(out)],
            check=True,
        )  # fmt: skip
        result: dict[str, Any] = json.loads(out.read_text())
    return result


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--trigger", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--kinesis", help="a Kinesis endpoint to use (else kinesalite is started)")
    parser.add_argument("--dynamodb", help="a DynamoDB endpoint to use (with --kinesis)")
    parser.add_argument("--json", help="also write the figures to this file")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
