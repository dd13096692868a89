"""The streams :class:`~.kinesis.MemoryKinesis` keeps, and the shapes of Kinesis's answers.

The state: streams of shards (hash key ranges, lineage, stored records, when a shard closed),
stream consumers, failures waiting to be injected, and what an iterator holds (a cursor, encoded
into the opaque string callers pass back). The shapes: ``ClientError``\\ s with AWS's codes and
HTTP status, a shard's ListShards description, a closed shard's ChildShards, a consumer's
description, SubscribeToShard's records. No behaviour: MemoryKinesis changes these under its lock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import ClientError

from ..kinesis.transport import ConsumerDescription, ShardDescription

#: The largest hash key (the key space is 128 bits).
MAX_HASH_KEY = 2**128 - 1
#: How long an iterator lives (Kinesis: five minutes).
ITERATOR_LIFETIME = 300.0
#: How long a subscription lives (Kinesis: five minutes).
SUBSCRIPTION_LIFETIME = 300.0
#: GetRecords' largest Limit, and its cap on an answer's bytes.
MAX_LIMIT = 10_000
MAX_ANSWER_BYTES = 10 * 1024 * 1024
#: PutRecords' most entries per call.
MAX_PUT_ENTRIES = 500
#: Where sequence numbers start: 56 digits, as Kinesis's.
SEQUENCE_BASE = 49_590_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000
#: A sequence number is SEQUENCE_BASE + (a count across the streams) * SHARD_SLOTS + the
#: shard's index: increasing in every shard and across the stream, and, as Kinesis's, telling
#: which shard it came from.
SHARD_SLOTS = 1_000_000
#: Where arrival times count from.
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: The HTTP status AWS answers a code with when it is not 400.
STATUS_OF_CODE = {
    "InternalFailure": 500,
    "InternalFailureException": 500,
    "ServiceUnavailable": 503,
    "ServiceUnavailableException": 503,
}


@dataclass
class StoredRecord:
    sequence: int
    partition_key: str
    data: bytes
    #: When it arrived, in whole milliseconds since the epoch (Kinesis stamps milliseconds).
    arrival_ms: int

    @property
    def arrival(self) -> datetime:
        return EPOCH + timedelta(milliseconds=self.arrival_ms)


@dataclass
class ShardState:
    shard_id: str
    start_hash: int
    end_hash: int
    starting_sequence: int
    parent: str | None = None
    adjacent_parent: str | None = None
    records: list[StoredRecord] = field(default_factory=list)
    ending_sequence: int | None = None
    closed_at: float | None = None
    children: list[str] = field(default_factory=list)

    def holds(self, hash_key: int) -> bool:
        return self.start_hash <= hash_key <= self.end_hash


@dataclass
class ConsumerState:
    name: str
    arn: str
    created: float


@dataclass
class StreamState:
    name: str
    arn: str
    created: float
    retention_hours: int
    shards: dict[str, ShardState] = field(default_factory=dict)
    consumers: dict[str, ConsumerState] = field(default_factory=dict)


@dataclass
class Failure:
    code: str
    status: int
    message: str
    times: int


@dataclass(frozen=True)
class Cursor:
    """What an iterator holds: read the records after ``after`` that arrived at or after
    ``since_us`` (AT_TIMESTAMP), issued at ``issued``."""

    stream: str
    shard_id: str
    after: int
    since_us: int | None  # microseconds since the epoch, as exact as a datetime
    issued: float


def client_error(operation: str, code: str, message: str, status: int | None = None) -> ClientError:
    """The ``ClientError`` botocore raises for AWS's answer ``code`` to ``operation``."""
    status = status if status is not None else STATUS_OF_CODE.get(code, 400)
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
        },
        operation,
    )


def hash_key_of(partition_key: str, explicit_hash_key: str | None = None) -> int:
    """Where Kinesis routes a record: its ExplicitHashKey, else the MD5 of its partition key
    (UTF-8) as a 128-bit number."""
    if explicit_hash_key is not None:
        return int(explicit_hash_key)
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


def shard_index(shard_id: str) -> int:
    return int(shard_id.rsplit("-", 1)[1])


def encode_cursor(cursor: Cursor) -> str:
    raw = json.dumps(
        [cursor.stream, cursor.shard_id, cursor.after, cursor.since_us, cursor.issued]
    ).encode()
    return "mk1." + base64.urlsafe_b64encode(raw).decode()


def decode_cursor(iterator: str) -> Cursor:
    try:
        if not iterator.startswith("mk1."):
            raise ValueError(iterator)
        stream, shard_id, after, since_us, issued = json.loads(
            base64.urlsafe_b64decode(iterator[4:].encode())
        )
        return Cursor(
            str(stream),
            str(shard_id),
            int(after),
            None if since_us is None else int(since_us),
            float(issued),
        )
    except (ValueError, TypeError, binascii.Error) as exc:
        raise client_error(
            "GetRecords", "InvalidArgumentException", f"Invalid ShardIterator: {iterator[:40]!r}"
        ) from exc


def event_records(stored: list[StoredRecord]) -> list[dict[str, Any]]:
    """Records as a SubscribeToShardEvent carries them (botocore's parse)."""
    return [
        {
            "SequenceNumber": str(r.sequence),
            "PartitionKey": r.partition_key,
            "Data": r.data,
            "ApproximateArrivalTimestamp": r.arrival,
        }
        for r in stored
    ]


def shard_description(shard: ShardState) -> ShardDescription:
    described: ShardDescription = {
        "ShardId": shard.shard_id,
        "HashKeyRange": {
            "StartingHashKey": str(shard.start_hash),
            "EndingHashKey": str(shard.end_hash),
        },
        "SequenceNumberRange": {"StartingSequenceNumber": str(shard.starting_sequence)},
    }
    if shard.ending_sequence is not None:
        described["SequenceNumberRange"]["EndingSequenceNumber"] = str(shard.ending_sequence)
    if shard.parent is not None:
        described["ParentShardId"] = shard.parent
    if shard.adjacent_parent is not None:
        described["AdjacentParentShardId"] = shard.adjacent_parent
    return described


def child_shard(s: StreamState, child_id: str) -> dict[str, Any]:
    child = s.shards[child_id]
    parents = [p for p in (child.parent, child.adjacent_parent) if p is not None]
    return {
        "ShardId": child_id,
        "ParentShards": parents,
        "HashKeyRange": {
            "StartingHashKey": str(child.start_hash),
            "EndingHashKey": str(child.end_hash),
        },
    }


def consumer_description(s: StreamState, consumer: ConsumerState) -> ConsumerDescription:
    return {
        "ConsumerName": consumer.name,
        "ConsumerARN": consumer.arn,
        "ConsumerStatus": "ACTIVE",
        "ConsumerCreationTimestamp": datetime.fromtimestamp(consumer.created, timezone.utc),
        "StreamARN": s.arn,
    }
