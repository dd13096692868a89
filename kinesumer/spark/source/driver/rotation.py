"""Which shards a bounded batch reads: a records bound below the number of shards.

``max_records_per_trigger`` (or Spark's ``ReadMaxRows``) is shared evenly between a batch's
shards, one record each at least; with more shards than the bound, a batch plans only as many
shards as the bound allows, starting where the previous bounded batch stopped (in key order), so
no shard starves. A shard left out is *carried*: its next start and what its last read found are
kept for the next batch, whose plan treats it like a shard of the previous batch.
"""

from __future__ import annotations

from ..ledger import LedgerEntry
from ..offsets import SourceOffset, Start

Key = tuple[str, str]


def bound_of(max_records_per_trigger: int | None, max_rows: int | None) -> int | None:
    """Records per batch across its shards (the option, or Spark's ReadMaxRows), or None."""
    bounds = [n for n in (max_records_per_trigger, max_rows) if n]
    return min(bounds) if bounds else None


class Rotation:
    """The carried shards and where the next bounded batch starts choosing."""

    def __init__(self) -> None:
        #: Left out of the last batch: their next start, and what their last read found (None:
        #: not read yet).
        self.carried: dict[Key, tuple[Start, LedgerEntry | None]] = {}
        self.next = 0

    def choose(
        self,
        start: SourceOffset,
        ends: dict[Key, LedgerEntry],
        starts: dict[Key, Start],
        bound: int | None,
    ) -> dict[Key, Start]:
        """The shards of the batch after ``start``: all of ``starts``, or ``bound`` of them."""
        chosen = starts
        if bound is not None and len(starts) > bound:
            keys = sorted(starts)
            first = self.next % len(keys)
            chosen = {k: starts[k] for k in (keys[first:] + keys[:first])[:bound]}
            self.next = first + bound
        carried = {k: v for k, v in self.carried.items() if k in starts and k not in chosen}
        for key in sorted(set(starts) - set(chosen)):
            seen = ends.get(key) if key in start.shards else None
            known = carried.get(key, (None, None))[1]
            carried[key] = (starts[key], seen if seen is not None else known)
        self.carried = carried
        return chosen
