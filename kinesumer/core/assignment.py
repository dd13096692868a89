"""Who reads which shard: a pure function of the live members and the shard lists.

Each stream's shards (sorted by id) are cut into contiguous ranges, one per member subscribed to
that stream, in the order of the sorted member ids. Range sizes within a stream differ by at most
one. Which members get the larger ranges is decided by the load they already carry from the
streams before (streams are taken in name order), so that across many streams no member is
systematically loaded more than another: with every member on every stream, total loads differ
by at most one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

#: client id -> stream -> shard ids (sorted) that client reads.
Assignment = dict[str, dict[str, tuple[str, ...]]]

#: ``Config.assignment``: contiguous ranges (this module), :mod:`.sticky` or :mod:`.weighted`.
ASSIGNMENT_MODES = ("range", "sticky", "weighted")


def group_mode(configured: str, declared: Iterable[str]) -> str:
    """The mode the whole group assigns with: ``"sticky"`` only when this member is configured
    so and every live member declares ``"sticky"`` in its client item (``declared``; an older
    version declares nothing, ``""``), else ``"range"``.

    Two members computing with different modes would each release what the other claims. Every
    member sees the same live list, so every member picks the same mode; a member declaring
    ``"range"`` (or nothing) computes ``"range"`` whatever the others say, so the group agrees
    with it. A rolling switch to sticky therefore takes effect once the last member switched.
    """
    if configured != "range" and all(mode == configured for mode in declared):
        return configured  # "sticky" or "weighted" (:mod:`.weighted`), the same rule
    return "range"


def assign(
    members: Mapping[str, Collection[str]], shards: Mapping[str, Sequence[str]]
) -> Assignment:
    """Split every stream's shards between the members subscribed to it.

    ``members`` maps each live client id to the streams it consumes; ``shards`` maps each stream
    to the shard ids to spread (order and repeats do not matter). A stream nobody subscribes to
    is left unassigned. Members beyond a stream's shard count get nothing of it: hot standbys.
    """
    result: Assignment = {client: {} for client in members}
    load = dict.fromkeys(members, 0)
    for stream in sorted(shards):
        subscribers = sorted(c for c, streams in members.items() if stream in streams)
        if not subscribers:
            continue
        shard_ids = sorted(set(shards[stream]))
        count = len(subscribers)
        base, extra = divmod(len(shard_ids), count)
        # The `extra` larger ranges go to the least-loaded members (ties: lower id first).
        by_load = sorted(range(count), key=lambda i: (load[subscribers[i]], i))
        bigger = set(by_load[:extra])
        start = 0
        for index, client in enumerate(subscribers):
            size = base + (1 if index in bigger else 0)
            if size:
                result[client][stream] = tuple(shard_ids[start : start + size])
                load[client] += size
            start += size
    return result


def shards_of(
    client_id: str, members: Mapping[str, Collection[str]], shards: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The shards ``client_id`` should read. A client absent from ``members`` owns nothing: it
    must re-register before it reads, and it never assumes it is the leader."""
    if client_id not in members:
        return {}
    return assign(members, shards)[client_id]
