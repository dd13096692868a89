"""Assignment modes side by side: shards moved per join and leave, and time at scale.

``range`` (the design's contiguous ranges) against ``sticky`` (:mod:`kinesumer.core.sticky`):

- shards moved when an 11th member joins a 10-member group on one 100-shard stream, and when
  one of 11 leaves (each from the mode's own settled assignment, owners = that assignment);
  averaged over several sets of member ids, since where a newcomer's id sorts decides how much
  ``range`` moves;
- seconds to compute the whole group's assignment for 1,000 members x 20,000 shards (one stream,
  and 20 streams of 1,000), median of a few runs; sticky is given every shard's current owner.

Pure: no stand-ins. Used by ``benchmarks/run.py``; runnable alone::

    .venv/bin/python benchmarks/bench_assignment.py
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kinesumer.core import Assignment, assign, sticky_assign

Members = dict[str, set[str]]
Shards = dict[str, list[str]]
Compute = Callable[[Members, Shards, dict[str, dict[str, str]]], Assignment]

MODES: dict[str, Compute] = {
    "range": lambda members, shards, owners: assign(members, shards),
    "sticky": sticky_assign,
}


def owners_of(result: Assignment) -> dict[str, dict[str, str]]:
    owners: dict[str, dict[str, str]] = {}
    for client, streams in result.items():
        for stream, ids in streams.items():
            owners.setdefault(stream, {}).update(dict.fromkeys(ids, client))
    return owners


def moved(before: Assignment, after: Assignment) -> int:
    old, new = owners_of(before), owners_of(after)
    return sum(
        1 for stream, ids in new.items() for sid, who in ids.items() if old[stream].get(sid) != who
    )


def member_ids(count: int, rng: random.Random) -> list[str]:
    """Ids shaped like host names plus a random part, so a newcomer sorts anywhere."""
    return [
        f"ip-10-{rng.randrange(256)}-{rng.randrange(256)}-{rng.getrandbits(32):08x}"
        for _ in range(count)
    ]


def movement(members: int = 10, shards: int = 100, trials: int = 50) -> dict[str, Any]:
    """Shards moved when member ``members + 1`` joins, and when one of ``members + 1`` leaves."""
    stream = {"orders": [f"shardId-{i:012d}" for i in range(shards)]}
    out: dict[str, Any] = {"members": members, "shards": shards, "trials": trials}
    for mode, compute in MODES.items():
        joins, leaves = [], []
        rng = random.Random(13)
        for _ in range(trials):
            ids = member_ids(members + 1, rng)
            group = {c: {"orders"} for c in ids[:members]}
            settled = compute(group, stream, {})
            settled = compute(group, stream, owners_of(settled))
            bigger = {**group, ids[-1]: {"orders"}}
            joined = compute(bigger, stream, owners_of(settled))
            joins.append(moved(settled, joined))
            leaver = rng.choice(ids)
            smaller = {c: s for c, s in bigger.items() if c != leaver}
            left = compute(smaller, stream, owners_of(joined))
            leaves.append(moved(joined, left))
        out[mode] = {
            "join_mean": statistics.mean(joins),
            "join_max": max(joins),
            "leave_mean": statistics.mean(leaves),
            "leave_max": max(leaves),
        }
    return out


def scale(members: int = 1000, shards: int = 20_000, rounds: int = 5) -> dict[str, Any]:
    """Median seconds to compute the whole group's assignment, per mode and stream layout."""
    rng = random.Random(7)
    ids = member_ids(members, rng)
    layouts = {
        "1 stream": {"orders": [f"shardId-{i:012d}" for i in range(shards)]},
        "20 streams": {
            f"stream-{s:02d}": [f"shardId-{i:012d}" for i in range(shards // 20)] for s in range(20)
        },
    }
    out: dict[str, Any] = {"members": members, "shards": shards, "rounds": rounds}
    for layout, streams in layouts.items():
        group = {c: set(streams) for c in ids}
        owners = owners_of(assign(group, streams))  # a settled group: every shard owned
        for mode, compute in MODES.items():
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                result = compute(group, streams, owners)
                times.append(time.perf_counter() - started)
            assert sum(len(ids) for r in result.values() for ids in r.values()) == shards
            out[f"{mode}, {layout}"] = statistics.median(times)
    return out


def main() -> None:
    result = {"movement": movement(), "scale": scale()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
