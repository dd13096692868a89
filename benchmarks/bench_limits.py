"""Limits: assignment time at 1,000 members x 20,000 shards, state item sizes at 20,000 shards
(DynamoDB refuses items over 400 KB), and peak memory of a slow application on a huge backlog.

Used by ``benchmarks/run.py``; runnable alone::

    .venv/bin/python benchmarks/bench_limits.py [--backlog 1000000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import bench_config, fill  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Config, Kinesumer, create_state_table  # noqa: E402
from kinesumer.core import assign  # noqa: E402
from kinesumer.models import ClientInfo, Shard  # noqa: E402
from kinesumer.statestore.base import ShardCache  # noqa: E402
from kinesumer.statestore.dynamodb.shard_cache import CHUNK_BYTES  # noqa: E402
from kinesumer.statestore.dynamodb.store import client_item  # noqa: E402
from kinesumer.statestore.schema import item_size  # noqa: E402

DYNAMODB_ITEM_LIMIT = 400 * 1024


def assignment_scale(members: int = 1000, shards: int = 20_000, rounds: int = 5) -> dict[str, Any]:
    """Seconds to compute the whole group's assignment (what every member does each tick)."""
    group = {f"ip-10-0-{i // 250}-{i % 250}-{i:05d}": ("orders",) for i in range(members)}
    ids = {"orders": [f"shardId-{i:012d}" for i in range(shards)]}
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        result = assign(group, ids)
        times.append(time.perf_counter() - started)
    assert sum(len(r.get("orders", ())) for r in result.values()) == shards
    return {"members": members, "shards": shards, "seconds": statistics.median(times)}


def item_sizes(shards: int = 20_000) -> dict[str, Any]:
    """Largest items the library writes for a stream of ``shards`` open shards that were split
    from ``shards // 2`` closed parents (lineage makes the shard cache bigger)."""
    parents = [Shard(f"shardId-{i:012d}", closed=True) for i in range(shards // 2)]
    children = [
        Shard(f"shardId-{shards // 2 + i:012d}", parents[i // 2].shard_id) for i in range(shards)
    ]
    cache = ShardCache("orders", tuple(parents + children), frozenset(p.shard_id for p in parents))
    body = zlib.compress(cache.to_json(), 6)
    chunk = body[:CHUNK_BYTES]
    chunk_item = {"pk": {"S": "shard_cache#orders-etl"}, "sk": {"S": "orders#" + "f" * 45}}
    chunk_item["data"] = {"B": chunk}
    owned = {f"orders/{s.shard_id}": 1000 + i for i, s in enumerate(children)}
    client = ClientInfo("ip-10-0-0-1-12345-abcdef", 1_700_000_000_000, frozenset({"orders"}))
    client = ClientInfo(**{**client.__dict__, "owned": owned, "host": "ip-10-0-0-1", "pid": 1})
    checkpoint = {
        "pk": {"S": "check_point#orders-etl#orders"},
        "sk": {"S": "shardId-000000019999"},
        "owner": {"S": "ip-10-0-0-1-12345-abcdef"},
        "lease": {"N": "123456"},
        "last_update": {"N": "1700000000000"},
        "sequence_number": {"S": "4" * 56},  # Kinesis sequence numbers have up to 56 digits
        "sub_sequence_number": {"N": "9999"},
        "finished": {"BOOL": False},
    }
    return {
        "shards": shards,
        "cache_json": len(cache.to_json()),
        "cache_compressed": len(body),
        "cache_chunks": -(-len(body) // CHUNK_BYTES),
        "largest_cache_item": item_size(chunk_item),
        "client_item": item_size(client_item("orders-etl", client, 3600)),
        "checkpoint_item": item_size(checkpoint),
        "limit": DYNAMODB_ITEM_LIMIT,
    }


def _slow_member(config: Config, stream: str, seconds: float, out: Any) -> None:
    """A deliberately slow application (1 ms per record) for ``seconds``; reports peak RSS."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    consumed, buffered = 0, 0
    with Kinesumer(config) as consumer:
        started = time.monotonic()
        for _ in consumer.consume([stream]):
            time.sleep(0.001)
            consumed += 1
            if consumed % 500 == 0:
                buffered = max(buffered, consumer.stats().buffered_records)
                if time.monotonic() - started > seconds:
                    break
    status = Path("/proc/self/status").read_text()
    peak_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    out.put({"consumed": consumed, "peak_rss_mb": peak_kb / 1024, "peak_buffered": buffered})


def memory(kurl: str, durl: str, backlogs: tuple[int, ...], seconds: float) -> list[dict[str, Any]]:
    """Peak RSS of a slow member process on a backlog of each size (4 shards, 100 B records):
    with bounded buffers it must not grow with the backlog."""
    ctx = multiprocessing.get_context("spawn")
    rows = []
    for backlog in backlogs:
        stream = f"mem-{backlog}-{os.getpid()}"
        started = time.monotonic()
        fill(kurl, stream, 4, backlog)
        print(
            f"  memory: filled {backlog} records in {time.monotonic() - started:.0f}s", flush=True
        )
        config = bench_config(kurl, durl, f"mem-{backlog}-{os.getpid()}")
        out = ctx.Queue()
        proc = ctx.Process(target=_slow_member, args=(config, stream, seconds, out))
        proc.start()
        result = out.get(timeout=seconds + 120)
        proc.join(30)
        rows.append({"backlog": backlog, **result})
        print(f"  memory: {rows[-1]}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=1_000_000)
    args = parser.parse_args()
    print(assignment_scale())
    print(item_sizes())
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(None, dynalite.url, "bench"))
        print(memory(kinesalite.url, dynalite.url, (20_000, args.backlog), 15.0))
    finally:
        kinesalite.stop()
        dynalite.stop()


if __name__ == "__main__":
    main()
