"""Kinesis to Parquet with Spark Structured Streaming and the kinesumer source, no AWS account.

    pip install 'kinesumer[spark]' 'moto[server]'
    python examples/spark_parquet.py [OUT_DIR] [--records 2000] [--shards 2]

It starts moto on 127.0.0.1 (a free port), creates a stream and the state table, and produces
JSON order events. Then ``spark.readStream.format("kinesumer")`` reads the stream (executors
call GetRecords; this process only plans micro-batches as a member of the consumer group), the
JSON is parsed and ``writeStream`` appends it to Parquet under OUT_DIR/orders (default OUT_DIR: a
new temporary directory) with ``trigger(availableNow=True)``: everything the stream holds, in
micro-batches of at most ``max_records_per_trigger`` records, then the query stops.

A second run with the same checkpoint folder (OUT_DIR/checkpoint) finds nothing new. Spark's
Parquet sink is exactly-once with its checkpoint: a batch replayed after a failure reads exactly
the same records (the source's ledger) and is written once. The group's DynamoDB checkpoints
follow Spark's (each batch is recorded there once Spark committed it), so ``kinesumer status``
shows where the query is. ``examples/
spark_foreach_batch.py`` does the same with the driver-only ``foreach_batch``.
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
from kinesumer.spark import KinesumerDataSource

STREAM = "orders"
KEY_COLUMNS = ["stream", "shard_id", "sequence_number", "sub_sequence_number"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="output directory (default: a temporary one)")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="kinesumer-parquet-")).resolve()

    for name, value in {
        "AWS_ACCESS_KEY_ID": "demo",  # read by the executors too: they talk to moto themselves
        "AWS_SECRET_ACCESS_KEY": "demo",
        "PYSPARK_PYTHON": sys.executable,  # workers must run this interpreter
        "SPARK_LOCAL_IP": "127.0.0.1",
    }.items():
        os.environ.setdefault(name, value)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)

    # moto's DynamoDB made atomic and idempotent as DynamoDB is (conditional writes, tokens).
    from kinesumer.aws.moto_dynamodb import serialize_dynamodb_requests

    serialize_dynamodb_requests()
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
        run(spark, url, base, args.records, args.shards)
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


def drain(spark: Any, url: str, out: Path, checkpoint: Path) -> list[dict[str, Any]]:
    """One availableNow run of the query; the progress of its batches that had rows."""
    from pyspark.sql import functions as F

    orders = (
        spark.readStream.format("kinesumer")
        .option("app", "orders-to-parquet")
        .option("dynamodb_table", "kinesumer-state")
        .option("streams", STREAM)
        .option("region", "us-east-1")
        .option("kinesis_endpoint", url)  # a real query leaves both endpoints out
        .option("dynamodb_endpoint", url)
        .option("initial_position", "TRIM_HORIZON")  # where a group with no checkpoint starts
        .option("max_records_per_trigger", 500)  # records per micro-batch, across the shards
        .option("heartbeat_interval", 0.5)  # a quicker end here (availableNow waits 2 ticks)
        .option("client_timeout", 2.0)
        .load()
    )
    parsed = (
        orders.select(
            *KEY_COLUMNS,
            "approximate_arrival_timestamp",
            F.from_json(
                F.col("data").cast("string"), "order INT, customer STRING, amount INT"
            ).alias("o"),
        )
        .select("*", "o.*")
        .drop("o")
    )
    query = (
        parsed.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [p for p in query.recentProgress if p["numInputRows"]]


def run(spark: Any, url: str, base: Path, total: int, shards: int) -> None:
    from pyspark.sql import functions as F

    produce(url, total, shards)
    create_state_table(
        Config(
            app="orders-to-parquet",
            dynamodb_table="kinesumer-state",
            region="us-east-1",
            dynamodb_endpoint=url,
        )
    )
    spark.dataSource.register(KinesumerDataSource)  # the format name "kinesumer"
    out, checkpoint = base / "orders", base / "checkpoint"

    batches = drain(spark, url, out, checkpoint)
    for p in batches:
        print(f"  batch {p['batchId']}: {p['numInputRows']} records -> {out}")
    records = sum(p["numInputRows"] for p in batches)
    print(f"run 1: {len(batches)} batches, {records} records")
    again = drain(spark, url, out, checkpoint)
    print(f"run 2: {sum(p['numInputRows'] for p in again)} new records (same checkpoint folder)")

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
