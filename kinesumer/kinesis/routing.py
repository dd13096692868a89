"""One :class:`~.transport.KinesisTransport` over several: each call goes to the DynamoDB
Streams transport when its stream is a DynamoDB stream ARN; to the Kinesis transport of the
stream's (account, region) when it is a Kinesis stream ARN (:class:`Places` says which, opening
its client at first use; the home account and region's is the plain Kinesis transport, and the
call then names the stream by its name); to the plain Kinesis transport otherwise.

GetRecords iterators and ListShards paging tokens do not name their stream. Those issued by the
transport of another (account, region) are given back prefixed with ``@<account>:<region>|``,
and the prefix is stripped before the iterator goes back to that transport: stateless (no map
of live iterators to bound or clean up), and a Kinesis iterator never holds ``@`` or ``|``
(base64). The home transport's iterators pass unchanged (no cost for a group reading names).

A call that names no stream is routed by what it carries: a GetRecords iterator, or a
ListShards paging token, of DynamoDB Streams begins with its stream's ARN and ``|`` (AWS's and
moto's iterators; the DynamoDB Streams transport's tokens), which no Kinesis iterator or token
does (they are base64). Enhanced fan-out's calls name a stream ARN or a stream consumer's ARN
(``arn:aws:kinesis:<region>:<account>:stream/<name>/consumer/<consumer>:<epoch>``): they go to
the transport of the ARN's (account, region), the ARN unchanged (a DynamoDB stream has no
consumers; ``Config`` refuses fan-out for one first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from ..stream_refs import is_dynamodb_stream, parse_stream, stream_of_token
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

__all__ = ["Places", "RoutingTransport", "kinesis_place", "routing_over"]


class Places(Protocol):
    """Where the Kinesis streams of an (account, region) are read."""

    async def transport(self, account: str, region: str) -> KinesisTransport | None:
        """The transport of (``account``, ``region``); None: the home transport's (the
        config's own account and region). Raises
        :class:`~kinesumer.errors.AccountAccessError` for an account it cannot reach."""


def routing_over(aws: AwsClients, places: Places | None = None) -> RoutingTransport:
    """The transport over opened :class:`~kinesumer.aws.AwsClients`: its Kinesis client, and
    its DynamoDB Streams clients (one per stream ARN's region, opened at first use) for the
    streams given by a table's stream ARN; with ``places``, the Kinesis streams of other
    accounts and regions too. Every reader over AWS builds its transport here (the group
    member, the Spark source's driver and executors)."""
    return RoutingTransport(
        transport_of(aws.kinesis), DynamoDBStreamsTransport(aws.dynamodb_streams), places
    )


class RoutingTransport:
    """:class:`~.transport.KinesisTransport` sending DynamoDB streams' calls to
    ``dynamodb_streams``, Kinesis stream ARNs' to their (account, region)'s transport
    (``places``; without it, to ``kinesis`` as given), and every other to ``kinesis``."""

    def __init__(
        self,
        kinesis: KinesisTransport,
        dynamodb_streams: KinesisTransport,
        places: Places | None = None,
    ) -> None:
        self.kinesis = kinesis
        self.dynamodb_streams = dynamodb_streams
        self.places = places
        #: The transports that issued prefixed tokens, by their prefix.
        self._tagged: dict[str, KinesisTransport] = {}
        #: The ARNs the home transport gave its streams (DescribeStreamSummary): their consumer
        #: calls go there without asking the places, which would ask STS who the caller is
        #: (a group reading names only never does).
        self._home_arns: set[str] = set()

    async def _route(self, stream: str) -> tuple[KinesisTransport, str, str]:
        """(transport, the stream as that transport names it, its tokens' prefix)."""
        if not stream.startswith("arn:") or self.places is None:
            return self._for(stream), stream, ""
        if is_dynamodb_stream(stream):
            return self.dynamodb_streams, stream, ""
        ref = parse_stream(stream)
        assert ref.account is not None and ref.region is not None
        transport = await self.places.transport(ref.account, ref.region)
        if transport is None:
            return self.kinesis, ref.name, ""
        tag = f"@{ref.account}:{ref.region}|"
        self._tagged[tag] = transport
        return transport, ref.name, tag

    def _untag(self, token: str) -> tuple[KinesisTransport, str, str]:
        """(transport, the token as it issued it, the prefix to give its next tokens)."""
        if token.startswith("@"):
            tag, bar, rest = token.partition("|")
            transport = self._tagged.get(tag + bar)
            if transport is not None:
                return transport, rest, tag + bar
        return self._for_token(token), token, ""

    def _for(self, stream: str | None) -> KinesisTransport:
        if stream is not None and is_dynamodb_stream(stream):
            return self.dynamodb_streams
        return self.kinesis

    def _for_token(self, token: str) -> KinesisTransport:
        return self.dynamodb_streams if stream_of_token(token) is not None else self.kinesis

    async def describe_stream_summary(self, stream: str) -> StreamSummary:
        transport, named, _ = await self._route(stream)
        summary = await transport.describe_stream_summary(named)
        if transport is self.kinesis and self.places is not None:
            arn = summary.get("StreamDescriptionSummary", {}).get("StreamARN")
            if arn:
                self._home_arns.add(arn)
        return summary

    async def list_shards(
        self,
        stream: str | None = None,
        *,
        next_token: str | None = None,
        exclusive_start_shard_id: str | None = None,
        max_results: int | None = None,
    ) -> ShardPage:
        if next_token is None:
            transport, named, tag = (
                await self._route(stream) if stream is not None else (self.kinesis, None, "")
            )
        else:
            transport, next_token, tag = self._untag(next_token)
            named = stream
        page = await transport.list_shards(
            named,
            next_token=next_token,
            exclusive_start_shard_id=exclusive_start_shard_id,
            max_results=max_results,
        )
        if tag and page.get("NextToken"):
            page = {**page, "NextToken": tag + page["NextToken"]}
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
        transport, named, tag = await self._route(stream)
        answer = await transport.get_shard_iterator(
            named, shard_id, iterator_type, sequence_number=sequence_number, timestamp=timestamp
        )
        return dataclasses.replace(answer, iterator=tag + answer.iterator) if tag else answer

    async def get_records(self, iterator: str, limit: int) -> RecordsAnswer[RawRecord]:
        transport, iterator, tag = self._untag(iterator)
        answer = await transport.get_records(iterator, limit)
        if tag and answer.NextShardIterator:
            answer.NextShardIterator = tag + answer.NextShardIterator
        return answer

    async def get_epoch_records(self, iterator: str, limit: int) -> RecordsAnswer[EpochRawRecord]:
        transport, iterator, tag = self._untag(iterator)
        answer = await transport.get_epoch_records(iterator, limit)
        if tag and answer.NextShardIterator:
            answer.NextShardIterator = tag + answer.NextShardIterator
        return answer

    async def put_records(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer:
        transport, named, _ = await self._route(stream)
        return await transport.put_records(named, entries)

    async def put_record(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer:
        transport, named, _ = await self._route(stream)
        return await transport.put_record(
            named, data, partition_key, explicit_hash_key=explicit_hash_key
        )

    async def _route_arn(self, arn: str) -> KinesisTransport:
        """The transport of the stream (or stream consumer) ``arn`` names: the consumer calls
        take the ARN itself, which the transport of its (account, region) is given as is."""
        if self.places is None or not arn.startswith("arn:"):
            return self._for(arn)
        if is_dynamodb_stream(arn):
            return self.dynamodb_streams
        # The last "/consumer/": a stream may be named "consumer", a consumer name has no "/".
        if arn.rsplit("/consumer/", 1)[0] in self._home_arns:
            return self.kinesis
        place = kinesis_place(arn)
        if place is None:
            return self.kinesis
        transport = await self.places.transport(*place)
        return self.kinesis if transport is None else transport

    def subscribe_to_shard(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        if self.places is None or not consumer_arn.startswith("arn:"):
            return self.kinesis.subscribe_to_shard(consumer_arn, shard_id, position)
        return self._subscribe(consumer_arn, shard_id, position)

    async def _subscribe(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        transport = await self._route_arn(consumer_arn)
        events = transport.subscribe_to_shard(consumer_arn, shard_id, position)
        try:
            async for event in events:
                yield event
        finally:
            # Closing this iterator (a handoff) must close the subscription under it: on
            # HTTP/2 that is what ends the server's stream.
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await closer()

    async def register_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        transport = await self._route_arn(stream_arn)
        return await transport.register_stream_consumer(stream_arn, name)

    async def describe_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        transport = await self._route_arn(stream_arn)
        return await transport.describe_stream_consumer(stream_arn, name)

    async def list_stream_consumers(
        self, stream_arn: str, *, next_token: str | None = None
    ) -> ConsumerPage:
        transport = await self._route_arn(stream_arn)
        return await transport.list_stream_consumers(stream_arn, next_token=next_token)

    async def deregister_stream_consumer(self, stream_arn: str, name: str) -> None:
        transport = await self._route_arn(stream_arn)
        await transport.deregister_stream_consumer(stream_arn, name)


def kinesis_place(arn: str) -> tuple[str, str] | None:
    """(account, region) of a Kinesis ARN: a stream's (``...:stream/<name>``) or a stream
    consumer's (``...:stream/<name>/consumer/<consumer>:<epoch>``, whose resource holds a
    ``:``); None for anything else."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[2] != "kinesis" or not parts[5].startswith("stream/"):
        return None
    region, account = parts[3], parts[4]
    return (account, region) if region and account else None
