"""Kinesis to Parquet with local Spark and ``kinesumer.spark.foreach_batch``, no AWS account.

    pip install 'kinesumer[spark]' 'moto[server]'
    python examples/spark_foreach_batch.py [OUT_DIR] [--records 2000] [--shards 2]

The driver-only path (this process reads every record); ``examples/spark_parquet.py`` does the
same with the Structured Streaming source, whose executors read the shards.

It starts moto on 127.0.0.1 (a free port), creates a stream and the state table, produces JSON
order events, then drains the stream with ``foreach_batch(..., available_now=True)``: each
micro-batch becomes one DataFrame, parsed and appended to Parquet under OUT_DIR (default: a new
temporary directory), and only then checkpointed. A second run finds nothing new. Finally it reads
the Parquet back and prints what was written.

The sink is idempotent the usual way: every row carries (stream, shard_id, sequence_number,
sub_sequence_number), so a batch delivered twice (a crash between the write and the checkpoint)
is removed by a dropDuplicates on those columns when reading, or by a MERGE in a table format.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from kinesumer import Config, create_state_table
from kinesumer.spark import BatchInfo, foreach_batch

STREAM = "orders"
KEY_COLUMNS = ["stream", "shard_id", "sequence_number", "sub_sequence_number"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="output directory (default: a temporary one)")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="kinesumer-parquet-")).resolve() / "orders"

    for name, value in {
        "AWS_ACCESS_KEY_ID": "demo",
        "AWS_SECRET_ACCESS_KEY": "demo",
        "PYSPARK_PYTHON": sys.executable,  # workers must run this interpreter
        "SPARK_LOCAL_IP": "127.0.0.1",
    }.items():
        os.environ.setdefault(name, value)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    print(f"moto server on {url}")
    spark = None
    try:
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("kinesumer-parquet")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        run(spark, url, out, args.records, args.shards)
    finally:
        if spark is not None:
            spark.stop()
        server.stop()


def produce(url: str, total: int, shards: int) -> None:
    kinesis = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    kinesis.create_stream(StreamName=STREAM, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 0.1})
    for start in range(0, total, 500):
        batch = [
            {
                "Data": json.dumps({"order": i, "customer": f"c{i % 37}", "amount": i % 100}),
                "PartitionKey": f"c{i % 37}",
            }
            for i in range(start, min(start + 500, total))
        ]
        kinesis.put_records(StreamName=STREAM, Records=batch)
    print(f"produced {total} orders on {shards} shards")


def run(spark: Any, url: str, out: Path, total: int, shards: int) -> None:
    from pyspark.sql import functions as F

    produce(url, total, shards)
    config = Config(
        app="orders-to-parquet",
        dynamodb_table="kinesumer-state",
        region="us-east-1",
        kinesis_endpoint=url,
        dynamodb_endpoint=url,
        initial_position="TRIM_HORIZON",
        heartbeat_interval=0.5,  # a quicker end of available_now (it waits two ticks)
        client_timeout=2.0,
    )
    create_state_table(config)
    payload = "order INT, customer STRING, amount INT"

    def write(df: Any, batch_id: int, info: BatchInfo) -> None:
        parsed = (
            df.select(
                *KEY_COLUMNS,
                "approximate_arrival_timestamp",
                F.from_json(F.col("data").cast("string"), payload).alias("o"),
            )
            .select("*", "o.*")
            .drop("o")
        )
        parsed.write.mode("append").parquet(str(out))
        shards_line = ", ".join(f"{r.shard_id}: {r.count}" for r in info.ranges)
        print(f"  batch {batch_id}: {info.records} records ({shards_line}) -> {out}")

    summary = foreach_batch(spark, config, [STREAM], write, max_records=500, available_now=True)
    print(
        f"run 1: {summary.batches} batches, {summary.records} records, {summary.stopped_by} "
        f"in {summary.seconds:.1f}s"
    )
    for (stream, shard_id), (sequence, _) in sorted(summary.last_sequence_numbers.items()):
        print(f"  checkpoint {stream}/{shard_id} at {sequence}")
    again = foreach_batch(spark, config, [STREAM], write, available_now=True)
    print(f"run 2: {again.records} new records (everything was checkpointed)")

    written = spark.read.parquet(str(out))
    rows = written.count()
    unique = written.dropDuplicates(KEY_COLUMNS).count()
    files = sorted(p.name for p in out.glob("*.parquet"))
    print(f"\nwrote {rows} rows ({unique} unique) in {len(files)} Parquet files under {out}")
    written.groupBy("shard_id").agg(
        F.count("*").alias("rows"), F.sum("amount").alias("amount")
    ).orderBy("shard_id").show(truncate=False)
    written.orderBy("order").show(5, truncate=False)


if __name__ == "__main__":
    main()
