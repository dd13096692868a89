"""Few-key concurrency: ``run(ordering="key")`` with a 10 ms handler, by number of keys.

    .venv/bin/python benchmarks/bench_handlers_keys.py [--quick]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid): for each number
of partition keys (8, 48, 1,000) one pre-filled 4-shard stream of ~100 B records whose keys
cycle through that many values, read from TRIM_HORIZON by a fresh group for every cell. For each
concurrency (1, 8, 32, 64): records/s of ``run(handle, concurrency=c, ordering="key")`` with the
default ``max_in_flight``, where ``handle`` sleeps 10 ms (an I/O call), from the first record to
the last; and the speed-up over concurrency 1 on the same stream. The ideal is
``min(concurrency, keys)`` (a key's records run one after the other).
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
from bench_core import REGION, Clock, bench_config  # noqa: E402
from bench_handlers import run_handler  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import create_state_table  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

IO_SECONDS = 0.01
KEYS = (8, 48, 1_000)
CONCURRENCY = (1, 8, 32, 64)


def fill_keys(url: str, stream: str, records: int, keys: int) -> None:
    """A 4-shard stream of ``records`` records whose partition keys cycle over ``keys`` values."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    client.create_stream(StreamName=stream, ShardCount=4)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    payload = b"x" * 92
    for start in range(0, records, 500):
        batch = [
            {"Data": b"%08d" % i + payload, "PartitionKey": f"key-{i % keys}"}
            for i in range(start, min(start + 500, records))
        ]
        client.put_records(StreamName=stream, Records=batch)


def cell_records(keys: int, concurrency: int, seconds: float) -> int:
    """Enough records for about ``seconds`` at the ideal rate (at least 100)."""
    return max(100, int(min(keys, concurrency) / IO_SECONDS * seconds))


def sleep_io() -> None:
    time.sleep(IO_SECONDS)


def run(kurl: str, durl: str, quick: bool) -> dict[str, Any]:
    """The table: {keys: {concurrency: records/s}} and the speed-ups over concurrency 1."""
    seconds = 2.0 if quick else 5.0
    apps = iter(range(1_000_000))
    rates: dict[int, dict[int, float]] = {}
    for keys in KEYS:
        stream = f"bench-keys-{keys}-{os.getpid()}"
        most = max(cell_records(keys, c, seconds) for c in CONCURRENCY)
        fill_keys(kurl, stream, most, keys)
        rates[keys] = {}
        for concurrency in CONCURRENCY:
            total = cell_records(keys, concurrency, seconds)
            clock = Clock()
            config = bench_config(kurl, durl, f"bk-{os.getpid()}-{next(apps)}")
            run_handler(
                config, stream, total, clock, sleep_io, concurrency=concurrency, ordering="key"
            )
            assert clock.first is not None and clock.end is not None
            rate = (total - 1) / (clock.end[0] - clock.first[0])
            rates[keys][concurrency] = rate
            print(f"  keys {keys} concurrency {concurrency}: {rate:,.0f} records/s", flush=True)
    return {
        "io_seconds": IO_SECONDS,
        "records_per_s": rates,
        "speedup": {k: {c: r / row[1] for c, r in row.items()} for k, row in rates.items()},
    }


def report(result: dict[str, Any]) -> str:
    heads = " | ".join(f"concurrency {c}" for c in CONCURRENCY)
    lines = [f"| keys | {heads} |", "|---" * (len(CONCURRENCY) + 1) + "|"]
    for keys, row in result["records_per_s"].items():
        speed = result["speedup"][keys]
        cells = " | ".join(f"{row[c]:,.0f}/s ({speed[c]:.1f}x)" for c in CONCURRENCY)
        lines.append(f"| {keys} | {cells} |")
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
