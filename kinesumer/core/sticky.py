"""Sticky assignment: ranges as balanced as ``range``, moving the fewest shards on a change.

``Config(assignment="sticky")``. A pure function of the live members, the shard lists and the
shards' current owners (read from the checkpoint items): every member computes the same answer
alone. Per stream, with ``n`` shards and ``k`` subscribed members:

1. **Quotas.** ``base, extra = divmod(n, k)``; the ``extra`` members ranked first by a hash of
   (stream, member id) get ``base + 1``, the others ``base``. The rank of two members never
   depends on who else is live, nor on the owners.
2. **Keep.** Each member keeps the lowest ids of the shards it owns now, up to its quota.
3. **Fill.** The rest (unowned, owned by a dead or unsubscribed member, or beyond an owner's
   quota), in shard id order, fills the members' remaining quotas in member id order.

Worked example: stream ``orders``, shards ``s0..s9`` owned by ``a`` (s0-s4) and ``b`` (s5-s9);
``c`` joins. Quotas are 4, 3, 3 (``b`` ranks first for ``orders``: b=4, a=3, c=3). ``a`` keeps
s0-s2, ``b`` keeps s5-s8; s3, s4, s9 fill ``c``. Three shards move, the fewest possible;
``range`` would move four (a: s0-s3, b: s4-s6, c: s7-s9).

**Balance** holds per stream: range sizes differ by at most one within each stream (step 1).
Across streams the ``+1`` of each stream goes to members chosen independently by the hash, so
totals are spread evenly in expectation but not within one: an overall bound needs each stream's
``+1`` to depend on the other streams' quotas, and then one join reshuffles the ``+1`` of every
stream, which is exactly the movement this mode exists to avoid.

**Moves.** From a balanced assignment (every owner at its quota), when a member joins no quota
of a present member grows (``base`` falls, or stays while ``extra`` shrinks and the hash order of
the others is unchanged), so only the newcomer's quota moves: at most ``ceil(n / (k + 1))``
shards per stream. When a member leaves, no quota shrinks, so only the leaver's shards move: at
most ``ceil(n / k)``. Both are the least any balanced assignment can move.

**Convergence without a barrier.** Members read the owners at different moments of a
rebalance. Quotas depend on the members and shards only; the shards an over-quota member keeps
are the same in every intermediate state (its lowest ids); and a shard claimed from the pool
was in its new owner's contiguous block of the fill, so removing it leaves every other block as
it was. Every state between the start of a rebalance and its end therefore yields the same
target. A member within its quota is never asked to give anything up by anyone's computation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence

from .assignment import Assignment

#: stream -> shard id -> the client id in its checkpoint's ``owner`` (unowned shards absent).
Owners = Mapping[str, Mapping[str, str]]


def rank_key(stream: str, client_id: str) -> tuple[bytes, str]:
    """Where ``client_id`` ranks for ``stream``'s larger ranges: a hash every process computes
    alike (Python's ``hash()`` of a str differs between processes), ties by id."""
    digest = hashlib.blake2b(f"{stream}\0{client_id}".encode(), digest_size=8).digest()
    return digest, client_id


def sticky_assign(
    members: Mapping[str, Collection[str]],
    shards: Mapping[str, Sequence[str]],
    owners: Owners,
) -> Assignment:
    """Split every stream's shards between its subscribers, keeping shards where they are.

    ``members`` maps each live client id to the streams it consumes; ``shards`` maps each stream
    to the shard ids to spread (order and repeats do not matter); ``owners`` says who holds each
    shard now (owners that are not live subscribers, and shards not listed, are ignored).
    """
    result: Assignment = {client: {} for client in members}
    for stream in sorted(shards):
        subscribers = sorted(c for c, streams in members.items() if stream in streams)
        if not subscribers:
            continue
        for client, ids in _split(stream, subscribers, shards[stream], owners.get(stream, {})):
            if ids:
                result[client][stream] = ids
    return result


def _split(
    stream: str, subscribers: list[str], shard_ids: Sequence[str], owners: Mapping[str, str]
) -> list[tuple[str, tuple[str, ...]]]:
    ordered = sorted(set(shard_ids))
    base, extra = divmod(len(ordered), len(subscribers))
    ranked = sorted(subscribers, key=lambda c: rank_key(stream, c)) if extra else []
    bigger = set(ranked[:extra])
    quota = {c: base + (1 if c in bigger else 0) for c in subscribers}
    held: dict[str, list[str]] = {c: [] for c in subscribers}
    for shard_id in ordered:  # in id order, so each member keeps its lowest ids
        owner = owners.get(shard_id)
        if owner in held:
            held[owner].append(shard_id)
    kept = {c: held[c][: quota[c]] for c in subscribers}
    taken = {s for ids in kept.values() for s in ids}
    pool = iter([s for s in ordered if s not in taken])
    split = []
    for client in subscribers:
        wanted = quota[client] - len(kept[client])
        mine = kept[client] + [next(pool) for _ in range(wanted)]
        split.append((client, tuple(sorted(mine))))
    return split


def sticky_shards_of(
    client_id: str,
    members: Mapping[str, Collection[str]],
    shards: Mapping[str, Sequence[str]],
    owners: Owners,
) -> dict[str, tuple[str, ...]]:
    """The shards ``client_id`` should read; nothing when it is not a live member."""
    if client_id not in members:
        return {}
    return sticky_assign(members, shards, owners)[client_id]
