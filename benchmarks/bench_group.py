"""Group-level figures: aggregate throughput of 1, 2 and 4 member processes, and what a group
costs in DynamoDB and Kinesis calls. Library defaults throughout (heartbeat 1 s, tick 1 s).

Used by ``benchmarks/run.py``; runnable alone::

    .venv/bin/python benchmarks/bench_group.py [--scaling-records 300000] [--cost-window 15]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import REGION, Clock, bench_config, fill, plain_loop  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402
from support.wait import eventually, wait_until  # noqa: E402

from kinesumer import (  # noqa: E402
    AsyncKinesumer,
    Config,
    ConsumerStats,
    Kinesumer,
    create_state_table,
)


# -- scaling ------------------------------------------------------------------------------------
def _member(config: Config, stream: str, count: Any, first: Any, stop: Any) -> None:
    """One member process: polls in batches, publishing its record count and the monotonic
    time of its first record (CLOCK_MONOTONIC is shared by the machine's processes)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with Kinesumer(config) as consumer:
        consumer.subscribe([stream])
        while not stop.is_set():
            batch = consumer.poll(max_records=5000, timeout=0.2)
            if batch and not first.value:
                first.value = time.monotonic()
            count.value += len(batch)


def scaling(kurl: str, durl: str, records: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Aggregate records/s of k member processes draining one pre-filled 16-shard stream (from
    the first record any member gets to the last), next to one plain aioboto3 loop process
    (one task per shard) on the same stream: the ceiling the stand-in allows."""
    stream = f"scale-{os.getpid()}"
    fill(kurl, stream, 16, records)
    clock = Clock()
    asyncio.run(plain_loop(kurl, stream, records, clock))
    assert clock.first is not None and clock.end is not None
    plain = records / (clock.end[0] - clock.first[0])
    print(f"  scaling: plain loop: {plain:.0f} rec/s", flush=True)
    ctx = multiprocessing.get_context("spawn")
    rows = []
    for k in sizes:
        stop = ctx.Event()
        counts = [ctx.Value("q", 0) for _ in range(k)]
        firsts = [ctx.Value("d", 0.0) for _ in range(k)]
        config = bench_config(kurl, durl, f"scale-{k}-{os.getpid()}")
        procs = [
            ctx.Process(
                target=_member,
                args=(config.replace(client_id=f"m{i}"), stream, counts[i], firsts[i], stop),
            )
            for i in range(k)
        ]
        for proc in procs:
            proc.start()
        try:
            wait_until(
                lambda counts=counts, procs=procs: (  # type: ignore[misc]
                    sum(c.value for c in counts) >= records or not all(p.is_alive() for p in procs)
                ),
                timeout=120,
                what=f"{k} members to drain the stream",
                interval=0.01,
            )
            end = time.monotonic()
            if sum(c.value for c in counts) < records:
                raise RuntimeError(f"{k} members did not drain the stream (one died)")
        finally:
            stop.set()
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
        first = min(f.value for f in firsts if f.value)
        rate = records / (end - first)
        rows.append({"members": k, "records_per_s": rate, "plain_records_per_s": plain})
        print(f"  scaling: {k} member process(es): {rate:.0f} rec/s", flush=True)
    return rows


# -- cost ---------------------------------------------------------------------------------------
def _sum(stats: list[Any], prefix: str) -> tuple[int, float]:
    requests = sum(n for s in stats for k, n in s.requests.items() if k.startswith(prefix))
    capacity = sum(sum(s.dynamodb_capacity.values()) for s in stats)
    return requests, capacity


async def _cost_for(
    kurl: str, durl: str, members: int, shards: int, window: float, rate: int
) -> dict[str, Any]:
    stream = f"cost-{members}-{os.getpid()}"
    fill(kurl, stream, shards, 0)
    app = f"cost-{members}-{os.getpid()}"
    consumers = [
        AsyncKinesumer(bench_config(kurl, durl, app, client_id=f"c{i:03d}")) for i in range(members)
    ]
    joining = asyncio.Semaphore(8)  # a deployment does not start 50 members in one millisecond

    async def drain(consumer: AsyncKinesumer) -> None:
        async with joining:
            await consumer.subscribe([stream])
        async for _ in consumer.consume([stream]):
            pass

    tasks = [asyncio.create_task(drain(c)) for c in consumers]
    try:

        def owned(stats: list[ConsumerStats]) -> int:
            return sum(1 for s in stats for sh in s.shards if sh.status == "active")

        def settled() -> bool:
            # One snapshot per member per poll: 50 members' snapshots share this event loop.
            stats = [c.stats() for c in consumers]
            live = all(len(s.live_members) == members for s in stats)
            return live and owned(stats) == shards

        await eventually(
            settled,
            timeout=120,
            what=f"{members} members to settle",
            diagnose=lambda: f"{owned([c.stats() for c in consumers])} shards owned",
            interval=0.1,
        )
        await asyncio.sleep(2)  # past the joins' claims and handoffs
        result: dict[str, Any] = {"members": members, "shards": shards}
        for phase in ("idle", "busy"):
            stop = threading.Event()
            producer = threading.Thread(target=_produce, args=(kurl, stream, rate, stop))
            if phase == "busy":
                producer.start()
            before = [c.stats() for c in consumers]
            await asyncio.sleep(window)
            after = [c.stats() for c in consumers]
            stop.set()
            if phase == "busy":
                producer.join()
            calls = _sum(after, "dynamodb:")[0] - _sum(before, "dynamodb:")[0]
            capacity = _sum(after, "dynamodb:")[1] - _sum(before, "dynamodb:")[1]
            reads = _sum(after, "kinesis:GetRecords")[0] - _sum(before, "kinesis:GetRecords")[0]
            minutes = window / 60
            result[f"{phase}_calls"] = calls / members / minutes
            result[f"{phase}_capacity"] = capacity / members / minutes
            result[f"{phase}_getrecords"] = reads / shards / window
        return result
    finally:
        for consumer in consumers:
            await consumer.aclose()
        for task in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)


def _produce(kurl: str, stream: str, rate: int, stop: threading.Event) -> None:
    client = boto3.client("kinesis", endpoint_url=kurl, region_name=REGION)
    i, per = 0, max(1, rate // 10)
    while not stop.wait(0.1):
        batch = [{"Data": b"%08d" % (i + j), "PartitionKey": f"k{i + j}"} for j in range(per)]
        client.put_records(StreamName=stream, Records=batch)
        i += per


def cost(
    kurl: str, durl: str, sizes: tuple[int, ...], shards: int, window: float, rate: int
) -> list[dict[str, Any]]:
    """DynamoDB requests and capacity units per member per minute, idle and busy, and
    GetRecords per shard per second, for groups of each size (members in this one process)."""
    rows = []
    for members in sizes:
        rows.append(asyncio.run(_cost_for(kurl, durl, members, shards, window, rate)))
        r = rows[-1]
        print(
            f"  cost: {members} member(s): idle {r['idle_calls']:.0f} calls "
            f"{r['idle_capacity']:.0f} CU /member/min; busy {r['busy_calls']:.0f} calls "
            f"{r['busy_capacity']:.0f} CU; GetRecords/shard/s idle {r['idle_getrecords']:.2f} "
            f"busy {r['busy_getrecords']:.2f}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scaling-records", type=int, default=100_000)
    parser.add_argument("--cost-window", type=float, default=15.0)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(kinesalite.url, dynalite.url, "bench"))
        print(scaling(kinesalite.url, dynalite.url, args.scaling_records, (1, 2, 4)))
        print(cost(kinesalite.url, dynalite.url, (1, 10, 50), 16, args.cost_window, 400))
    finally:
        kinesalite.stop()
        dynalite.stop()


if __name__ == "__main__":
    main()
