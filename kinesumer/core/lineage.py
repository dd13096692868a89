"""Shard lineage after splits and merges: parents are read to their end before children."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ..models import Shard


def active_shards(shards: Iterable[Shard], finished: Collection[str]) -> list[str]:
    """Shard ids still to be read: every listed shard not yet read to SHARD_END, sorted.

    Children whose parents are still being read are included: their owner claims them and waits,
    so it can start the moment the parents finish rather than a shard sync later.
    """
    return sorted(s.shard_id for s in shards if s.shard_id not in finished)


def parents_pending(
    shard: Shard, listed: Mapping[str, Shard], finished: Collection[str]
) -> list[str]:
    """Parents of ``shard`` that must be finished before it may be read.

    A parent no longer listed (past the stream's retention) has nothing left to read.
    """
    return [p for p in shard.parents if p in listed and p not in finished]


def has_known_parent(
    shard: Shard, listed: Mapping[str, Shard], finished: Collection[str] = ()
) -> bool:
    """A child born from a split or merge whose parent is still listed, or that the group
    finished or held a position in (``finished`` also holds parents that aged out of the
    listing while the group followed them), starts at TRIM_HORIZON: every record written to it
    after the reshard comes after the parent's last record, so starting anywhere later would
    lose data. A shard whose parents aged out of the stream before the group ever read them is
    a root for this group and starts at the configured initial position."""
    return any(p in listed or p in finished for p in shard.parents)
