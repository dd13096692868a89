"""What a producer holds for one record between ``put()`` and its acknowledgement, the checks a
record passes at ``put()``, and Kinesis' limits.

Limits (Kinesis API reference, PutRecords; "Handle large records"): a record's data plus its
partition key (UTF-8) at most 1 MiB on every stream, at most 10 MiB on a stream whose maximum
record size was raised (:mod:`.limits` learns each stream's); a partition key 1 to 256 Unicode
characters; an explicit hash key a decimal integer in ``[0, 2**128 - 1]``; a PutRecords call at
most 500 entries and 5 MiB of records of up to 1 MiB (data plus keys), or one larger record alone
(AWS: at most 10 MiB a call; stand-ins and older endpoints: 5 MiB). A record
goes to the shard whose hash key range holds the MD5 of its partition key read as a 128-bit
big-endian integer, or its explicit hash key when one is given.
"""

from __future__ import annotations

import functools
import hashlib
import re
from concurrent.futures import Future
from typing import Any, NamedTuple

from ..errors import ConfigError, InvalidRecordError, ReadOnlyStreamError, RecordTooLargeError
from ..stream_refs import parse_stream

#: What every stream takes (its default maximum record size), and the bound of a KPL aggregate:
#: a record over it is "large" and goes alone in its PutRecords call, never into an aggregate.
MAX_RECORD_BYTES = 1024 * 1024
#: What a stream whose maximum record size was raised takes at most (10 MiB): no stream takes
#: more, so :func:`check_record` refuses it without asking.
LARGEST_RECORD_BYTES = 10 * 1024 * 1024
MAX_CALL_BYTES = 5 * 1024 * 1024
MAX_CALL_RECORDS = 500
MAX_KEY_CHARS = 256
MAX_HASH_KEY = 2**128 - 1
#: Kinesis' own pattern for ExplicitHashKey: ASCII digits, no leading zero, at most 39 digits
#: (``str.isdigit()`` also accepts ``'²'``, and ``int()`` refuses over 4,300 digits).
_HASH_KEY = re.compile(r"0|[1-9][0-9]{0,38}")


class PutResult(NamedTuple):
    """Where a record landed: its shard, sequence number and, for a record packed into a KPL
    aggregate (``aggregate=True``), its position inside the aggregate (0 otherwise)."""

    shard_id: str
    sequence_number: str
    sub_sequence_number: int = 0


class PendingRecord:
    """One record from ``put()`` until its future is resolved.

    Written by the producer's core only (on its event loop), except ``future``, which the caller
    holds. ``seq`` is the producer-wide put order; ``attempts``/``not_before`` are the retry
    state of a refused entry.
    """

    __slots__ = (
        "attempts",
        "data",
        "deadline",
        "explicit_hash_key",
        "future",
        "hash_key",
        "key",
        "not_before",
        "put_time",
        "seq",
        "size",
        "stream",
    )

    def __init__(
        self,
        stream: str,
        data: bytes,
        key: str,
        explicit_hash_key: str | None,
        future: Future[PutResult] | Any,
    ) -> None:
        self.stream = stream
        self.data = data
        self.key = key
        self.explicit_hash_key = explicit_hash_key
        self.hash_key = int(explicit_hash_key) if explicit_hash_key else key_hash(key)
        self.size = len(data) + len(key.encode("utf-8"))
        self.future = future
        self.seq = 0
        self.put_time = 0.0
        self.deadline = 0.0
        self.attempts = 0
        self.not_before = 0.0


@functools.lru_cache(maxsize=65536)
def key_hash(key: str) -> int:
    """The 128-bit hash Kinesis routes a partition key by (remembered for the most recent
    keys: the usual producer puts the same keys over and over)."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest(), "big")


def valid_hash_key(value: object) -> bool:
    """Whether ``value`` is an explicit hash key Kinesis accepts (its pattern, then its range)."""
    return (
        isinstance(value, str)
        and _HASH_KEY.fullmatch(value) is not None
        and int(value) <= MAX_HASH_KEY
    )


def check_record(data: object, partition_key: object, explicit_hash_key: object) -> bytes:
    """The record's data as bytes, after the checks Kinesis would fail it for; raises
    :class:`InvalidRecordError` (or :class:`RecordTooLargeError`) saying what to fix. A record
    over 1 MiB passes when no stream could refuse it for its size alone: the producer checks
    it against its stream's limit next (:mod:`.limits`)."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise InvalidRecordError(
            f"put(data): a payload must be bytes, got {type(data).__name__}; encode it "
            f"(e.g. json.dumps(value).encode()) or put to a Topic that encodes it"
        )
    if not isinstance(partition_key, str) or not partition_key:
        raise InvalidRecordError(
            f"put(partition_key): must be a non-empty string, got {partition_key!r}"
        )
    if len(partition_key) > MAX_KEY_CHARS:
        raise InvalidRecordError(
            f"put(partition_key): {len(partition_key)} characters, Kinesis allows at most "
            f"{MAX_KEY_CHARS}; shorten or hash it"
        )
    if explicit_hash_key is not None and not valid_hash_key(explicit_hash_key):
        shown = repr(explicit_hash_key)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InvalidRecordError(
            f"put(explicit_hash_key): must be a decimal string of ASCII digits (no leading "
            f"zero) in [0, 2**128 - 1], got {shown}"
        )
    size = len(data) + len(partition_key.encode("utf-8"))
    if size > LARGEST_RECORD_BYTES:
        raise RecordTooLargeError(
            f"put(data): {size} bytes of data and partition key, Kinesis takes at most "
            f"{LARGEST_RECORD_BYTES} (10 MiB) per record, and 1 MiB unless the stream's "
            f"maximum record size was raised; split the payload or store it elsewhere and put "
            f"a reference",
            size=size,
            limit=LARGEST_RECORD_BYTES,
        )
    return data


def check_stream_arn(stream: str) -> str:
    """``stream``, a Kinesis stream's ARN a producer may put to (any account and region: the
    producer's routing transport reaches it); :class:`ReadOnlyStreamError` for a DynamoDB
    table's stream, :class:`InvalidRecordError` for a malformed ARN."""
    try:
        ref = parse_stream(stream)
    except ConfigError as exc:
        raise InvalidRecordError(f"put(stream): {exc}") from None
    if ref.is_dynamodb_stream:
        raise ReadOnlyStreamError(stream)
    return stream
