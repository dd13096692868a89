"""One :class:`~.transport.KinesisTransport` over two: each call goes to the DynamoDB Streams
transport when its stream is a DynamoDB stream ARN, to the Kinesis transport otherwise.

A call that names no stream is routed by what it carries: a GetRecords iterator, or a
ListShards paging token, of DynamoDB Streams begins with its stream's ARN and ``|`` (AWS's and
moto's iterators; the DynamoDB Streams transport's tokens), which no Kinesis iterator or token
does (they are base64). Enhanced fan-out's SubscribeToShard names a consumer: always Kinesis's
(a DynamoDB stream has no consumers; ``Config`` refuses fan-out for one first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ..stream_refs import is_dynamodb_stream, stream_of_token
from .dynamodb_streams import DynamoDBStreamsTransport
from .lean import EpochRawRecord, PutEntry, RawRecord, RecordsAnswer
from .transport import (
    ConsumerDescription,
    ConsumerPage,
    IteratorAnswer,
    IteratorType,
    KinesisTransport,
    PutRecordAnswer,
    PutRecordsAnswer,
    ShardPage,
    StartingPosition,
    StreamSummary,
    SubscribeEvent,
    transport_of,
)

if TYPE_CHECKING:
    from ..aws.clients import AwsClients

__all__ = ["RoutingTransport", "routing_over"]


def routing_over(aws: AwsClients) -> RoutingTransport:
    """The transport over opened :class:`~kinesumer.aws.AwsClients`: its Kinesis client, and
    its DynamoDB Streams clients (one per stream ARN's region, opened at first use) for the
    streams given by a table's stream ARN. Every reader over AWS builds its transport here (the
    group member, the Spark source's driver and executors)."""
    return RoutingTransport(
        transport_of(aws.kinesis), DynamoDBStreamsTransport(aws.dynamodb_streams)
    )


class RoutingTransport:
    """:class:`~.transport.KinesisTransport` sending DynamoDB streams' calls to
    ``dynamodb_streams`` and every other to ``kinesis``."""

    def __init__(self, kinesis: KinesisTransport, dynamodb_streams: KinesisTransport) -> None:
        self.kinesis = kinesis
        self.dynamodb_streams = dynamodb_streams

    def _for(self, stream: str | None) -> KinesisTransport:
        if stream is not None and is_dynamodb_stream(stream):
            return self.dynamodb_streams
        return self.kinesis

    def _for_token(self, token: str) -> KinesisTransport:
        return self.dynamodb_streams if stream_of_token(token) is not None else self.kinesis

    async def describe_stream_summary(self, stream: str) -> StreamSummary:
        return await self._for(stream).describe_stream_summary(stream)

    async def list_shards(
        self,
        stream: str | None = None,
        *,
        next_token: str | None = None,
        exclusive_start_shard_id: str | None = None,
        max_results: int | None = None,
    ) -> ShardPage:
        transport = self._for(stream) if next_token is None else self._for_token(next_token)
        return await transport.list_shards(
            stream,
            next_token=next_token,
            exclusive_start_shard_id=exclusive_start_shard_id,
            max_results=max_results,
        )

    async def get_shard_iterator(
        self,
        stream: str,
        shard_id: str,
        iterator_type: IteratorType,
        *,
        sequence_number: str | None = None,
        timestamp: datetime | None = None,
    ) -> IteratorAnswer:
        return await self._for(stream).get_shard_iterator(
            stream, shard_id, iterator_type, sequence_number=sequence_number, timestamp=timestamp
        )

    async def get_records(self, iterator: str, limit: int) -> RecordsAnswer[RawRecord]:
        return await self._for_token(iterator).get_records(iterator, limit)

    async def get_epoch_records(self, iterator: str, limit: int) -> RecordsAnswer[EpochRawRecord]:
        return await self._for_token(iterator).get_epoch_records(iterator, limit)

    async def put_records(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer:
        return await self._for(stream).put_records(stream, entries)

    async def put_record(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer:
        return await self._for(stream).put_record(
            stream, data, partition_key, explicit_hash_key=explicit_hash_key
        )

    def subscribe_to_shard(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        return self.kinesis.subscribe_to_shard(consumer_arn, shard_id, position)

    async def register_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        return await self._for(stream_arn).register_stream_consumer(stream_arn, name)

    async def describe_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        return await self._for(stream_arn).describe_stream_consumer(stream_arn, name)

    async def list_stream_consumers(
        self, stream_arn: str, *, next_token: str | None = None
    ) -> ConsumerPage:
        return await self._for(stream_arn).list_stream_consumers(stream_arn, next_token=next_token)

    async def deregister_stream_consumer(self, stream_arn: str, name: str) -> None:
        await self._for(stream_arn).deregister_stream_consumer(stream_arn, name)
