"""One shard's records as columns: a list per field, as the Spark executors read them.

A Spark task hands its records to Spark as one Arrow table. Building a tuple per record first
(:class:`~kinesumer.models.EpochRecord`) and then the table from the tuples cost more than the
answer's decoding; the lists here are taken straight from the decoder's records (the objects
it made, not copies) and each becomes one Arrow array
(:func:`kinesumer.spark.arrow.epoch_columns_to_arrow`). Arrival times are the answer's epoch
seconds, as in :class:`~kinesumer.models.EpochRecord`.

An answer holding KPL aggregates goes the tuple way (:func:`.kpl.epoch_records_of`) and is
turned into columns after (:meth:`EpochColumns.from_records`): its user records are made one by
one anyway.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import methodcaller
from typing import TYPE_CHECKING

import aws_kinesis_agg

from ..models import EpochRecord, Position
from .kpl import Unaggregated, epoch_records_of

if TYPE_CHECKING:
    from .lean import EpochRawRecord


class EpochColumns:
    """Records of ``stream/shard_id`` in order, a list per field (equal lengths)."""

    def __init__(
        self,
        stream: str,
        shard_id: str,
        sequence_numbers: list[str] | None = None,
        sub_sequence_numbers: list[int] | None = None,
        partition_keys: list[str] | None = None,
        datas: list[bytes] | None = None,
        arrivals: list[float | None] | None = None,
    ) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self.sequence_numbers = sequence_numbers or []
        self.sub_sequence_numbers = sub_sequence_numbers or []
        self.partition_keys = partition_keys or []
        self.datas = datas or []
        self.arrivals = arrivals or []

    @classmethod
    def from_records(
        cls, stream: str, shard_id: str, records: Sequence[EpochRecord]
    ) -> EpochColumns:
        """``records`` (all of ``stream/shard_id``) as columns."""
        out = cls(stream, shard_id)
        for r in records:
            out.sequence_numbers.append(r.sequence_number)
            out.sub_sequence_numbers.append(r.sub_sequence_number)
            out.partition_keys.append(r.partition_key)
            out.datas.append(r.data)
            out.arrivals.append(r.approximate_arrival_timestamp)
        return out

    def __len__(self) -> int:
        return len(self.sequence_numbers)

    def record(self, index: int) -> EpochRecord:
        """The record at ``index`` (negative counts from the end)."""
        return EpochRecord(
            self.stream,
            self.shard_id,
            self.sequence_numbers[index],
            self.sub_sequence_numbers[index],
            self.partition_keys[index],
            self.datas[index],
            self.arrivals[index],
        )

    def records(self) -> Iterator[EpochRecord]:
        """The records, one tuple each (tests and diagnostics)."""
        return (self.record(i) for i in range(len(self)))

    def position(self, index: int) -> Position:
        """Where the record at ``index`` is: sequence number and sub-sequence number."""
        return Position(self.sequence_numbers[index], self.sub_sequence_numbers[index])

    def extend(self, other: EpochColumns) -> None:
        """Append ``other``'s records (of the same shard)."""
        self.sequence_numbers.extend(other.sequence_numbers)
        self.sub_sequence_numbers.extend(other.sub_sequence_numbers)
        self.partition_keys.extend(other.partition_keys)
        self.datas.extend(other.datas)
        self.arrivals.extend(other.arrivals)

    def head(self, count: int) -> EpochColumns:
        """The first ``count`` records (the lists copied: slices)."""
        return EpochColumns(
            self.stream,
            self.shard_id,
            self.sequence_numbers[:count],
            self.sub_sequence_numbers[:count],
            self.partition_keys[:count],
            self.datas[:count],
            self.arrivals[:count],
        )

    def arrived_since(self, since_ms: int) -> tuple[EpochColumns, bool]:
        """The records without the leading ones that arrived before ``since_ms`` (epoch ms: what
        ``AT_TIMESTAMP`` would not have returned; arrival times are whole milliseconds), and
        whether one that did not was found (then stop skipping). As
        :func:`~.reader.arrived_since` for records."""
        for i, arrival in enumerate(self.arrivals):
            if arrival is None or round(arrival * 1000) >= since_ms:
                return (self if i == 0 else self.tail(i)), True
        return EpochColumns(self.stream, self.shard_id), False

    def tail(self, start: int) -> EpochColumns:
        """The records from index ``start`` on (the lists copied: slices)."""
        return EpochColumns(
            self.stream,
            self.shard_id,
            self.sequence_numbers[start:],
            self.sub_sequence_numbers[start:],
            self.partition_keys[start:],
            self.datas[start:],
            self.arrivals[start:],
        )

    def truncate(self, count: int) -> None:
        """Keep only the first ``count`` records."""
        for column in self._lists():
            del column[count:]

    def latest_arrival(self) -> float | None:
        """The latest arrival time (epoch seconds), None if no record has one."""
        try:
            return max(self.arrivals, default=None)  # type: ignore[type-var]
        except TypeError:  # some records have none (built by hand; Kinesis always sets it)
            return max((a for a in self.arrivals if a is not None), default=None)

    def _lists(self) -> tuple[list[str], list[int], list[str], list[bytes], list[float | None]]:
        return (
            self.sequence_numbers,
            self.sub_sequence_numbers,
            self.partition_keys,
            self.datas,
            self.arrivals,
        )


#: Whether a record's data starts with the KPL's magic bytes (a C call per record, in ``map``).
_IS_AGGREGATE = methodcaller("startswith", aws_kinesis_agg.MAGIC)


def epoch_columns_of(
    stream: str,
    shard_id: str,
    raw: Sequence[EpochRawRecord],
    skip_through: Position | None,
    counter: Unaggregated | None = None,
) -> EpochColumns:
    """:func:`.kpl.epoch_records_of` as columns: the same records, the same aggregates
    unpacked, the same skipping."""
    datas = [r.Data for r in raw]
    if any(map(_IS_AGGREGATE, datas)):
        records = epoch_records_of(stream, shard_id, raw, skip_through, counter)
        return EpochColumns.from_records(stream, shard_id, records)
    out = EpochColumns(
        stream,
        shard_id,
        [r.SequenceNumber for r in raw],
        [0] * len(raw),
        [r.PartitionKey for r in raw],
        datas,
        [r.ApproximateArrivalTimestamp for r in raw],
    )
    # ``kpl``'s rule, for records whose sub-sequence numbers are all 0: the leading records at
    # the resume point's sequence number (one at most: Kinesis never repeats one).
    if skip_through is not None and skip_through.sub_sequence_number >= 0:
        drop = 0
        while drop < len(out) and out.sequence_numbers[drop] == skip_through.sequence_number:
            drop += 1
        if drop:
            for column in out._lists():
                del column[:drop]
    return out
