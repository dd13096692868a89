"""What a refused ListShards costs the Producer after a split: a 1-shard stream on kinesalite, 300
records over 30 keys, a split the Producer has not listed, then ListShards refused ``--refused``
times in a row (the fault proxy's throttle; one listing makes 6 attempts) while rounds of 100
records are put and flushed. Reports the seconds the rounds took, ListShards calls until the map
was listed again and when, and the keys whose records landed on both children (a reader reads
siblings side by side, so such a key can be read out of put order).

Runnable alone (PYTHONPATH picks the kinesumer measured)::

    .venv/bin/python benchmarks/bench_producer_relist.py [--refused 30] [--rounds 6] [--plain]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

import boto3  # noqa: E402
from support.faultproxy import Fault, FaultProxy, OpKey  # noqa: E402
from support.produced import read_all  # noqa: E402
from support.standins import start_kinesalite  # noqa: E402

from kinesumer import Producer  # noqa: E402

KEYS = 30
ROUND = 100
LIST_SHARDS = OpKey("kinesis", "ListShards")


def put_round(producer: Producer, stream: str, start: int) -> int:
    for i in range(start, start + ROUND):
        producer.put(stream, b"%d" % i, partition_key=f"key-{i % KEYS}")
    producer.flush()
    return start + ROUND


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refused", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--plain", action="store_true", help="aggregate=False")
    args = parser.parse_args()
    with start_kinesalite() as kinesalite, FaultProxy(kinesalite.url) as proxy:
        client = boto3.client("kinesis", endpoint_url=kinesalite.url, region_name="us-east-1")
        stream = "relist"
        client.create_stream(StreamName=stream, ShardCount=1)
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})

        def list_shards() -> tuple[int, int]:
            stats = proxy.stats().get(LIST_SHARDS)
            return (0, 0) if stats is None else (stats.requests, stats.forwarded)

        with Producer(
            kinesis_endpoint=proxy.url, region="us-east-1", aggregate=not args.plain
        ) as producer:
            number = 0
            for _ in range(3):
                number = put_round(producer, stream, number)
            parent = client.list_shards(StreamName=stream)["Shards"][0]
            low, high = (
                int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey")
            )
            client.split_shard(
                StreamName=stream,
                ShardToSplit=parent["ShardId"],
                NewStartingHashKey=str((low + high) // 2),
            )
            client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
            proxy.add_rule(
                Fault.throttle(), service="kinesis", operation="ListShards", count=args.refused
            )
            started = time.monotonic()
            round_seconds = []
            for _ in range(args.rounds):
                began = time.monotonic()
                number = put_round(producer, stream, number)
                round_seconds.append(time.monotonic() - began)
            rounds_took = time.monotonic() - started
            calls_during_rounds = list_shards()[0] - 1
            # Keep putting (a round each 0.1 s) until the map was listed again.
            while list_shards()[1] < 2 and time.monotonic() - started < 300:
                number = put_round(producer, stream, number)
                time.sleep(0.1)
            listed_after = time.monotonic() - started
            calls_until_listed = list_shards()[0] - 1
        records = read_all(kinesalite.url, stream)
        children: dict[str, set[str]] = {}
        for record in records:
            if record.shard_id != parent["ShardId"]:
                children.setdefault(record.partition_key, set()).add(record.shard_id)
        split = sum(1 for shards in children.values() if len(shards) > 1)
        print(
            f"aggregate={not args.plain} refused={args.refused}: {args.rounds} rounds of {ROUND} "
            f"took {rounds_took:.2f}s (slowest {max(round_seconds):.2f}s), "
            f"{calls_during_rounds} ListShards calls meanwhile; listed again after "
            f"{listed_after:.1f}s and {calls_until_listed} calls; "
            f"records {len(records)}/{number}, keys on both children {split}/{len(children)}"
        )


if __name__ == "__main__":
    main()
