"""The Kinesis transport: the lowest layer, one typed call per Kinesis API operation kinesumer
makes, and its AWS implementation.

Above it (the reader, the producer) sit retries, pacing, error mapping and lineage; they run the
same on every transport. A transport answers as Kinesis does and fails as Kinesis does: a
botocore ``ClientError`` carrying AWS's error code and HTTP status (``ResourceNotFoundException``
400, ``ExpiredIteratorException`` 400, ``ProvisionedThroughputExceededException`` 400, ...), and
:class:`~kinesumer.aws.retry.MalformedAnswer` for a GetRecords answer that is not Kinesis's.
:class:`AwsKinesisTransport` sends the calls through an aiobotocore client (GetRecords and
PutRecords the lean way, :mod:`.lean`); ``kinesumer.testing.MemoryKinesis`` keeps streams in
memory.

Answers are shaped as AWS's (the same member names), so that a transport is a thin layer: the
listing and consumer answers are TypedDicts of AWS's members, GetRecords gives the lean decoder's
:class:`~.lean.RecordsAnswer`, GetShardIterator an :class:`IteratorAnswer` that also says when
Kinesis answered (the ``Date`` header: where a LATEST read began, by Kinesis's clock).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from ..errors import ConfigError
from . import lean
from .lean import EpochRawRecord, PutEntry, RawRecord, RecordsAnswer
from .lean import install as _lean_calls

log = logging.getLogger("kinesumer.kinesis")

#: Set to ``1``: readers parse GetRecords with botocore alone (the lean path's reference; the
#: benchmarks' "before").
BOTOCORE_GET_RECORDS_ENV = "KINESUMER_BOTOCORE_GET_RECORDS"

#: GetShardIterator's ShardIteratorType.
IteratorType = Literal[
    "TRIM_HORIZON", "LATEST", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER", "AT_TIMESTAMP"
]


class HashKeyRange(TypedDict):
    StartingHashKey: str
    EndingHashKey: str


class _SequenceNumberRange(TypedDict):
    StartingSequenceNumber: str


class SequenceNumberRange(_SequenceNumberRange, total=False):
    """A shard's sequence numbers; ``EndingSequenceNumber`` only once the shard is closed."""

    EndingSequenceNumber: str


class _ShardDescription(TypedDict):
    ShardId: str
    HashKeyRange: HashKeyRange
    SequenceNumberRange: SequenceNumberRange


class ShardDescription(_ShardDescription, total=False):
    """One shard of a ListShards page."""

    ParentShardId: str
    AdjacentParentShardId: str


class _ShardPage(TypedDict):
    Shards: list[ShardDescription]


class ShardPage(_ShardPage, total=False):
    """A ListShards page; ``NextToken`` when more pages follow."""

    NextToken: str


class StreamDescriptionSummary(TypedDict, total=False):
    StreamName: str
    StreamARN: str
    StreamStatus: str
    RetentionPeriodHours: int
    OpenShardCount: int
    ConsumerCount: int
    StreamCreationTimestamp: datetime
    #: Only for a stream whose maximum record size was set (UpdateMaxRecordSize).
    MaxRecordSizeInKiB: int


class StreamSummary(TypedDict):
    """A DescribeStreamSummary answer."""

    StreamDescriptionSummary: StreamDescriptionSummary


class _PutResultEntry(TypedDict, total=False):
    SequenceNumber: str
    ShardId: str
    ErrorCode: str
    ErrorMessage: str


class PutResultEntry(_PutResultEntry):
    """One entry of a PutRecords answer: ``SequenceNumber`` and ``ShardId`` when written,
    ``ErrorCode`` and ``ErrorMessage`` when not."""


class _PutRecordsAnswer(TypedDict):
    Records: list[PutResultEntry]


class PutRecordsAnswer(_PutRecordsAnswer, total=False):
    FailedRecordCount: int
    EncryptionType: str


class PutRecordAnswer(TypedDict):
    ShardId: str
    SequenceNumber: str


class _StartingPosition(TypedDict):
    Type: IteratorType


class StartingPosition(_StartingPosition, total=False):
    """SubscribeToShard's StartingPosition."""

    SequenceNumber: str
    Timestamp: datetime


class ConsumerDescription(TypedDict, total=False):
    ConsumerName: str
    ConsumerARN: str
    ConsumerStatus: str
    ConsumerCreationTimestamp: datetime
    StreamARN: str


class _ConsumerPage(TypedDict):
    Consumers: list[ConsumerDescription]


class ConsumerPage(_ConsumerPage, total=False):
    NextToken: str


@dataclass(frozen=True)
class IteratorAnswer:
    """A GetShardIterator answer: the iterator, and when Kinesis answered by its own clock
    (the ``Date`` header; None when the endpoint sent none)."""

    iterator: str
    served_at: datetime | None


@dataclass(frozen=True)
class SubscribeEvent:
    """One SubscribeToShardEvent.

    ``records``: raw records in GetRecords' shape (``Data`` bytes, ``SequenceNumber``,
    ``PartitionKey``, ``ApproximateArrivalTimestamp`` a UTC datetime, ...), aggregates still
    packed. ``continuation_sequence_number``: where the next subscription starts
    (AFTER_SEQUENCE_NUMBER), None when the shard ended (SHARD_END). ``child_shards``: as AWS
    sends them (``ShardId``, ``ParentShards``, ``HashKeyRange``), None when the endpoint sent
    none."""

    records: list[dict[str, Any]]
    continuation_sequence_number: str | None
    millis_behind_latest: int | None
    child_shards: list[dict[str, Any]] | None


class SubscriptionEnded(Exception):
    """The subscription ended normally (AWS ends each after 5 minutes) before SHARD_END:
    subscribe again from the last event's continuation sequence number."""


class ShardSubscriptions(Protocol):
    """What serves SubscribeToShard for :class:`AwsKinesisTransport` (HTTP/2, which the
    aiobotocore client does not speak): :class:`~.efo.subscriber.ShardSubscriber`."""

    def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[SubscribeEvent]: ...


@runtime_checkable
class KinesisTransport(Protocol):
    """The Kinesis calls kinesumer makes, one method per API operation, no retries: a failure
    is raised as the ``ClientError`` Kinesis answers with (its code and HTTP status)."""

    async def describe_stream_summary(self, stream: str) -> StreamSummary: ...

    async def list_shards(
        self,
        stream: str | None = None,
        *,
        next_token: str | None = None,
        exclusive_start_shard_id: str | None = None,
        max_results: int | None = None,
    ) -> ShardPage:
        """One page. With ``next_token`` the stream is not named (AWS refuses both)."""
        ...

    async def get_shard_iterator(
        self,
        stream: str,
        shard_id: str,
        iterator_type: IteratorType,
        *,
        sequence_number: str | None = None,
        timestamp: datetime | None = None,
    ) -> IteratorAnswer:
        """``timestamp`` (AT_TIMESTAMP) counts in whole seconds, the fraction dropped: what
        botocore sends AWS. A caller that needs the exact instant skips the leading records
        that arrived before it."""
        ...

    async def get_records(self, iterator: str, limit: int) -> RecordsAnswer[RawRecord]: ...

    async def get_epoch_records(self, iterator: str, limit: int) -> RecordsAnswer[EpochRawRecord]:
        """:meth:`get_records` with arrival times as epoch seconds."""
        ...

    async def put_records(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer: ...

    async def put_record(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer: ...

    def subscribe_to_shard(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        """The subscription's events; ends after the event without a continuation sequence
        number (SHARD_END)."""
        ...

    async def register_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription: ...

    async def describe_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription: ...

    async def list_stream_consumers(
        self, stream_arn: str, *, next_token: str | None = None
    ) -> ConsumerPage: ...

    async def deregister_stream_consumer(self, stream_arn: str, name: str) -> None: ...


class AwsKinesisTransport:
    """:class:`KinesisTransport` over an aiobotocore Kinesis client.

    GetRecords and PutRecords go the lean way (:mod:`.lean`: signed and sent by botocore, the
    body built and the answer decoded by msgspec) unless ``lean`` is False, or None (the
    default) and the environment sets :data:`BOTOCORE_GET_RECORDS_ENV` to ``1``, or the client
    is not a JSON client. SubscribeToShard needs ``subscriptions`` (HTTP/2)."""

    def __init__(
        self,
        client: Any,
        *,
        lean: bool | None = None,
        subscriptions: ShardSubscriptions | None = None,
    ) -> None:
        self.client = client
        if lean is None:
            lean = os.environ.get(BOTOCORE_GET_RECORDS_ENV) != "1"
        self.lean = lean and _lean_calls(client)
        self._subscriptions = subscriptions

    async def describe_stream_summary(self, stream: str) -> StreamSummary:
        answer: StreamSummary = await self.client.describe_stream_summary(StreamName=stream)
        return answer

    async def list_shards(
        self,
        stream: str | None = None,
        *,
        next_token: str | None = None,
        exclusive_start_shard_id: str | None = None,
        max_results: int | None = None,
    ) -> ShardPage:
        kwargs: dict[str, Any] = {}
        if next_token is not None:
            kwargs["NextToken"] = next_token
        elif stream is not None:
            kwargs["StreamName"] = stream
        if exclusive_start_shard_id is not None:
            kwargs["ExclusiveStartShardId"] = exclusive_start_shard_id
        if max_results is not None:
            kwargs["MaxResults"] = max_results
        page: ShardPage = await self.client.list_shards(**kwargs)
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
        kwargs: dict[str, Any] = {
            "StreamName": stream,
            "ShardId": shard_id,
            "ShardIteratorType": iterator_type,
        }
        if sequence_number is not None:
            kwargs["StartingSequenceNumber"] = sequence_number
        if timestamp is not None:
            kwargs["Timestamp"] = timestamp
        response = await self.client.get_shard_iterator(**kwargs)
        return IteratorAnswer(response["ShardIterator"], served_at(response))

    async def get_records(self, iterator: str, limit: int) -> RecordsAnswer[RawRecord]:
        if self.lean:
            return await lean.get_records(self.client, iterator, limit)
        return lean.from_botocore(
            await self.client.get_records(ShardIterator=iterator, Limit=limit)
        )

    async def get_epoch_records(self, iterator: str, limit: int) -> RecordsAnswer[EpochRawRecord]:
        if self.lean:
            return await lean.get_epoch_records(self.client, iterator, limit)
        response = await self.client.get_records(ShardIterator=iterator, Limit=limit)
        return lean.epoch_answer(lean.from_botocore(response))

    async def put_records(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer:
        answer: PutRecordsAnswer
        if self.lean and entries:
            # botocore validates and serializes the first entry alone; the whole call's body,
            # built by msgspec, replaces it before signing (see :mod:`.lean`).
            listed = entries if isinstance(entries, list) else list(entries)
            body = lean.put_records_body(stream, listed)
            answer = await lean.put_records(self.client, stream, _request(listed[0]), body)  # type: ignore[assignment]
        else:
            requests = [_request(entry) for entry in entries]
            answer = await self.client.put_records(StreamName=stream, Records=requests)
        return answer

    async def put_record(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer:
        kwargs: dict[str, Any] = {"StreamName": stream, "Data": data, "PartitionKey": partition_key}
        if explicit_hash_key is not None:
            kwargs["ExplicitHashKey"] = explicit_hash_key
        answer: PutRecordAnswer = await self.client.put_record(**kwargs)
        return answer

    def subscribe_to_shard(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        if self._subscriptions is None:
            raise RuntimeError(
                "SubscribeToShard needs HTTP/2: make the AwsKinesisTransport with "
                "subscriptions=ShardSubscriber(...) (kinesumer.kinesis.efo)"
            )
        return self._subscriptions.subscribe(consumer_arn, shard_id, dict(position))

    async def register_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        response = await self.client.register_stream_consumer(
            StreamARN=stream_arn, ConsumerName=name
        )
        consumer: ConsumerDescription = response["Consumer"]
        return consumer

    async def describe_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        response = await self.client.describe_stream_consumer(
            StreamARN=stream_arn, ConsumerName=name
        )
        description: ConsumerDescription = response["ConsumerDescription"]
        return description

    async def list_stream_consumers(
        self, stream_arn: str, *, next_token: str | None = None
    ) -> ConsumerPage:
        kwargs: dict[str, Any] = {"StreamARN": stream_arn}
        if next_token is not None:
            kwargs["NextToken"] = next_token
        page: ConsumerPage = await self.client.list_stream_consumers(**kwargs)
        return page

    async def deregister_stream_consumer(self, stream_arn: str, name: str) -> None:
        # By its ConsumerARN, which AWS takes as it takes the stream and the name: moto deletes
        # nothing by name, and kinesis-mock (LocalStack's) deletes the first consumer of that
        # name on any stream. One DescribeStreamConsumer more, for an operator's rare command.
        described = await self.describe_stream_consumer(stream_arn, name)
        await self.client.deregister_stream_consumer(ConsumerARN=described["ConsumerARN"])


def given_transport(kinesis: object, where: str) -> KinesisTransport | None:
    """``kinesis`` as a face's ``kinesis=`` argument: None, or a :class:`KinesisTransport`
    (ConfigError naming ``where``, the face, for anything else: a boto3 client included, whose
    blocking calls would stall the event loop)."""
    if kinesis is None or isinstance(kinesis, KinesisTransport):
        return kinesis
    raise ConfigError(
        "kinesis",
        f"{type(kinesis).__name__} is not a Kinesis transport: pass a "
        "kinesumer.testing.MemoryKinesis or another KinesisTransport, or leave it out to reach "
        "AWS (Config.kinesis_endpoint for a local server)",
        where,
    )


def transport_of(kinesis: Any, *, lean: bool | None = None) -> KinesisTransport:
    """``kinesis`` itself when it is a :class:`KinesisTransport`, else an
    :class:`AwsKinesisTransport` over it (an aiobotocore client)."""
    if isinstance(kinesis, KinesisTransport):
        return kinesis
    return AwsKinesisTransport(kinesis, lean=lean)


def served_at(response: dict[str, Any]) -> datetime | None:
    """When Kinesis answered ``response``: its ``Date`` header; None without a readable one."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    date = headers.get("date") or headers.get("Date")
    if not date:
        return None
    try:
        served = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        log.debug("unreadable Date header %r: using this host's clock", date)
        return None
    if served.tzinfo is None:  # "-0000": UTC, with no zone said
        served = served.replace(tzinfo=timezone.utc)
    return served


def _request(entry: PutEntry) -> dict[str, object]:
    """``entry`` as botocore takes a PutRecords entry."""
    request: dict[str, object] = {"Data": entry.Data, "PartitionKey": entry.PartitionKey}
    if entry.ExplicitHashKey is not None:
        request["ExplicitHashKey"] = entry.ExplicitHashKey
    return request
