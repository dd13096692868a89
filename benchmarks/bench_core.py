"""Throughput and join time of the consumer group, side by side with a plain aioboto3 loop.

    .venv/bin/python benchmarks/bench_core.py [--records 100000] [--rounds 3]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid):
1. A pre-filled 4-shard stream (``--records`` records of ~100 B) read by
   - a plain aioboto3 loop, one task per shard, GetRecords(Limit=10000) at most every 0.2 s per
     shard (the service's 5 reads/s, which any honest loop must respect), counting records;
   - one AsyncKinesumer member (defaults, initial_position=TRIM_HORIZON), counting records;
   - one Kinesumer member (the sync generator over the same engine).
   Rounds alternate the contenders. Throughput and CPU are measured in steady state, from the
   first record to the last (process CPU, all threads); the time from start to the first record
   (connecting, checking the table and streams, joining the group) is reported on its own. The
   table shows medians and the ratio to the plain loop from the same run.
2. Join: one member reading a 4-shard stream that a producer keeps writing to; a second member
   starts; seconds until each owns two shards and has delivered from both (defaults unchanged).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aioboto3
import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import AsyncKinesumer, Config, Kinesumer, create_state_table  # noqa: E402
from kinesumer.aws import botocore_session  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
REGION = "us-east-1"


def fill(url: str, stream: str, shards: int, records: int, size: int = 100) -> None:
    """Create ``stream`` and write ``records`` records of ``size`` bytes, spread over its shards
    (PutRecords batches under the 5 MB request limit, from 4 threads: kinesalite takes ~13k
    records/s that way, ~10k from one)."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    client.create_stream(StreamName=stream, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    payload = b"x" * (size - 8)
    per_call = max(1, min(500, 4_000_000 // size))
    starts = list(range(0, records, per_call))

    def write(part: list[int]) -> None:
        writer = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
        for start in part:
            batch = [
                {"Data": b"%08d" % i + payload, "PartitionKey": f"k{i}"}
                for i in range(start, min(start + per_call, records))
            ]
            writer.put_records(StreamName=stream, Records=batch)

    threads = [threading.Thread(target=write, args=(starts[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bench_config(kurl: str | None, durl: str, app: str, **extra: Any) -> Config:
    """A member's Config on the stand-ins: library defaults, reading from TRIM_HORIZON (every
    benchmark reads a pre-filled stream) unless ``extra`` says otherwise."""
    values: dict[str, Any] = {"initial_position": "TRIM_HORIZON", **extra}
    return Config(
        app=app,
        dynamodb_table="bench-state",
        region=REGION,
        kinesis_endpoint=kurl,
        dynamodb_endpoint=durl,
        **values,
    )


class Clock:
    """Wall and process-CPU time at the start, the first record and the end of a run."""

    def __init__(self) -> None:
        self.start = (time.perf_counter(), time.process_time())
        self.first: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None

    def tick(self) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        self.end = (time.perf_counter(), time.process_time())


async def plain_loop(url: str, stream: str, total: int, clock: Clock, fast: bool = False) -> int:
    """What a careful hand-written consumer does: one task per shard, paced at 5 reads/s.

    ``fast``: with kinesumer's timestamp parser installed, to separate that gain from the cost
    of the library's own machinery."""
    session = aioboto3.Session(botocore_session=botocore_session()) if fast else aioboto3.Session()
    count = 0
    done = asyncio.Event()
    async with session.client("kinesis", endpoint_url=url, region_name=REGION) as kinesis:
        shards = (await kinesis.list_shards(StreamName=stream))["Shards"]

        async def read(shard_id: str) -> None:
            nonlocal count
            iterator = (
                await kinesis.get_shard_iterator(
                    StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )
            )["ShardIterator"]
            loop = asyncio.get_running_loop()
            while not done.is_set():
                started = loop.time()
                response = await kinesis.get_records(ShardIterator=iterator, Limit=10000)
                for record in response["Records"]:
                    clock.tick()
                    count += 1
                    _ = record["Data"]
                if count >= total:
                    done.set()
                iterator = response["NextShardIterator"]
                await asyncio.sleep(max(0.0, started + 0.2 - loop.time()))

        tasks = [asyncio.create_task(read(s["ShardId"])) for s in shards]
        await done.wait()
        clock.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return count


async def library_async(config: Config, stream: str, total: int, clock: Clock) -> int:
    count = 0
    consumer = AsyncKinesumer(config)
    async for record in consumer.consume([stream]):
        clock.tick()
        count += 1
        _ = record.data
        if count >= total:
            clock.stop()
            break
    await consumer.aclose()
    return count


def library_sync(config: Config, stream: str, total: int, clock: Clock) -> int:
    count = 0
    with Kinesumer(config) as consumer:
        for record in consumer.consume([stream]):
            clock.tick()
            count += 1
            _ = record.data
            if count >= total:
                clock.stop()
                break
    return count


def measure(fn: Any) -> tuple[float, float, float]:
    """(steady-state seconds, steady-state CPU seconds, seconds to the first record)."""
    clock = Clock()
    fn(clock)
    assert clock.first is not None and clock.end is not None
    return (
        clock.end[0] - clock.first[0],
        clock.end[1] - clock.first[1],
        clock.first[0] - clock.start[0],
    )


def throughput(kurl: str, durl: str, records: int, rounds: int) -> list[dict[str, Any]]:
    stream = f"bench-{os.getpid()}"
    print(f"filling {stream}: {records} records of 100 B on 4 shards ...", flush=True)
    fill(kurl, stream, 4, records)
    results: dict[str, list[tuple[float, float, float]]] = {
        "plain": [],
        "plain+": [],
        "async": [],
        "sync": [],
    }
    for n in range(rounds):

        def config(kind: str, n: int = n) -> Config:
            return bench_config(kurl, durl, f"bench-{kind}-{n}")

        contenders = {
            "plain": lambda c: asyncio.run(plain_loop(kurl, stream, records, c)),
            "plain+": lambda c: asyncio.run(plain_loop(kurl, stream, records, c, fast=True)),
            "async": lambda c: asyncio.run(library_async(config("a"), stream, records, c)),
            "sync": lambda c: library_sync(config("s"), stream, records, c),
        }
        order = list(contenders) if n % 2 == 0 else list(reversed(contenders))
        for name in order:
            wall, cpu, first = measure(contenders[name])
            results[name].append((wall, cpu, first))
            print(
                f"  round {n + 1} {name:5s}: {records / wall:9.0f} rec/s  cpu {cpu:.2f}s  "
                f"first record after {first:.2f}s",
                flush=True,
            )
    base_rate = statistics.median(records / w for w, _, _ in results["plain"])
    base_cpu = statistics.median(c for _, c, _ in results["plain"]) * 100_000 / records
    table = []
    for name, label in (
        ("plain", "plain aioboto3 loop (baseline)"),
        ("plain+", "plain loop + kinesumer's parser"),
        ("async", "kinesumer AsyncKinesumer"),
        ("sync", "kinesumer Kinesumer (sync)"),
    ):
        rate = statistics.median(records / w for w, _, _ in results[name])
        cpu = statistics.median(c for _, c, _ in results[name]) * 100_000 / records
        table.append(
            {
                "contender": label,
                "records_per_s": rate,
                "ratio": rate / base_rate,
                "cpu_s_per_100k": cpu,
                "cpu_ratio": cpu / base_cpu,
                "first_record_s": statistics.median(f for _, _, f in results[name]),
            }
        )
    return table


def compare(
    kurl: str, durl: str, shards: int, size: int, records: int, rounds: int
) -> dict[str, Any]:
    """The suite's throughput cell: the plain aioboto3 loop vs one AsyncKinesumer member over
    the same pre-filled stream, rounds alternating; medians and ratios."""
    stream = f"cmp-{shards}x{size}-{os.getpid()}"
    fill(kurl, stream, shards, records, size)
    runs: dict[str, list[tuple[float, float, float]]] = {"plain": [], "kinesumer": []}
    for n in range(rounds):
        config = bench_config(kurl, durl, f"cmp-{shards}x{size}-{n}")
        contenders = {
            "plain": lambda c: asyncio.run(plain_loop(kurl, stream, records, c)),
            "kinesumer": lambda c, config=config: asyncio.run(
                library_async(config, stream, records, c)
            ),
        }
        for name in list(contenders) if n % 2 == 0 else list(reversed(contenders)):
            runs[name].append(measure(contenders[name]))
    out: dict[str, Any] = {"shards": shards, "size": size, "records": records}
    for name, values in runs.items():
        out[f"{name}_rate"] = statistics.median(records / w for w, _, _ in values)
        out[f"{name}_cpu"] = statistics.median(c for _, c, _ in values) * 100_000 / records
    out["rate_ratio"] = out["kinesumer_rate"] / out["plain_rate"]
    out["cpu_ratio"] = out["kinesumer_cpu"] / out["plain_cpu"]
    return out


def join_time(kurl: str, durl: str, rounds: int) -> list[float]:
    stream = f"join-{os.getpid()}"
    fill(kurl, stream, 4, 0)
    stop = threading.Event()

    def produce() -> None:
        client = boto3.client("kinesis", endpoint_url=kurl, region_name=REGION)
        i = 0
        while not stop.is_set():
            batch = [{"Data": b"%d" % (i + j), "PartitionKey": f"k{i + j}"} for j in range(40)]
            client.put_records(StreamName=stream, Records=batch)
            i += 40
            time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    times = []
    try:
        for n in range(rounds):
            times.append(asyncio.run(_join_once(kurl, durl, stream, f"join-{n}")))
            print(f"  round {n + 1} join: {times[-1]:.2f}s", flush=True)
    finally:
        stop.set()
        producer.join()
    return times


async def _join_once(kurl: str, durl: str, stream: str, app: str) -> float:
    def config(client_id: str) -> Config:
        return bench_config(kurl, durl, app, client_id=client_id, initial_position="LATEST")

    seen: dict[str, set[str]] = {"a": set(), "b": set()}
    members = {c: AsyncKinesumer(config(c)) for c in "ab"}

    async def run(name: str) -> None:
        async for record in members[name].consume([stream]):
            seen[name].add(record.shard_id)

    first = asyncio.create_task(run("a"))
    while len(seen["a"]) < 4:  # noqa: ASYNC110 (polling a benchmark condition)
        await asyncio.sleep(0.01)
    started = time.monotonic()
    second = asyncio.create_task(run("b"))

    def halves() -> bool:
        owned = {
            c: {s.shard_id for s in m.stats().shards if s.status == "active"}
            for c, m in members.items()
        }
        return (
            len(owned["a"]) == 2
            and len(owned["b"]) == 2
            and owned["b"] <= seen["b"]
            and not owned["a"] & owned["b"]
        )

    while not halves():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - started
    for member in members.values():
        await member.aclose()
    await asyncio.gather(first, second, return_exceptions=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(None, dynalite.url, "bench"))
        table = throughput(kinesalite.url, dynalite.url, args.records, args.rounds)
        joins = join_time(kinesalite.url, dynalite.url, args.rounds)
    finally:
        kinesalite.stop()
        dynalite.stop()
    print()
    print(
        f"Throughput, {args.records} records x 100 B, 4 shards, kinesalite, "
        f"median of {args.rounds} ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)"
    )
    print(
        f"| {'contender':32s} | {'records/s':>10s} | {'vs plain':>8s} | "
        f"{'CPU s/100k':>10s} | {'CPU vs plain':>12s} | {'1st record':>10s} |"
    )
    print(f"|{'-' * 34}|{'-' * 12}|{'-' * 10}|{'-' * 12}|{'-' * 14}|{'-' * 12}|")
    for row in table:
        print(
            f"| {row['contender']:32s} | {row['records_per_s']:10.0f} | {row['ratio']:7.2f}x | "
            f"{row['cpu_s_per_100k']:10.2f} | {row['cpu_ratio']:11.2f}x | "
            f"{row['first_record_s']:9.2f}s |"
        )
    print()
    print(
        f"Join (defaults): second member start -> both reading their halves: "
        f"median {statistics.median(joins):.2f}s (runs: {', '.join(f'{t:.2f}' for t in joins)})"
    )


if __name__ == "__main__":
    main()
