"""The Spark sink beside a ``foreachBatch`` that writes with boto3, on one Spark session.

    .venv/bin/python benchmarks/bench_spark_sink.py [--records 20000] [--rounds 1]
                                                    [--master local[2]]

On kinesalite (started here on a free loopback port, stopped by pid): ``--records`` rows of
100 B over 100 keys, staged as Parquet, are streamed (``trigger(availableNow=True)``) into a
fresh 4-shard stream by

- ``foreachBatch + boto3``: ``foreachBatch`` whose function runs ``df.foreachPartition`` with
  the plain loop of ``bench_producer`` (500-record ``put_records`` calls, refused entries sent
  again): what users write today;
- ``writeStream.format("kinesumer")``: the sink, defaults (``ordering="key"``), and
- the sink with ``aggregate=true``.

Each run's rows are read back and counted (nothing lost). Figures: rows/s over the query (start
to end), and CPU seconds per 100k rows of the driver process (``app``), the Spark Python workers
(executors: where the rows are put) and the JVM, read from ``/proc``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

import boto3  # noqa: E402
from bench_spark import CpuMeter, start_spark  # noqa: E402
from support.produced import read_all  # noqa: E402
from support.standins import start_kinesalite  # noqa: E402

KEYS = 100
CONTENDERS = ("foreachBatch + boto3", "sink", "sink aggregate=true")


def stage(spark: Any, records: int) -> str:
    """``records`` rows (data, partition_key) as Parquet in a temporary folder."""
    folder = tempfile.mkdtemp(prefix="bench-sink-in-")
    (
        spark.range(records)
        .selectExpr(
            "cast(concat(cast(id as string), ':', repeat('x', 90)) as binary) as data",
            f"concat('k', cast(id % {KEYS} as string)) as partition_key",
        )
        .repartition(2)
        .write.mode("overwrite")
        .parquet(folder)
    )
    return folder


def boto3_partition(url: str, stream: str) -> Any:
    def put(rows: Any) -> None:
        client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append({"Data": bytes(row["data"]), "PartitionKey": row["partition_key"]})
            if len(batch) == 500:
                _send(client, stream, batch)
                batch = []
        if batch:
            _send(client, stream, batch)

    return put


def _send(client: Any, stream: str, entries: list[dict[str, Any]]) -> None:
    while entries:
        results = client.put_records(StreamName=stream, Records=entries)["Records"]
        entries = [e for e, r in zip(entries, results, strict=True) if "ErrorCode" in r]


def one(spark: Any, kurl: str, folder: str, records: int, contender: str) -> dict[str, Any]:
    client = boto3.client("kinesis", endpoint_url=kurl, region_name="us-east-1")
    stream = f"bench-sink-{os.getpid()}-{time.monotonic_ns()}"
    client.create_stream(StreamName=stream, ShardCount=4)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    frame = spark.readStream.schema("data binary, partition_key string").parquet(folder)
    checkpoint = tempfile.mkdtemp(prefix="bench-sink-ck-")
    writer = frame.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if contender == "foreachBatch + boto3":
        put = boto3_partition(kurl, stream)
        writer = writer.foreachBatch(lambda df, _batch_id: df.foreachPartition(put))
    else:
        writer = (
            writer.format("kinesumer")
            .option("stream", stream)
            .option("kinesis_endpoint", kurl)
            .option("region", "us-east-1")
        )
        if contender.endswith("aggregate=true"):
            writer = writer.option("aggregate", "true")
    with CpuMeter() as meter:
        started = time.monotonic()
        writer.start().awaitTermination()
        wall = time.monotonic() - started
    cpu = meter.result()
    landed = len(read_all(kurl, stream))
    assert landed >= records, f"{contender}: {landed} of {records} rows landed"
    per = 100_000 / records
    return {
        "contender": contender,
        "rows_per_s": records / wall,
        "app_cpu": cpu.get("app", 0.0) * per,
        "workers_cpu": cpu.get("workers", 0.0) * per,
        "jvm_cpu": cpu.get("jvm", 0.0) * per,
        "landed": landed,
    }


def run(kurl: str, records: int, rounds: int, master: str) -> list[dict[str, Any]]:
    from kinesumer.spark import KinesumerDataSource

    spark = start_spark(master)
    spark.dataSource.register(KinesumerDataSource)
    try:
        folder = stage(spark, records)
        one(spark, kurl, folder, min(records, 2000), "sink")  # warm-up: workers, imports
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
        for n in range(rounds):
            order = CONTENDERS if n % 2 == 0 else tuple(reversed(CONTENDERS))
            for name in order:
                result = one(spark, kurl, folder, records, name)
                runs[name].append(result)
                print(f"  {name}: {result}", flush=True)
    finally:
        spark.stop()
    table = []
    for name in CONTENDERS:
        rows = runs[name]
        table.append(
            {
                "contender": name,
                **{
                    key: statistics.median(r[key] for r in rows)
                    for key in ("rows_per_s", "app_cpu", "workers_cpu", "jvm_cpu")
                },
            }
        )
    return table


def report(table: list[dict[str, Any]], records: int, master: str) -> str:
    base = table[0]["rows_per_s"]
    lines = [
        f"Spark sink, {records:,} rows of 100 B over {KEYS} keys to 4 shards, kinesalite, "
        f"{master}, availableNow; CPU seconds per 100k rows",
        "",
        "| writer | rows/s | vs foreachBatch | driver CPU | workers CPU | JVM CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in table:
        lines.append(
            f"| {row['contender']} | {row['rows_per_s']:,.0f} | "
            f"{row['rows_per_s'] / base:.2f}x | {row['app_cpu']:.2f} | "
            f"{row['workers_cpu']:.2f} | {row['jvm_cpu']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    kinesalite = start_kinesalite()
    try:
        table = run(kinesalite.url, args.records, args.rounds, args.master)
    finally:
        kinesalite.stop()
    print()
    print(report(table, args.records, args.master))


if __name__ == "__main__":
    main()
