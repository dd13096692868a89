"""Turning GetRecords output into :class:`~kinesumer.models.Record`, unpacking KPL aggregates.

The KPL packs many user records into one Kinesis record: magic bytes, a protobuf
``AggregatedRecord`` (schema from the ``aws-kinesis-agg`` package), and an MD5 of it. The
package's own deaggregator rewrites every record into Lambda-style dicts with base64 data and
prints parse failures to stderr; this module uses its schema but keeps the hot path to one prefix
check per record, and treats anything that fails verification as a plain record (delivered as is,
never dropped), as the KCL does.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

import aws_kinesis_agg
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from ..models import Position, Record

log = logging.getLogger("kinesumer.kpl")


def _load_schema() -> Any:
    """aws-kinesis-agg's generated protobuf module imports its sibling as a top-level module and
    the package's deaggregator puts its own folder on ``sys.path`` to make that work. Import it
    that way once, then put ``sys.path`` back so users are not left with the change."""
    saved = list(sys.path)
    try:
        import aws_kinesis_agg.deaggregator  # noqa: F401
        from aws_kinesis_agg import messages_pb2
    finally:
        sys.path[:] = saved
    return messages_pb2


messages_pb2 = _load_schema()
_MAGIC: bytes = aws_kinesis_agg.MAGIC
_DIGEST: int = aws_kinesis_agg.DIGEST_SIZE


def to_records(
    stream: str, shard_id: str, raw: Sequence[dict[str, Any]], skip_through: Position | None
) -> list[Record]:
    """Records of one GetRecords response, aggregates unpacked.

    ``skip_through``: drop the leading records at or before this position (a reader resumes
    *at* a sequence number so that it can skip the already-delivered part of an aggregate).
    """
    out: list[Record] = []
    append = out.append
    magic = _MAGIC
    for r in raw:
        data = r["Data"]
        if data[:4] == magic:
            out.extend(_unpack(stream, shard_id, r))
        else:
            append(
                Record(
                    stream,
                    shard_id,
                    r["SequenceNumber"],
                    0,
                    r["PartitionKey"],
                    data,
                    r.get("ApproximateArrivalTimestamp"),
                )
            )
    if skip_through is not None:
        seq, sub = skip_through
        drop = 0
        for record in out:
            if record.sequence_number == seq and record.sub_sequence_number <= sub:
                drop += 1
            else:
                break
        if drop:
            del out[:drop]
    return out


def _unpack(stream: str, shard_id: str, r: dict[str, Any]) -> list[Record]:
    data: bytes = r["Data"]
    sequence = r["SequenceNumber"]
    arrival = r.get("ApproximateArrivalTimestamp")
    body, digest = data[len(_MAGIC) : -_DIGEST], data[-_DIGEST:]
    plain = [Record(stream, shard_id, sequence, 0, r["PartitionKey"], data, arrival)]
    if len(data) <= len(_MAGIC) + _DIGEST or hashlib.md5(body).digest() != digest:
        return plain  # magic bytes by chance: an ordinary record
    aggregate = messages_pb2.AggregatedRecord()
    try:
        aggregate.ParseFromString(body)
        keys = list(aggregate.partition_key_table)
        return [
            Record(stream, shard_id, sequence, i, keys[m.partition_key_index], m.data, arrival)
            for i, m in enumerate(aggregate.records)
        ]
    except (DecodeError, IndexError) as exc:
        log.warning(
            "%s/%s: record %s has KPL magic and a valid digest but does not parse (%s); "
            "delivering it unaggregated",
            stream,
            shard_id,
            sequence,
            exc,
        )
        return plain
