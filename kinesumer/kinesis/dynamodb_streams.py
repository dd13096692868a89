"""The DynamoDB Streams transport: a table's change stream behind the same
:class:`~.transport.KinesisTransport` seam as Kinesis, so the engine (leases, checkpoints,
handoff, parents before children, handlers, metrics, broadcast) reads it unchanged.

Each call is made on an aiobotocore ``dynamodbstreams`` client and answered as Kinesis answers:

- DescribeStreamSummary and ListShards come from DescribeStream (paged by
  ``ExclusiveStartShardId``; the paging token given back is ``<stream ARN>|<last shard id>``, so
  that a ListShards page asked by token alone finds its stream). A shard keeps its
  ``ParentShardId``; it is closed when its ``EndingSequenceNumber`` is present. DynamoDB Streams
  has no hash keys: every shard says it covers the whole key space.
- GetShardIterator as Kinesis's, but for AT_TIMESTAMP, which DynamoDB Streams does not have
  (InvalidArgumentException; ``Config`` refuses it first, see
  :func:`~kinesumer.config.check_streams_for`).
- GetRecords gives each stream record as a Kinesis record (:func:`raw_record_of`): ``Data`` is
  the stream record as JSON, ``PartitionKey`` the item's key as canonical JSON (so
  ``ordering="key"`` keeps each item's changes in order), ``SequenceNumber`` the record's own,
  arrival its ``ApproximateCreationDateTime``. DynamoDB Streams has no MillisBehindLatest: the
  answers carry none (the lag of such a shard shows as unknown; a handler sees each change's age
  from its ``created_at``, :func:`kinesumer.dynamodb_streams.change`). A drained closed shard
  answers without a next iterator, Kinesis's SHARD_END.
- Errors are Kinesis's (:func:`_as_kinesis`): ``LimitExceededException`` is already a throttling
  code; ``TrimmedDataAccessException`` becomes, on GetRecords, ``ExpiredIteratorException`` (the
  reader asks a new iterator from the last record delivered) and, on GetShardIterator,
  ``InvalidArgumentException`` (a checkpoint older than the 24 hours kept: the reader says to
  reset it).
- Writes and enhanced fan-out do not exist for a table's stream: a named
  :class:`~kinesumer.errors.ConfigError` (a table's stream is written through its table).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, NoReturn

from botocore.exceptions import ClientError

from ..errors import ConfigError
from ..stream_refs import TABLE_STREAM_WRITES, parse_stream, stream_of_token
from .lean import EpochRawRecord, PutEntry, RawRecord, RecordsAnswer, epoch_answer
from .transport import (
    ConsumerDescription,
    ConsumerPage,
    IteratorAnswer,
    IteratorType,
    PutRecordAnswer,
    PutRecordsAnswer,
    ShardDescription,
    ShardPage,
    StartingPosition,
    StreamSummary,
    SubscribeEvent,
    served_at,
)

__all__ = [
    "CREATION_STAMP_MS",
    "MAX_GET_RECORDS",
    "DynamoDBStreamsTransport",
    "raw_record_of",
    "record_json",
    "stamp_floor_ms",
]

#: GetRecords' largest Limit on DynamoDB Streams (Kinesis takes 10,000).
MAX_GET_RECORDS = 1000
#: The resolution of ``ApproximateCreationDateTime``: AWS rounds it down to the second.
CREATION_STAMP_MS = 1000
#: The whole hash key space, which a DynamoDB Streams shard (it has no hash keys) covers.
_WHOLE_KEY_SPACE = {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)}

#: DynamoDB Streams' error codes as Kinesis's, per operation (the others are the same).
_CODES: dict[str, dict[str, str]] = {
    "GetRecords": {"TrimmedDataAccessException": "ExpiredIteratorException"},
    "GetShardIterator": {"TrimmedDataAccessException": "InvalidArgumentException"},
}

#: How a DynamoDB Streams client is had for a region (the stream ARN's).
ClientOf = Callable[[str], Awaitable[Any]]


class DynamoDBStreamsTransport:
    """:class:`~.transport.KinesisTransport` over DynamoDB Streams: ``client_of(region)`` gives
    the aiobotocore ``dynamodbstreams`` client of a stream ARN's region (:meth:`over` for one
    client). Streams are named by their ARNs (``table/<t>/stream/<label>``)."""

    def __init__(self, client_of: ClientOf) -> None:
        self._client_of = client_of

    @classmethod
    def over(cls, client: Any) -> DynamoDBStreamsTransport:
        """The transport over ``client``, whatever the stream's region."""

        async def client_of(region: str) -> Any:
            return client

        return cls(client_of)

    async def _client(self, stream: str) -> Any:
        region = parse_stream(stream).region
        assert region is not None  # a DynamoDB stream ARN names its region
        return await self._client_of(region)

    async def describe_stream_summary(self, stream: str) -> StreamSummary:
        client = await self._client(stream)
        with _as_kinesis("DescribeStreamSummary"):
            answer = await client.describe_stream(StreamArn=stream, Limit=1)
        described = answer["StreamDescription"]
        summary: StreamSummary = {
            "StreamDescriptionSummary": {
                "StreamName": stream,
                "StreamARN": described.get("StreamArn", stream),
                # ENABLED/DISABLED/ENABLING/DISABLING: a disabled stream is still read to its
                # shards' ends (they close), so it is as ACTIVE as a Kinesis stream is.
                "StreamStatus": "ACTIVE",
                "RetentionPeriodHours": 24,
                "ConsumerCount": 0,
            }
        }
        created = described.get("CreationRequestDateTime")
        if isinstance(created, datetime):
            summary["StreamDescriptionSummary"]["StreamCreationTimestamp"] = created
        return summary

    async def list_shards(
        self,
        stream: str | None = None,
        *,
        next_token: str | None = None,
        exclusive_start_shard_id: str | None = None,
        max_results: int | None = None,
    ) -> ShardPage:
        if next_token is not None:
            arn = stream_of_token(next_token)
            if arn is None:
                _refuse_code("ListShards", "InvalidArgumentException", "not this stream's token")
            stream, exclusive_start_shard_id = arn, next_token.partition("|")[2]
        if stream is None:
            _refuse_code("ListShards", "InvalidArgumentException", "no stream named")
        kwargs: dict[str, Any] = {"StreamArn": stream}
        if exclusive_start_shard_id:
            kwargs["ExclusiveStartShardId"] = exclusive_start_shard_id
        if max_results is not None:
            kwargs["Limit"] = min(max_results, 100)
        client = await self._client(stream)
        with _as_kinesis("ListShards"):
            answer = await client.describe_stream(**kwargs)
        described = answer["StreamDescription"]
        page: ShardPage = {"Shards": [_shard(s) for s in described.get("Shards", [])]}
        last = described.get("LastEvaluatedShardId")
        if last:
            page["NextToken"] = f"{stream}|{last}"
        return page

    async def get_shard_iterator(
        self,
        stream: str,
        shard_id: str,
        iterator_type: IteratorType,
        *,
        sequence_number: str | None = None,
        timestamp: datetime | None = None,
    ) -> IteratorAnswer:
        if iterator_type == "AT_TIMESTAMP":
            _refuse_code(
                "GetShardIterator",
                "InvalidArgumentException",
                "DynamoDB Streams has no AT_TIMESTAMP iterator",
            )
        kwargs: dict[str, Any] = {
            "StreamArn": stream,
            "ShardId": shard_id,
            "ShardIteratorType": iterator_type,
        }
        if sequence_number is not None:
            kwargs["SequenceNumber"] = sequence_number
        client = await self._client(stream)
        with _as_kinesis("GetShardIterator"):
            response = await client.get_shard_iterator(**kwargs)
        return IteratorAnswer(response["ShardIterator"], served_at(response))

    async def get_records(self, iterator: str, limit: int) -> RecordsAnswer[RawRecord]:
        stream = stream_of_token(iterator)
        if stream is None:
            _refuse_code(
                "GetRecords", "InvalidArgumentException", "not a DynamoDB Streams iterator"
            )
        client = await self._client(stream)
        with _as_kinesis("GetRecords"):
            response = await client.get_records(
                ShardIterator=iterator, Limit=max(1, min(limit, MAX_GET_RECORDS))
            )
        return RecordsAnswer[RawRecord](
            Records=[raw_record_of(r) for r in response.get("Records", [])],
            MillisBehindLatest=None,
            NextShardIterator=response.get("NextShardIterator"),
        )

    async def get_epoch_records(self, iterator: str, limit: int) -> RecordsAnswer[EpochRawRecord]:
        return epoch_answer(await self.get_records(iterator, limit))

    async def put_records(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer:
        _no_writes(stream)

    async def put_record(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer:
        _no_writes(stream)

    def subscribe_to_shard(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        _no_fan_out(consumer_arn)

    async def register_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        _no_fan_out(stream_arn)

    async def describe_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        _no_fan_out(stream_arn)

    async def list_stream_consumers(
        self, stream_arn: str, *, next_token: str | None = None
    ) -> ConsumerPage:
        _no_fan_out(stream_arn)

    async def deregister_stream_consumer(self, stream_arn: str, name: str) -> None:
        _no_fan_out(stream_arn)


def raw_record_of(record: dict[str, Any]) -> RawRecord:
    """A DynamoDB Streams record (as botocore parses it) as a Kinesis record: ``Data`` its JSON
    (:func:`record_json`), ``PartitionKey`` the item's key as canonical JSON, the record's
    sequence number, arrival its ``ApproximateCreationDateTime``."""
    change = record.get("dynamodb", {})
    created = change.get("ApproximateCreationDateTime")
    if isinstance(created, (int, float)):
        created = datetime.fromtimestamp(created, timezone.utc)
    return RawRecord(
        SequenceNumber=change["SequenceNumber"],
        PartitionKey=_canonical(change.get("Keys", {})),
        Data=record_json(record),
        ApproximateArrivalTimestamp=created if isinstance(created, datetime) else None,
    )


def stamp_floor_ms(instant_ms: int) -> int:
    """``instant_ms`` rounded down to the second, as DynamoDB Streams stamps its records: a
    read "from the first record created at or after" an instant starts at the instant's whole
    second, or a change made later within that second (stamped with the second's start) would
    be skipped. At-least-once: changes of that second made before the instant are read too."""
    return instant_ms - instant_ms % CREATION_STAMP_MS


def record_json(record: dict[str, Any]) -> bytes:
    """The stream record as DynamoDB Streams sends it, as JSON bytes: binary attribute values
    in base64, ``ApproximateCreationDateTime`` in epoch seconds (the wire's forms, which botocore
    had parsed into bytes and a datetime)."""
    return json.dumps(record, default=_wire, separators=(",", ":")).encode()


def _canonical(keys: dict[str, Any]) -> str:
    return json.dumps(keys, default=_wire, sort_keys=True, separators=(",", ":"))


def _wire(value: object) -> object:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(f"{type(value).__name__} is not in a DynamoDB Streams record")


def _shard(shard: dict[str, Any]) -> ShardDescription:
    described: ShardDescription = {
        "ShardId": shard["ShardId"],
        "HashKeyRange": {**_WHOLE_KEY_SPACE},  # type: ignore[typeddict-item]
        "SequenceNumberRange": shard.get("SequenceNumberRange", {"StartingSequenceNumber": "0"}),
    }
    if shard.get("ParentShardId"):
        described["ParentShardId"] = shard["ParentShardId"]
    return described


@contextlib.contextmanager
def _as_kinesis(operation: str) -> Iterator[None]:
    """A DynamoDB Streams error raised as the ``ClientError`` Kinesis answers with."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        mapped = _CODES.get(operation, {}).get(code)
        if mapped is None:
            raise
        response: Any = {**exc.response, "Error": {**error, "Code": mapped}}
        raise ClientError(response, operation) from exc


def _refuse_code(operation: str, code: str, message: str) -> NoReturn:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    raise ClientError(response, operation)


def _no_writes(stream: str) -> NoReturn:
    raise ConfigError("streams", f"{stream!r}: {TABLE_STREAM_WRITES}")


def _no_fan_out(stream: str) -> NoReturn:
    raise ConfigError(
        "enhanced_fan_out",
        f"DynamoDB Streams has no enhanced fan-out ({stream!r}): read it with "
        "enhanced_fan_out=False",
    )
