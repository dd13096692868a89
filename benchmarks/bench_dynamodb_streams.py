"""Reading a DynamoDB table's stream: kinesumer against a plain boto3 ``dynamodbstreams`` loop.

    .venv/bin/python benchmarks/bench_dynamodb_streams.py [--quick]

On moto in server mode (started here in a thread on a free loopback port; the only stand-in that
serves DynamoDB Streams): a table with a ``NEW_AND_OLD_IMAGES`` stream gets N item writes
(puts of ~100 B items), then each reader reads the N changes from TRIM_HORIZON:

- boto3: DescribeStream, GetShardIterator, GetRecords (Limit 1,000) in a loop, one thread;
- kinesumer: a member consuming the stream ARN with ``Kinesumer.consume()`` (join, claim and
  checkpoints included), each record handed to the loop.

Prints records/s of both and the ratio. moto's one shard and its own speed bound both: a
comparison of overheads, not a figure for AWS.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

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
    for n in range(count):
        client.put_item(
            TableName=table, Item={"pk": {"S": f"k{n}"}, "v": {"S": "x" * 80}, "n": {"N": str(n)}}
        )


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


def kinesumer_read(url: str, arn: str, count: int) -> float:
    config = bench_config(url, url, "bench-ddb")
    create_state_table(config)
    started = time.perf_counter()
    seen = 0
    with Kinesumer(config) as consumer:
        for _record in consumer.consume([arn]):
            seen += 1
            if seen == count:
                break
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    count = 2_000 if parser.parse_args().quick else 10_000
    moto = start_moto()
    try:
        arn = create_streamed_table(moto.url, "bench-items")
        fill(moto.url, "bench-items", count)
        plain = boto3_loop(moto.url, arn, count)
        ours = kinesumer_read(moto.url, arn, count)
    finally:
        moto.stop()
    print(f"DynamoDB Streams on moto, {count} changes of one shard:")
    print(f"  boto3 dynamodbstreams GetRecords loop: {plain:10,.0f} records/s")
    print(f"  kinesumer consume(stream ARN):         {ours:10,.0f} records/s")
    print(f"  ratio kinesumer / boto3:               {ours / plain:10.2f}")


if __name__ == "__main__":
    main()
