"""What membership costs per member as the group grows: DynamoDB calls and capacity units per
member-minute for groups of 1 to 1,000, before (every member reads every client item each tick:
``KINESUMER_LEGACY_MEMBERSHIP=1``) and after (followers read the leader's published view).

Large groups are simulated: a load process writes the client items of the simulated members (as
full as a heartbeat writes them: 1 KB with their lag) at the heartbeat rate, with BatchWriteItem;
one to three real members (ids that sort first, so a real member leads) are measured. The group's
figure per member is ``(leader + (N - 1) x follower) / N``. Library defaults (heartbeat 1 s),
or the Go library's timing with ``--go-timing`` (heartbeat 5 s, client timeout 10 s).

Used by ``benchmarks/run.py``; runnable alone::

    .venv/bin/python benchmarks/bench_cost.py [--sizes 1,10,50,200,1000] [--window 20] [--go-timing]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import REGION, bench_config, fill  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402
from support.wait import eventually  # noqa: E402

from kinesumer import AsyncKinesumer, ConsumerStats, create_state_table  # noqa: E402
from kinesumer.group.membership import LEGACY_ENV  # noqa: E402
from kinesumer.models import ClientInfo  # noqa: E402
from kinesumer.statestore.dynamodb import client_item  # noqa: E402

#: On-demand prices, us-east-1 (USD per million request units).
WRITE_PRICE, READ_PRICE = 1.25, 0.25
SHARDS = 16


def _simulate(durl: str, table: str, app: str, ids: list[str], interval: float, stop: Any) -> None:
    """The load process: every ``interval``, rewrite each simulated member's client item."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    dynamodb = boto3.client("dynamodb", endpoint_url=durl, region_name=REGION)
    lag = {f"stream/shardId-{i:012d}": 1000 + i for i in range(64)}  # filled to the 1 KB budget
    while not stop.is_set():
        started = time.monotonic()
        now = int(time.time() * 1000)
        items = [
            client_item(app, ClientInfo(cid, now, frozenset(["stream"]), owned=lag), 3600)
            for cid in ids
        ]
        for start in range(0, len(items), 25):
            requests = [{"PutRequest": {"Item": i}} for i in items[start : start + 25]]
            while requests:
                answer = dynamodb.batch_write_item(RequestItems={table: requests})
                requests = answer.get("UnprocessedItems", {}).get(table, [])
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def _totals(stats: ConsumerStats) -> tuple[int, float, float]:
    """(DynamoDB calls, read units, write units) so far."""
    calls = sum(n for k, n in stats.requests.items() if k.startswith("dynamodb:"))
    writes = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem")
    cap = stats.dynamodb_capacity
    return (
        calls,
        sum(v for k, v in cap.items() if k not in writes),
        sum(v for k, v in cap.items() if k in writes),
    )


async def _measure(
    kurl: str, durl: str, size: int, legacy: bool, window: float, timing: dict[str, float]
) -> dict[str, Any]:
    # Unique per timing too: the suite measures the defaults and the Go library's timing.
    go = "go-" if timing else ""
    tag = f"{go}{'old' if legacy else 'new'}-{size}-{os.getpid()}"
    stream = f"cost-{tag}"
    fill(kurl, stream, SHARDS, 0)
    real = min(size, 3)
    configs = [
        bench_config(kurl, durl, f"cost-{tag}", client_id=f"a{i}", **timing) for i in range(real)
    ]
    app, table = configs[0].app, configs[0].dynamodb_table
    simulated = [f"sim-{i:04d}" for i in range(size - real)]
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    loader = ctx.Process(
        target=_simulate,
        args=(durl, table, app, simulated, configs[0].heartbeat_interval, stop),
    )
    if simulated:
        loader.start()
    if legacy:
        os.environ[LEGACY_ENV] = "1"
    consumers = [AsyncKinesumer(c) for c in configs]

    async def drain(consumer: AsyncKinesumer) -> None:
        async for _ in consumer.consume([stream]):
            pass

    tasks = [asyncio.create_task(drain(c)) for c in consumers]
    try:
        await eventually(
            lambda: all(len(c.stats().live_members) == size for c in consumers),
            timeout=120,
            what=f"{size} live members",
            interval=0.2,
        )
        await asyncio.sleep(3 * configs[0].heartbeat_interval)  # past the joins
        before = [_totals(c.stats()) for c in consumers]
        ticks = [c.stats().coordinator_ticks for c in consumers]
        await asyncio.sleep(window)
        after = [_totals(c.stats()) for c in consumers]
        ticks = [c.stats().coordinator_ticks - t for c, t in zip(consumers, ticks, strict=True)]
        live = [len(c.stats().live_members) for c in consumers]
    finally:
        os.environ.pop(LEGACY_ENV, None)
        for consumer in consumers:
            await consumer.aclose()
        for task in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
        stop.set()
        if simulated:
            loader.join(30)
    minutes = window / 60
    per = [
        tuple((a - b) / minutes for a, b in zip(x, y, strict=True))
        for x, y in zip(after, before, strict=True)
    ]
    leader, followers = per[0], per[1:] or [per[0]]
    follower = tuple(sum(f[i] for f in followers) / len(followers) for i in range(3))
    group = tuple((leader[i] + (size - 1) * follower[i]) / size for i in range(3))
    dollars = (group[1] * READ_PRICE + group[2] * WRITE_PRICE) * 60 * 24 * 30 / 1e6
    return {
        "members": size,
        "path": "before" if legacy else "after",
        "calls": group[0],
        "read_units": group[1],
        "write_units": group[2],
        "follower_calls": follower[0],
        "follower_units": follower[1] + follower[2],
        "leader_calls": leader[0],
        "leader_units": leader[1] + leader[2],
        "usd_member_month": dollars,
        "ticks_per_min": sum(ticks) / len(ticks) / minutes,
        "live_seen": min(live),
    }


def cost(
    kurl: str, durl: str, sizes: tuple[int, ...], window: float, go_timing: bool = False
) -> list[dict[str, Any]]:
    """One row per (group size, path): per member-minute figures (group average, follower,
    leader), dollars per member-month at on-demand prices."""
    timing = {"heartbeat_interval": 5.0, "client_timeout": 10.0} if go_timing else {}
    rows = []
    for size in sizes:
        for legacy in (True, False):
            row = asyncio.run(_measure(kurl, durl, size, legacy, window, timing))
            rows.append(row)
            print(
                f"  cost {row['path']:>6} {size:>5} members: {row['calls']:6.1f} calls "
                f"{row['read_units'] + row['write_units']:7.1f} CU /member/min (follower "
                f"{row['follower_calls']:.1f} calls {row['follower_units']:.1f} CU, leader "
                f"{row['leader_calls']:.1f} calls {row['leader_units']:.1f} CU); "
                f"${row['usd_member_month']:.3f}/member-month; "
                f"{row['ticks_per_min']:.0f} ticks/min; saw {row['live_seen']} live",
                flush=True,
            )
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows of :func:`cost` as one Markdown table: before and after side by side."""
    by = {(r["members"], r["path"]): r for r in rows}
    lines = [
        "| members | before: calls | before: CU | after: calls | after: CU | after: follower "
        "CU | after: leader CU | before $/member-month | after $/member-month |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sorted({r["members"] for r in rows}):
        old, new = by[size, "before"], by[size, "after"]
        lines.append(
            f"| {size:,} | {old['calls']:.0f} | {old['read_units'] + old['write_units']:,.0f} | "
            f"{new['calls']:.0f} | {new['read_units'] + new['write_units']:,.0f} | "
            f"{new['follower_units']:.0f} | {new['leader_units']:,.0f} | "
            f"{old['usd_member_month']:.2f} | {new['usd_member_month']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,50,200,1000")
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--go-timing", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(kinesalite.url, dynalite.url, "bench"))
        sizes = tuple(int(s) for s in args.sizes.split(","))
        print(
            "\n".join(table(cost(kinesalite.url, dynalite.url, sizes, args.window, args.go_timing)))
        )
    finally:
        kinesalite.stop()
        dynalite.stop()


if __name__ == "__main__":
    main()
