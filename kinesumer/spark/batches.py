"""What a :func:`~kinesumer.spark.foreach_batch` function and its caller are told about batches.

:class:`ShardRange` (one shard's first and last record in a batch or a run), :class:`BatchInfo`
(one batch, passed to ``fn(df, batch_id, info)``), :class:`RunSummary` (what a whole call
processed), and :class:`RangeBuilder`, which the driver uses to build the ranges from records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from ..models import Record

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class ShardRange:
    """The records of one shard in a batch (or a run): first and last position, and how many.

    Records of a shard arrive in sequence order, so a sink can make its writes idempotent per
    shard: remember the last position written, skip what is not past it. Sequence numbers are
    decimal strings of up to 56 digits; compare them as integers (:meth:`contains` does).
    """

    stream: str
    shard_id: str
    first_sequence_number: str
    first_sub_sequence_number: int
    last_sequence_number: str
    last_sub_sequence_number: int
    count: int

    def contains(self, sequence_number: str, sub_sequence_number: int = 0) -> bool:
        """Whether the position lies between the first and last record (inclusive)."""
        position = (int(sequence_number), sub_sequence_number)
        first = (int(self.first_sequence_number), self.first_sub_sequence_number)
        last = (int(self.last_sequence_number), self.last_sub_sequence_number)
        return first <= position <= last


@dataclass(frozen=True)
class BatchInfo:
    """What a batch holds, for ``fn(df, batch_id, info)``.

    ``batch_id`` counts the batches of this :func:`foreach_batch` call from 0; unlike Spark's
    own foreachBatch id it is **not** durable (it restarts with every run and differs between
    drivers), so never use it as an idempotency key: use ``ranges``.
    """

    batch_id: int
    client_id: str
    ranges: tuple[ShardRange, ...]
    records: int
    bytes: int
    collect_seconds: float
    """From the batch's first record to its closing (bounded by ``max_interval``)."""

    def range_of(self, stream: str, shard_id: str) -> ShardRange | None:
        for shard_range in self.ranges:
            if shard_range.stream == stream and shard_range.shard_id == shard_id:
                return shard_range
        return None


@dataclass(frozen=True)
class RunSummary:
    """What a :func:`foreach_batch` call processed (and checkpointed) before it returned."""

    batches: int
    records: int
    bytes: int
    shards: tuple[ShardRange, ...]
    """Per shard: first and last record processed by this run, and their number."""
    stopped_by: str
    """``"drained"`` (available_now), ``"stop"`` (the stop event) or ``"signal:SIGTERM"``..."""
    seconds: float

    @property
    def last_sequence_numbers(self) -> dict[tuple[str, str], tuple[str, int]]:
        """``(stream, shard_id) -> (sequence_number, sub_sequence_number)`` of the last record
        processed and checkpointed per shard."""
        return {
            (r.stream, r.shard_id): (r.last_sequence_number, r.last_sub_sequence_number)
            for r in self.shards
        }


BatchFunction: TypeAlias = (
    "Callable[[DataFrame, int], object] | Callable[[DataFrame, int, BatchInfo], object]"
)
"""``fn(df, batch_id)`` (Spark's own foreachBatch signature) or ``fn(df, batch_id, info)``."""


class RangeBuilder:
    """Accumulates per-shard first/last positions and counts, from records (one batch) or from
    ranges (a run's batches). Used by the driver only."""

    def __init__(self) -> None:
        # (stream, shard id) -> [first, last, count]; first/last: a Record or a ShardRange.
        self._shards: dict[tuple[str, str], list[Any]] = {}

    def add_records(self, records: Sequence[Record]) -> None:
        shards = self._shards
        for record in records:
            key = (record.stream, record.shard_id)
            entry = shards.get(key)
            if entry is None:
                shards[key] = [record, record, 1]
            else:
                entry[1] = record
                entry[2] += 1

    def add_range(self, shard_range: ShardRange) -> None:
        key = (shard_range.stream, shard_range.shard_id)
        entry = self._shards.get(key)
        if entry is None:
            self._shards[key] = [shard_range, shard_range, shard_range.count]
        else:
            entry[1] = shard_range
            entry[2] += shard_range.count

    def build(self) -> tuple[ShardRange, ...]:
        out = []
        for (stream, shard_id), (first, last, count) in sorted(self._shards.items()):
            if isinstance(first, ShardRange):
                head = (first.first_sequence_number, first.first_sub_sequence_number)
                tail = (last.last_sequence_number, last.last_sub_sequence_number)
            else:
                head = (first.sequence_number, first.sub_sequence_number)
                tail = (last.sequence_number, last.sub_sequence_number)
            out.append(ShardRange(stream, shard_id, *head, *tail, count))
        return tuple(out)
