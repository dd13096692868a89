"""A two-member consumer group on a local moto server, no AWS account needed.

    ./scripts/demo                      # installs, then runs this
    python examples/quickstart.py --records 2000 --shards 4

It starts moto on 127.0.0.1 (a free port), creates a stream and the state table, produces
numbered records while two members consume them in two threads, then stops one member
gracefully halfway (its shards move to the other with no duplicate) and prints a summary.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections import Counter

import boto3
from moto.server import ThreadedMotoServer

from kinesumer import Config, Kinesumer, create_state_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "demo")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "demo")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    # moto answers 500 to the rare request that races another in its threads; we retry those.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    print(f"moto server on {url}")
    try:
        run(url, args.records, args.shards)
    finally:
        server.stop()


def run(url: str, total: int, shards: int) -> None:
    kinesis = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    kinesis.create_stream(StreamName="orders", ShardCount=shards)
    config = Config(
        app="quickstart",
        dynamodb_table="kinesumer-state",
        region="us-east-1",
        kinesis_endpoint=url,
        dynamodb_endpoint=url,
        initial_position="TRIM_HORIZON",
    )
    create_state_table(config)

    consumed: Counter[bytes] = Counter()
    by_member: Counter[str] = Counter()
    lock = threading.Lock()
    members = {name: Kinesumer(config.replace(client_id=name)) for name in ("alpha", "beta")}

    def consume(name: str) -> None:
        for record in members[name].consume(["orders"]):
            with lock:
                consumed[record.data] += 1
                by_member[name] += 1

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in members]
    for thread in threads:
        thread.start()

    for start in range(0, total, 100):
        batch = [
            {"Data": str(i).encode(), "PartitionKey": f"customer-{i % 50}"}
            for i in range(start, min(start + 100, total))
        ]
        kinesis.put_records(StreamName="orders", Records=batch)
        if start == total // 2:
            print("stopping alpha gracefully: its shards move to beta")
            members["alpha"].close()
        time.sleep(0.15)

    deadline = time.monotonic() + 60
    while len(consumed) < total and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = members["beta"].stats()
    for member in members.values():
        member.close()
    lost = total - len(consumed)
    duplicates = sum(n - 1 for n in consumed.values() if n > 1)
    print(f"members: {dict(by_member)}; beta now owns {len(stats.shards)} shard(s)")
    print(f"produced {total}, consumed {len(consumed)}, lost {lost}, duplicates {duplicates}")
    if lost:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
