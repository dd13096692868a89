"""Reading a DynamoDB table's stream: kinesumer against a plain boto3 ``dynamodbstreams`` loop.

    .venv/bin/python benchmarks/bench_dynamodb_streams.py [--quick]

Also run by ``./scripts/bench`` (``benchmarks/run.py``). On moto in server mode (started here in
a thread on a free loopback port; the only stand-in that serves DynamoDB Streams): a table with a
``NEW_AND_OLD_IMAGES`` stream gets N item writes (puts of ~100 B items, 25 a BatchWriteItem),
then each reader reads the N changes from TRIM_HORIZON:

- boto3: DescribeStream, GetShardIterator, GetRecords (Limit 1,000) in a loop, one thread;
- kinesumer: a member consuming the stream ARN with ``Kinesumer.consume()``, each record handed
  to the loop; its rate is measured from its first record to its last (the join, a few seconds
  of heartbeats and a claim, is reported apart, and with it included).

Prints records/s of both and the ratio. moto's one shard and its own speed bound both: a
comparison of overheads, not a figure for AWS. N is 10,000 (``--quick``: 4,000): moto's
DynamoDB slows as a table grows (STANDINS.md: keep moto under about 20k records).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_core import REGION, bench_config  # noqa: E402
from support.standins import start_moto  # noqa: E402
from support.table_streams import create_streamed_table  # noqa: E402

from kinesumer import Kinesumer, create_state_table  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")


def fill(url: str, table: str, count: int) -> None:
    client = boto3.client("dynamodb", endpoint_url=url, region_name=REGION)
    for start in range(0, count, 25):
        puts = [
            {
                "PutRequest": {
                    "Item": {"pk": {"S": f"k{n}"}, "v": {"S": "x" * 80}, "n": {"N": str(n)}}
                }
            }
            for n in range(start, min(start + 25, count))
        ]
        left: dict[str, Any] = {table: puts}
        while left:
            left = client.batch_write_item(RequestItems=left).get("UnprocessedItems") or {}


def boto3_loop(url: str, arn: str, count: int) -> float:
    client = boto3.client("dynamodbstreams", endpoint_url=url, region_name=REGION)
    started = time.perf_counter()
    shard = client.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(
        StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    seen = 0
    while seen < count:
        answer = client.get_records(ShardIterator=iterator, Limit=1000)
        seen += len(answer["Records"])
        iterator = answer["NextShardIterator"]
    return count / (time.perf_counter() - started)


def kinesumer_read(url: str, arn: str, count: int) -> dict[str, float]:
    """records/s from the first record to the last; the join (seconds to the first record);
    records/s with the join."""
    config = bench_config(url, url, "bench-ddb")
    create_state_table(config)
    started = time.perf_counter()
    first = 0.0
    seen = 0
    with Kinesumer(config) as consumer:
        for _record in consumer.consume([arn]):
            seen += 1
            if seen == 1:
                first = time.perf_counter()
            if seen == count:
                break
        ended = time.perf_counter()
    return {
        "records_per_s": (count - 1) / (ended - first),
        "join_s": first - started,
        "with_join_records_per_s": count / (ended - started),
    }


def run(quick: bool) -> dict[str, Any]:
    """Both readers on a moto server of their own."""
    count = 4_000 if quick else 10_000
    moto = start_moto()
    try:
        arn = create_streamed_table(moto.url, "bench-items")
        fill(moto.url, "bench-items", count)
        plain = boto3_loop(moto.url, arn, count)
        ours = kinesumer_read(moto.url, arn, count)
    finally:
        moto.stop()
    return {"records": count, "boto3_records_per_s": plain, "kinesumer": ours}


def report(result: dict[str, Any]) -> str:
    ours, plain = result["kinesumer"], result["boto3_records_per_s"]
    return "\n".join(
        [
            f"DynamoDB Streams on moto, {result['records']:,} changes of one shard:",
            f"  boto3 dynamodbstreams GetRecords loop:   {plain:10,.0f} records/s",
            f"  kinesumer consume(stream ARN):           {ours['records_per_s']:10,.0f} records/s"
            f" (first record to last)",
            f"  ratio kinesumer / boto3:                 {ours['records_per_s'] / plain:10.2f}",
            f"  kinesumer join (to the first record):    {ours['join_s']:10.1f} s",
            f"  kinesumer with the join:                 "
            f"{ours['with_join_records_per_s']:10,.0f} records/s",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(report(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
