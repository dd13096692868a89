"""Reading cost: the lean GetRecords path vs botocore's parser vs plain aioboto3 loops, side by
side on one pre-filled stream (CPU seconds per 100k records and records/s).

    .venv/bin/python benchmarks/bench_read.py [--records 60000] [--rounds 3] [--size 100]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid), a 4-shard stream
of ``--records`` records of ``--size`` bytes, read from TRIM_HORIZON by:

- ``plain``: the plain aioboto3 loop of ``bench_core`` (one task per shard, GetRecords with
  Limit=10000 at most every 0.2 s per shard, botocore's parser);
- ``plain+``: the same loop with kinesumer's timestamp parser, the leanest plain boto3 loop
  (the baseline of the ratios);
- ``reader/botocore`` and ``reader/lean``: the same loop through :class:`KinesisReader` (records
  as the engine gets them: ``Record`` tuples, aggregates unpacked), parsed by botocore, and by
  the lean path (:mod:`kinesumer.kinesis.lean`);
- ``kinesumer/botocore`` and ``kinesumer/lean``: one AsyncKinesumer member (defaults,
  TRIM_HORIZON) consuming every record, with ``KINESUMER_BOTOCORE_GET_RECORDS=1`` (before) and
  without (after);
- ``poll/lean``: ``Kinesumer.poll(1000)`` until every record came (the Spark table's reference).

Rounds alternate the order. CPU is this process's (all threads) from the first record to the
last; kinesalite's own CPU is another process's and not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aioboto3

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from bench_core import (  # noqa: E402
    REGION,
    Clock,
    bench_config,
    fill,
    library_async,
    measure,
    plain_loop,
)
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Kinesumer, create_state_table  # noqa: E402
from kinesumer.aws import RequestStats, botocore_session  # noqa: E402
from kinesumer.kinesis.reader import BOTOCORE_GET_RECORDS_ENV, KinesisReader  # noqa: E402

CONTENDERS = (
    "plain",
    "plain+",
    "reader/botocore",
    "reader/lean",
    "kinesumer/botocore",
    "kinesumer/lean",
    "poll/lean",
)


async def reader_loop(url: str, stream: str, total: int, clock: Clock, lean: bool) -> int:
    """``plain_loop``'s pacing and tasks, through :class:`KinesisReader` (lean or botocore)."""
    session = aioboto3.Session(botocore_session=botocore_session())
    count = 0
    done = asyncio.Event()
    async with session.client("kinesis", endpoint_url=url, region_name=REGION) as kinesis:
        reader = KinesisReader(kinesis, RequestStats(), REGION, lean_get_records=lean)
        shards = await reader.list_shards(stream)

        async def read(shard_id: str) -> None:
            nonlocal count
            iterator: str | None = await reader.shard_iterator(
                stream, shard_id, None, "TRIM_HORIZON"
            )
            loop = asyncio.get_running_loop()
            while not done.is_set() and iterator is not None:
                started = loop.time()
                batch = await reader.get_records(stream, shard_id, iterator, 10_000, None)
                for record in batch.records:
                    clock.tick()
                    count += 1
                    _ = record.data
                if count >= total:
                    done.set()
                iterator = batch.next_iterator
                await asyncio.sleep(max(0.0, started + 0.2 - loop.time()))

        tasks = [asyncio.create_task(read(s.shard_id)) for s in shards]
        await done.wait()
        clock.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return count


def poll_loop(config: Any, stream: str, total: int, clock: Clock) -> int:
    count = 0
    with Kinesumer(config) as consumer:
        consumer.subscribe([stream])
        while count < total:
            records = consumer.poll(1000, timeout=1.0)
            if records:
                clock.tick()
                count += len(records)
        clock.stop()
    return count


def _with_botocore_parser(fn: Callable[[], int]) -> int:
    os.environ[BOTOCORE_GET_RECORDS_ENV] = "1"
    try:
        return fn()
    finally:
        os.environ.pop(BOTOCORE_GET_RECORDS_ENV, None)


def run(kurl: str, durl: str, records: int, rounds: int, size: int = 100) -> list[dict[str, Any]]:
    """Rows per contender: medians of ``rounds`` and ratios to ``plain+``."""
    stream = f"read-{os.getpid()}-{size}"
    print(f"filling {stream}: {records} records of {size} B on 4 shards ...", flush=True)
    fill(kurl, stream, 4, records, size)
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in CONTENDERS}
    for n in range(rounds):

        def config(kind: str, n: int = n) -> Any:
            return bench_config(kurl, durl, f"read-{kind}-{os.getpid()}-{n}")

        contenders: dict[str, Callable[[Clock], int]] = {
            "plain": lambda c: asyncio.run(plain_loop(kurl, stream, records, c)),
            "plain+": lambda c: asyncio.run(plain_loop(kurl, stream, records, c, fast=True)),
            "reader/botocore": lambda c: asyncio.run(reader_loop(kurl, stream, records, c, False)),
            "reader/lean": lambda c: asyncio.run(reader_loop(kurl, stream, records, c, True)),
            "kinesumer/botocore": lambda c: _with_botocore_parser(
                lambda: asyncio.run(library_async(config("b"), stream, records, c))
            ),
            "kinesumer/lean": lambda c: asyncio.run(library_async(config("l"), stream, records, c)),
            "poll/lean": lambda c: poll_loop(config("p"), stream, records, c),
        }
        order = list(contenders) if n % 2 == 0 else list(reversed(contenders))
        for name in order:
            wall, cpu, first = measure(contenders[name])
            runs[name].append((wall, cpu, first))
            print(
                f"  round {n + 1} {name:18s}: {records / wall:9.0f} rec/s  "
                f"cpu {cpu * 100_000 / records:.2f} s/100k",
                flush=True,
            )
    base_rate = statistics.median(records / w for w, _, _ in runs["plain+"])
    base_cpu = statistics.median(c for _, c, _ in runs["plain+"]) * 100_000 / records
    table = []
    for name in CONTENDERS:
        rate = statistics.median(records / w for w, _, _ in runs[name])
        cpu = statistics.median(c for _, c, _ in runs[name]) * 100_000 / records
        table.append(
            {
                "contender": name,
                "records_per_s": rate,
                "ratio": rate / base_rate,
                "cpu_s_per_100k": cpu,
                "cpu_ratio": cpu / base_cpu,
            }
        )
    return table


def report(table: list[dict[str, Any]], records: int, rounds: int, size: int = 100) -> str:
    lines = [
        f"Reading, {records} records x {size} B, 4 shards, kinesalite, median of {rounds} "
        f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores); ratios to plain+",
        "",
        "| contender | records/s | vs plain+ | CPU s/100k | CPU vs plain+ |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in table:
        lines.append(
            f"| {row['contender']} | {row['records_per_s']:.0f} | {row['ratio']:.2f}x | "
            f"{row['cpu_s_per_100k']:.2f} | {row['cpu_ratio']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(None, dynalite.url, "bench"))
        table = run(kinesalite.url, dynalite.url, args.records, args.rounds, args.size)
    finally:
        kinesalite.stop()
        dynalite.stop()
    print()
    print(report(table, args.records, args.rounds, args.size))


if __name__ == "__main__":
    main()
