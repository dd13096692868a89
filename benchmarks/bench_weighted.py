"""Load-aware assignment against equal counts: load spread and time at scale.

``range`` (equal shard counts) against ``weighted`` (:mod:`kinesumer.core.weighted`) on shards
whose loads are skewed like real streams (log-normal rates, a few shards 10-20x the median,
quantized to powers of two as the leader publishes them):

- the heaviest member's load (by the published weights) over a perfect split (1.0 is
  perfect), for 10 members on 100 shards and 100 on 2,000, averaged over several draws;
- seconds to compute the whole group's assignment for 1,000 members x 20,000 shards (median of
  a few runs), and the same with 1,000 pins applied first (:mod:`kinesumer.core.controls`).

Pure: no stand-ins. Runnable alone::

    .venv/bin/python benchmarks/bench_weighted.py
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kinesumer.core import assign
from kinesumer.core.controls import Controls, split_pins
from kinesumer.core.weighted import quantize, weighted_assign


def skewed(shards: list[str], rng: random.Random) -> dict[str, float]:
    """Bytes per second per shard, log-normal (median ~22 KB/s, a few shards 10-20x that)."""
    return {sid: quantize(rng.lognormvariate(10, 1)) for sid in shards}


def spread(members: int, shards: int, trials: int = 20) -> dict[str, Any]:
    """Heaviest member's load over the mean, by mode."""
    ids = [f"shardId-{i:012d}" for i in range(shards)]
    group = {f"m{i:04d}": {"s"} for i in range(members)}
    ratios: dict[str, list[float]] = {"range": [], "weighted": []}
    rng = random.Random(7)
    for _ in range(trials):
        weights = skewed(ids, rng)
        mean = sum(weights.values()) / members
        for mode, result in (
            ("range", assign(group, {"s": ids})),
            ("weighted", weighted_assign(group, {"s": ids}, {"s": weights})),
        ):
            loads = [sum(weights[s] for s in by.get("s", ())) for by in result.values()]
            ratios[mode].append(max(loads) / mean)
    return {
        "members": members,
        "shards": shards,
        **{f"{mode}_max_over_mean": round(statistics.mean(v), 3) for mode, v in ratios.items()},
    }


def scale(members: int = 1000, shards: int = 20_000, runs: int = 3) -> dict[str, Any]:
    ids = [f"shardId-{i:012d}" for i in range(shards)]
    group = {f"m{i:04d}": {"s"} for i in range(members)}
    weights = {"s": skewed(ids, random.Random(3))}
    pins = Controls(1, {("s", ids[i]): f"m{i:04d}" for i in range(members)})

    def timed(fn: Any) -> float:
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        return round(statistics.median(samples), 3)

    return {
        "members": members,
        "shards": shards,
        "range_seconds": timed(lambda: assign(group, {"s": ids})),
        "weighted_seconds": timed(lambda: weighted_assign(group, {"s": ids}, weights)),
        "pins_split_seconds": timed(lambda: split_pins(group, {"s": ids}, pins, 0)),
    }


def run() -> dict[str, Any]:
    return {"spread": [spread(10, 100), spread(100, 2000)], "scale": scale()}


def report(out: dict[str, Any]) -> str:
    lines = ["| members x shards | range: heaviest / mean | weighted: heaviest / mean |"]
    lines.append("|---|---|---|")
    for row in out["spread"]:
        lines.append(
            f"| {row['members']} x {row['shards']} | {row['range_max_over_mean']} | "
            f"{row['weighted_max_over_mean']} |"
        )
    s = out["scale"]
    lines.append("")
    lines.append(
        f"{s['members']} members x {s['shards']} shards: range {s['range_seconds']} s, weighted "
        f"{s['weighted_seconds']} s, applying {s['members']} pins {s['pins_split_seconds']} s"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    result = run()
    print(report(result))
    print(json.dumps(result))
