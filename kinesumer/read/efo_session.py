"""Enhanced fan-out for one member: the stream consumers it reads through, and its subscriber.

At the join (and for every stream added later) the member registers the app's stream consumer
on each stream, idempotently (members of one app racing to register all end with the same
consumer ARN), and waits until it is ACTIVE, before any shard is claimed. The consumer is never
deregistered on close: ``kinesumer deregister-consumer`` does that. A consumer deregistered while
members read through it is forgotten (:meth:`EfoSession.forget`) when a subscription finds it
gone, and the next look-up registers it again (or finds the stream gone). The subscriber
(signed with credentials from the same session helpers as the engine's Kinesis client,
cross-account role included; for a stream given by ARN, those of its account's client, for its
region) is opened here and closed with the member.

The transport is :mod:`kinesumer.kinesis.efo` (the ``efo`` extra), imported when enhanced
fan-out is enabled; tests may hand a stand-in transport to :class:`EfoSession` instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..aws import RequestStats
from ..config import Config
from ..kinesis.transport import KinesisTransport, StartingPosition
from .efo_fetcher import ShardEvent, Subscriber

if TYPE_CHECKING:
    from ..kinesis.places import AccountPlaces

log = logging.getLogger("kinesumer.efo")


@dataclass(frozen=True)
class EfoTransport:
    """The seam between the engine and the transport: how to find a stream's ARN, register
    (or find) the consumer, and build the member's subscriber."""

    stream_arn: Callable[[Any, str], Awaitable[str]]
    register_consumer: Callable[[Any, str, str], Awaitable[str]]
    subscriber: Callable[[], Subscriber]


def aws_transport(
    config: Config,
    kinesis_client: Any,
    stats: RequestStats,
    places: AccountPlaces | None = None,
) -> EfoTransport:
    """The real transport (kinesumer.kinesis.efo), over the engine's own Kinesis client, or
    its routing transport (``kinesis_client``) with ``places``: each stream's consumer is then
    registered in the stream's own account and region, and each subscription made there
    (:class:`~kinesumer.kinesis.efo.subscriber.PlacedSubscriber`)."""
    from ..kinesis.efo.consumers import register_consumer, stream_arn
    from ..kinesis.efo.subscriber import PlacedSubscriber, ShardSubscriber

    async def arn_of(client: Any, stream: str) -> str:
        return await stream_arn(client, stream, stats=stats)

    async def register(client: Any, stream_arn: str, name: str) -> str:
        return await register_consumer(client, stream_arn, name, stats=stats)

    def subscriber() -> Subscriber:
        if places is None:
            return ShardSubscriber(config, None, stats)
        return PlacedSubscriber(config, places, stats)

    return EfoTransport(arn_of, register, subscriber)


class _TransportSubscriber:
    """A member's subscriptions through the Kinesis transport it was given."""

    def __init__(self, kinesis: KinesisTransport) -> None:
        self._kinesis = kinesis

    def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[ShardEvent]:
        starting = cast(StartingPosition, position)
        return self._kinesis.subscribe_to_shard(consumer_arn, shard_id, starting)


def given_transport(kinesis: KinesisTransport, stats: RequestStats) -> EfoTransport:
    """Enhanced fan-out through the Kinesis transport a member was given
    (``Kinesumer(config, kinesis=...)``): its consumer calls and its SubscribeToShard, with the
    same registration (idempotent, waiting for ACTIVE) as over AWS's client."""
    from ..kinesis.efo.consumers import register_consumer, stream_arn

    async def arn_of(client: Any, stream: str) -> str:
        return await stream_arn(kinesis, stream, stats=stats)

    async def register(client: Any, stream_arn: str, name: str) -> str:
        return await register_consumer(kinesis, stream_arn, name, stats=stats)

    return EfoTransport(arn_of, register, lambda: _TransportSubscriber(kinesis))


class EfoSession:
    """The consumer ARN of every stream this member reads, and the member's subscriber."""

    def __init__(self, config: Config, kinesis_client: Any, transport: EfoTransport) -> None:
        self._name = config.effective_consumer_name
        self._kinesis = kinesis_client
        self._transport = transport
        self._arns: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self.subscriber: Subscriber = transport.subscriber()
        self._opened = False

    async def open(self) -> None:
        opener = getattr(self.subscriber, "open", None)
        if opener is not None:
            await opener()
        self._opened = True

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            closer = getattr(self.subscriber, "close", None)
            if closer is not None:
                await closer()

    async def register(self, streams: Iterable[str]) -> None:
        """Make sure the app's consumer exists and is ACTIVE on each stream (idempotent)."""
        for stream in streams:
            await self.consumer_arn(stream)

    async def consumer_arn(self, stream: str) -> str:
        """The consumer's ARN on ``stream``, registered on first use."""
        arn = self._arns.get(stream)
        if arn is not None:
            return arn
        async with self._lock:
            arn = self._arns.get(stream)
            if arn is None:
                stream_arn = await self._transport.stream_arn(self._kinesis, stream)
                arn = await self._transport.register_consumer(self._kinesis, stream_arn, self._name)
                log.info("consumer %r on %s: %s", self._name, stream, arn)
                self._arns[stream] = arn
            return arn

    def forget(self, stream: str, arn: str) -> None:
        """A subscription through ``arn`` found the consumer (or the stream) gone: the next
        :meth:`consumer_arn` looks the stream up and registers the consumer again. Another
        fetcher may have done so already: a newer ARN is kept."""
        if self._arns.get(stream) == arn:
            del self._arns[stream]
            log.warning("consumer %r on %s not found: registering it again", self._name, stream)
