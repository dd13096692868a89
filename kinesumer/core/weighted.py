"""Load-aware assignment: shards weighted by measured throughput, members given equal load.

``Config(assignment="weighted")``. A pure function of the live members, the shard lists and the
weights the leader publishes (bytes per second per shard, measured by the owners): every member
computes the same answer from the same weights.

Greedy, largest first: every (stream, shard), heaviest first (ties: stream, then shard id), goes
to the subscriber of its stream with the least load so far (ties: fewest shards, then lowest id).
A shard with no measured weight counts as the mean of the measured ones (1.0 when none is), so a
new shard is neither free nor huge. With every member on every stream, the heaviest load is
within the largest single weight of a perfect split (the least-loaded member took the last
shard of the heaviest one, and was at most the mean before it).

Worked example: shards ``hot`` (100) and ``c1, c2, c3`` (1 each), members ``a, b``: ``hot`` goes
to ``a``; each ``c`` then goes to ``b``, which stays the lighter: ``a = {hot}``,
``b = {c1, c2, c3}`` -- equal counts would have put a cold shard beside the hot one.

Weights move a little all the time: the leader publishes them rounded to a power of two
(:func:`quantize`), so the assignment changes only when a shard's load changes by about 2x.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping, Sequence

from .assignment import Assignment

#: stream -> shard id -> weight (bytes per second, quantized).
Weights = Mapping[str, Mapping[str, float]]


def quantize(rate: float) -> float:
    """A measured rate rounded to a power of two (0 for idle shards, 1 at least otherwise), so
    small fluctuations publish the same weight and move nothing."""
    if rate <= 0 or math.isnan(rate):
        return 0.0
    return float(2 ** round(math.log2(max(rate, 1.0))))


def default_weight(weights: Weights) -> float:
    """The weight of a shard nobody measured: the mean of the measured ones (1.0 if none)."""
    values = [w for by_shard in weights.values() for w in by_shard.values()]
    return sum(values) / len(values) if values else 1.0


def weighted_assign(
    members: Mapping[str, Collection[str]],
    shards: Mapping[str, Sequence[str]],
    weights: Weights,
) -> Assignment:
    """Split every stream's shards between its subscribers so that their total weights (over
    all streams) are as equal as the greedy rule makes them."""
    result: Assignment = {client: {} for client in members}
    fallback = default_weight(weights)
    items = []
    for stream in sorted(shards):
        known = weights.get(stream, {})
        for shard_id in sorted(set(shards[stream])):
            items.append((-known.get(shard_id, fallback), stream, shard_id))
    items.sort()
    load = dict.fromkeys(members, 0.0)
    count = dict.fromkeys(members, 0)
    # One heap of (load, count, id) per stream. Loads only grow, so an entry whose member took
    # a shard of another stream since is stale *low*: popped, it is pushed again as it is now.
    heaps = {
        s: [(0.0, 0, c) for c in sorted(c for c, st in members.items() if s in st)] for s in shards
    }
    chosen: dict[str, dict[str, list[str]]] = {client: {} for client in members}
    for negative, stream, shard_id in items:
        heap = heaps[stream]
        if not heap:
            continue
        while True:
            entry = heapq.heappop(heap)
            client = entry[2]
            current = (load[client], count[client], client)
            if entry == current:
                break
            heapq.heappush(heap, current)
        load[client] -= negative
        count[client] += 1
        heapq.heappush(heap, (load[client], count[client], client))
        chosen[client].setdefault(stream, []).append(shard_id)
    for client, by_stream in chosen.items():
        result[client] = {s: tuple(sorted(ids)) for s, ids in sorted(by_stream.items())}
    return result


def weighted_shards_of(
    client_id: str,
    members: Mapping[str, Collection[str]],
    shards: Mapping[str, Sequence[str]],
    weights: Weights,
) -> dict[str, tuple[str, ...]]:
    """The shards ``client_id`` should read; nothing when it is not a live member."""
    if client_id not in members:
        return {}
    return weighted_assign(members, shards, weights)[client_id]
