"""``record(...)`` and ``aggregate(...)``: :class:`~kinesumer.Record`\\ s for handler tests.

Sequence numbers grow with every record built in the process, as Kinesis's do in a shard, so
records built one after the other are in sequence order. ``aggregate`` packs user records the
way the KPL does (:class:`~kinesumer.kinesis.kpl_aggregate.Aggregate`) and unpacks them the way
the reader does (:func:`~kinesumer.kinesis.kpl.to_records`): the records a handler gets from an
aggregated Kinesis record, sub-sequence numbers included.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from ..kinesis.kpl import to_records
from ..kinesis.kpl_aggregate import Aggregate
from ..models import Record

STREAM = "stream"
SHARD = "shardId-000000000000"

_sequence = itertools.count(1)


def next_sequence_number() -> str:
    """A Kinesis-like sequence number (56 digits), larger than every one made before."""
    return f"4959{next(_sequence):052d}"


def payload(data: Any) -> bytes:
    """bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return json.dumps(data).encode()


def record(
    data: Any,
    *,
    stream: str = STREAM,
    shard_id: str = SHARD,
    partition_key: str = "key",
    sequence_number: str | None = None,
    sub_sequence_number: int = 0,
    arrival: datetime | None = None,
) -> Record:
    """One record of ``stream``/``shard_id`` with ``data`` (bytes; str as UTF-8; anything else as
    JSON): what ``run()`` would hand a handler."""
    return Record(
        stream,
        shard_id,
        sequence_number or next_sequence_number(),
        sub_sequence_number,
        partition_key,
        payload(data),
        arrival or datetime.now(timezone.utc),
    )


def aggregate(
    items: Iterable[Any | tuple[str, Any]],
    *,
    stream: str = STREAM,
    shard_id: str = SHARD,
    sequence_number: str | None = None,
) -> list[Record]:
    """The user records of one KPL aggregate of ``items`` (data, or (partition key, data)), as
    the reader unpacks it: one sequence number, sub-sequence numbers 0, 1, ..."""
    packed = Aggregate()
    for index, item in enumerate(items):
        key, data = item if isinstance(item, tuple) else (f"key-{index}", item)
        packed.add(payload(data), key)
    raw = {
        "SequenceNumber": sequence_number or next_sequence_number(),
        "PartitionKey": packed.first_key or "key",
        "Data": packed.encode(),
        "ApproximateArrivalTimestamp": datetime.now(timezone.utc),
    }
    return to_records(stream, shard_id, [raw], None)
