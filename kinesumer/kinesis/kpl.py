"""Turning GetRecords output into :class:`~kinesumer.models.Record`, unpacking KPL aggregates.

The KPL packs many user records into one Kinesis record: magic bytes, a protobuf
``AggregatedRecord`` (schema from the ``aws-kinesis-agg`` package), and an MD5 of it. The
package's own deaggregator rewrites every record into Lambda-style dicts with base64 data and
prints parse failures to stderr; this module uses its schema but keeps the hot path to one prefix
check per record, and treats anything that fails verification as a plain record (delivered as is,
never dropped), as the KCL does. Anything that is not a valid aggregate (not protobuf, an index
outside its table, a partition key that is not UTF-8, no user records or more than
:data:`MAX_AGGREGATED_RECORDS`) is such a record too: whoever can write to the stream cannot stop
a shard, hand the application a key that is not text, or turn one record into a flood.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import aws_kinesis_agg
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from ..models import EpochRecord, Position, Record

if TYPE_CHECKING:
    from .lean import EpochRawRecord, RawRecord

log = logging.getLogger("kinesumer.kpl")

#: What records are built as: :class:`Record` (arrival as a datetime) or :class:`EpochRecord`.
AnyRecord = TypeVar("AnyRecord", Record, EpochRecord)


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


#: Most user records one aggregate may unpack to; past it the aggregate is delivered as the plain
#: record it is (counted). The KPL aggregates at most 1 MiB (its AggregationMaxSize ceiling; 50 KB
#: by default), so this many fill one only with user records of under ~15 bytes each, which no
#: producer we know of aggregates; a crafted 1 MiB record of empty sub-records unpacks to 174,762
#: records: ~30 MB of Python objects (RECORD_OVERHEAD each) from one record on the wire.
MAX_AGGREGATED_RECORDS = 50_000

#: Bytes a delivered record costs beyond its data and partition key: the Record tuple, its bytes
#: object and its list slot (sys.getsizeof on CPython 3.11: 96 + 33 + 8, rounded up). The buffer
#: counts it, so a flood of empty sub-records weighs what it costs in memory, not 0 bytes.
RECORD_OVERHEAD = 160


class Unaggregated(Protocol):
    """Told of each record delivered as is because its aggregate was invalid (the engine counts
    them: ``ConsumerStats.unaggregated_records`` and a Prometheus counter)."""

    def unaggregated(self, stream: str, shard_id: str) -> None: ...


def record_cost(record: Record) -> int:
    """What ``record`` weighs in the buffer's byte bound: data, key and :data:`RECORD_OVERHEAD`."""
    return len(record.data) + len(record.partition_key) + RECORD_OVERHEAD


def to_records(
    stream: str,
    shard_id: str,
    raw: Sequence[dict[str, Any]],
    skip_through: Position | None,
    counter: Unaggregated | None = None,
) -> list[Record]:
    """Records of one GetRecords response, aggregates unpacked.

    ``skip_through``: drop the leading records at or before this position (a reader resumes
    *at* a sequence number so that it can skip the already-delivered part of an aggregate).
    ``counter`` hears of every record that carried the KPL magic and digest but was not a valid
    aggregate (delivered as is). Never raises on a record's content.
    """
    out: list[Record] = []
    append = out.append
    magic = _MAGIC
    for r in raw:
        data = r["Data"]
        if data[:4] == magic:
            unpacked = _unpack(
                Record,
                stream,
                shard_id,
                r["SequenceNumber"],
                data,
                r.get("ApproximateArrivalTimestamp"),
            )
            if unpacked is None:
                append(_plain(stream, shard_id, r))
                if counter is not None:
                    counter.unaggregated(stream, shard_id)
            else:
                out.extend(unpacked)
        else:
            append(_plain(stream, shard_id, r))
    return _skipped(out, skip_through)


def records_of(
    stream: str,
    shard_id: str,
    raw: Sequence[RawRecord],
    skip_through: Position | None,
    counter: Unaggregated | None = None,
) -> list[Record]:
    """:func:`to_records` for the lean reader's decoded records (:class:`.lean.RawRecord`):
    the same records, the same aggregates unpacked, the same skipping."""
    return _collected(Record, stream, shard_id, raw, skip_through, counter)


def epoch_records_of(
    stream: str,
    shard_id: str,
    raw: Sequence[EpochRawRecord],
    skip_through: Position | None,
    counter: Unaggregated | None = None,
) -> list[EpochRecord]:
    """:func:`records_of` with arrival times as epoch seconds (:class:`EpochRecord`)."""
    return _collected(EpochRecord, stream, shard_id, raw, skip_through, counter)


def epoch_records(records: list[Record]) -> list[EpochRecord]:
    """``records`` with arrival times as epoch seconds (botocore's answers, the rare path)."""
    return [EpochRecord(*r[:6], None if r[6] is None else r[6].timestamp()) for r in records]


def _collected(
    kind: type[AnyRecord],
    stream: str,
    shard_id: str,
    raw: Sequence[RawRecord] | Sequence[EpochRawRecord],
    skip_through: Position | None,
    counter: Unaggregated | None,
) -> list[AnyRecord]:
    # The cyclic garbage collector is off while the answer's records are built (a few ms per
    # 10,000). Each record is a new tuple; with the collector on, every 700 of them start
    # a collection, which beside a service's long-lived heap (service models, the
    # application's objects) cost 0.3-0.7 us per record, measured, of the ~2.3 us the whole
    # path takes. Records hold text, bytes, ints and datetimes: they cannot form a cycle, but
    # the collector never untracks a tuple subclass (only exact tuples), so each one stays
    # tracked, promoted and walked until freed. The deferred collection runs at the next
    # allocation after, if the count (less the records freed since) still calls for one. An
    # application thread's ``gc.disable()`` made meanwhile is undone here: the collector has no
    # owner to tell whose "off" it is. Left off if it was off when this began. Turned
    # off inside the ``try``: an exception raised as ``disable`` returns (KeyboardInterrupt from
    # a signal handler, on a loop in the main thread) must not leave it off for good.
    collecting = gc.isenabled()
    try:
        if collecting:
            gc.disable()
        return _skipped(_build(kind, stream, shard_id, raw, counter), skip_through)
    finally:
        if collecting:
            gc.enable()


def _build(
    kind: type[AnyRecord],
    stream: str,
    shard_id: str,
    raw: Sequence[RawRecord] | Sequence[EpochRawRecord],
    counter: Unaggregated | None,
) -> list[AnyRecord]:
    out: list[AnyRecord] = []
    append = out.append
    magic = _MAGIC
    # ``tuple.__new__`` straight: a NamedTuple's own ``__new__`` is a Python function, a frame
    # per record; with ``startswith`` (no 4-byte copy) 0.31 -> 0.22 us per record, measured.
    make = tuple.__new__
    for r in raw:
        data = r.Data
        if data.startswith(magic):
            unpacked = _unpack(
                kind, stream, shard_id, r.SequenceNumber, data, r.ApproximateArrivalTimestamp
            )
            if unpacked is not None:
                out.extend(unpacked)
                continue
            if counter is not None:
                counter.unaggregated(stream, shard_id)
        arrival = r.ApproximateArrivalTimestamp
        append(make(kind, (stream, shard_id, r.SequenceNumber, 0, r.PartitionKey, data, arrival)))
    return out


def _skipped(out: list[AnyRecord], skip_through: Position | None) -> list[AnyRecord]:
    """``out`` without its leading records at or before ``skip_through``."""
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


def _plain(stream: str, shard_id: str, r: dict[str, Any]) -> Record:
    return Record(
        stream,
        shard_id,
        r["SequenceNumber"],
        0,
        r["PartitionKey"],
        r["Data"],
        r.get("ApproximateArrivalTimestamp"),
    )


def _unpack(
    kind: type[AnyRecord],
    stream: str,
    shard_id: str,
    sequence: str,
    data: bytes,
    arrival: datetime | float | None,
) -> list[AnyRecord] | None:
    """The user records of an aggregate; None when ``r`` is not a valid one (it is then delivered
    as the plain record it is). Magic bytes and a wrong digest are a plain record by chance and
    are not reported; a right digest over something that is not a valid aggregate is logged."""
    if len(data) <= len(_MAGIC) + _DIGEST:
        return None
    body, digest = data[len(_MAGIC) : -_DIGEST], data[-_DIGEST:]
    if hashlib.md5(body).digest() != digest:
        return None
    try:
        users = _parse(body)
    except _Invalid as exc:
        problem = str(exc)
    except (DecodeError, RecursionError, UnicodeDecodeError, ValueError) as exc:
        # Whatever the protobuf backend raises on a hostile body (upb: DecodeError; the pure
        # Python one: UnicodeDecodeError, RecursionError below protobuf 5.29.5).
        problem = f"{type(exc).__name__}: {exc}"
    else:
        make = tuple.__new__
        return [
            make(kind, (stream, shard_id, sequence, i, key, payload, arrival))
            for i, (key, payload) in enumerate(users)
        ]
    log.warning(
        "%s/%s: record %s has KPL magic and a valid digest but is not a valid aggregate (%s); "
        "delivering it unaggregated",
        stream,
        shard_id,
        sequence,
        problem[:200],
    )
    return None


class _Invalid(Exception):
    """An aggregate that parses but cannot be what a KPL wrote."""


def _parse(body: bytes) -> list[tuple[str, bytes]]:
    """(partition key, data) of each user record of an aggregate's body; :class:`_Invalid` when
    an index points outside its table, a key is not text, there are no records or too many."""
    aggregate = messages_pb2.AggregatedRecord()
    aggregate.ParseFromString(body)
    count = len(aggregate.records)
    if not 0 < count <= MAX_AGGREGATED_RECORDS:
        raise _Invalid(f"{count} user records (at most {MAX_AGGREGATED_RECORDS} are unpacked)")
    keys = list(aggregate.partition_key_table)
    hash_keys = len(aggregate.explicit_hash_key_table)
    # The upb backend hands a string field that is not UTF-8 back as bytes: never a key.
    if not all(type(k) is str for k in keys):
        raise _Invalid("a partition key is not UTF-8 text")
    users = []
    for m in aggregate.records:
        index = m.partition_key_index
        if index >= len(keys):
            raise _Invalid(f"partition key index {index} of a table of {len(keys)}")
        if m.HasField("explicit_hash_key_index") and m.explicit_hash_key_index >= hash_keys:
            raise _Invalid(f"explicit hash key index {m.explicit_hash_key_index} of {hash_keys}")
        users.append((keys[index], m.data))
    return users
