"""Idle latency: put-to-delivery delay at low and moderate rates, by ``idle_poll_interval``.

    .venv/bin/python benchmarks/bench_idle.py [--quick]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid): a 4-shard stream,
a member with the library's defaults (``initial_position="LATEST"``) but ``idle_poll_interval``
1.0 (the default) or 0.2, iterating ``consume()``. Once it has read every shard for a while, a
producer thread puts records (random partition keys) at 2 or 100 records/s, each carrying the
time it was put; the delay is the time the iterator handed it out minus that (one process, one
clock). p50/p99 over the records of the measuring window. The cost is not measured here: an idle
shard is read about 1/idle_poll_interval times a second (5 reads/s per shard are shared by every
consumer of the stream).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_core import REGION, bench_config  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Kinesumer, create_state_table  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

RATES = (2, 100)
INTERVALS = (1.0, 0.2)
#: Reading every shard before the producer starts (LATEST: earlier records are not read).
WARM_UP = 4.0


def produce(url: str, stream: str, rate: float, seconds: float, stop: threading.Event) -> int:
    """Put ``rate`` records/s for ``seconds``, one PutRecord each, data = the put time."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    count, start = 0, time.time()
    while not stop.is_set() and time.time() - start < seconds:
        client.put_record(
            StreamName=stream, Data=struct.pack("!d", time.time()), PartitionKey=uuid.uuid4().hex
        )
        count += 1
        pause = start + count / rate - time.time()
        if pause > 0:
            time.sleep(pause)
    return count


def measure(
    kurl: str, durl: str, app: str, stream: str, rate: int, idle: float, seconds: float
) -> dict[str, float]:
    config = bench_config(kurl, durl, app, initial_position="LATEST", idle_poll_interval=idle)
    delays: list[float] = []
    stop = threading.Event()
    produced: list[int] = []
    with Kinesumer(config) as consumer:

        def producer() -> None:
            time.sleep(WARM_UP)
            produced.append(produce(kurl, stream, rate, seconds, stop))
            time.sleep(2 * idle + 0.5)  # the last records' reads
            consumer.close()

        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        for record in consumer.consume([stream]):
            delays.append(time.time() - struct.unpack("!d", record.data)[0])
        thread.join()
    delays.sort()
    return {
        "records": len(delays),
        "produced": produced[0] if produced else 0,
        "p50_ms": statistics.median(delays) * 1000 if delays else float("nan"),
        "p99_ms": delays[min(len(delays) - 1, int(0.99 * len(delays)))] * 1000
        if delays
        else float("nan"),
    }


def run(kurl: str, durl: str, quick: bool) -> dict[str, Any]:
    seconds = 10.0 if quick else 30.0
    apps = iter(range(1_000))
    rows: list[dict[str, Any]] = []
    for rate in RATES:
        for idle in INTERVALS:
            stream = f"bench-idle-{rate}-{int(idle * 10)}-{os.getpid()}"
            client = boto3.client("kinesis", endpoint_url=kurl, region_name=REGION)
            client.create_stream(StreamName=stream, ShardCount=4)
            client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
            got = measure(kurl, durl, f"bi-{os.getpid()}-{next(apps)}", stream, rate, idle, seconds)
            rows.append({"rate": rate, "idle_poll_interval": idle, **got})
            print(
                f"  {rate} records/s, idle_poll_interval {idle}: p50 {got['p50_ms']:.0f} ms, "
                f"p99 {got['p99_ms']:.0f} ms ({got['records']}/{got['produced']} records)",
                flush=True,
            )
    return {"seconds": seconds, "rows": rows}


def report(result: dict[str, Any]) -> str:
    lines = [
        "| records/s | idle_poll_interval | p50 | p99 | records |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['rate']} | {row['idle_poll_interval']} s | {row['p50_ms']:.0f} ms | "
            f"{row['p99_ms']:.0f} ms | {row['records']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(None, dynalite.url, "bench"))
        result = run(kinesalite.url, dynalite.url, args.quick)
    finally:
        kinesalite.stop()
        dynalite.stop()
    print(report(result))


if __name__ == "__main__":
    main()
