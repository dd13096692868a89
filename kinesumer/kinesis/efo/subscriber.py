"""SubscribeToShard over HTTP/2: one subscription at a time per shard, its events as an async
iterator of :class:`SubscribeEvent`.

Nothing here hand-writes a protocol: the request is serialized from the Kinesis service model
and signed with botocore's SigV4 signer, HTTP/2 is httpx with h2 (:mod:`.transport`), the
response is split into botocore's event-stream messages (:class:`EventFrames`) and parsed by its
event-stream parser against the service model's shapes (records come out exactly as GetRecords
returns them).

Each subscription gets its own HTTP/2 connection, closed with it. httpcore does not reset a
stream its caller abandons: the server's frames for it would keep eating the connection's flow
control window, and one subscription dropped early (a handoff) would stall every other shard
sharing that connection. A connection of its own also means a slow shard holds back only itself.

Backpressure: the connection is read only while the caller awaits the next event. Data the
caller has not taken is not acknowledged, so the server stops once the stream's HTTP/2 window
(64 KiB + 16 MiB, httpcore's setting) is used up, and TCP holds the rest: memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import ssl
import struct
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, Protocol

try:
    import certifi
    import httpx
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    from ...errors import EnhancedFanOutNotInstalledError

    raise EnhancedFanOutNotInstalledError(
        "enhanced fan-out needs an HTTP/2 client: pip install 'kinesumer[efo]'"
    ) from exc

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.eventstream import (
    EventStreamHeaderParser,
    EventStreamMessage,
    MessagePrelude,
    ParserError,
)
from botocore.exceptions import ClientError
from botocore.parsers import EventStreamJSONParser, JSONParser
from botocore.serialize import create_serializer

from ...aws import RequestStats, error_code
from ...aws.clients import assumed_role_session, moto_loaded, parse_timestamp, session_for
from ...config import Config
from ..places import AccountPlaces
from ..routing import kinesis_place
from ..transport import SubscribeEvent, SubscriptionEnded
from .errors import error_for, reset_error
from .transport import Http2Transport

log = logging.getLogger("kinesumer.kinesis")

#: AWS sends an event at least every 5 seconds (empty ones included): a read that waits much
#: longer than that means a dead connection.
READ_TIMEOUT = 30.0
#: Largest event-stream message accepted (AWS's are far smaller; kinesis-mock's can be larger:
#: see :class:`EventFrames`). A larger one resets the subscription.
MAX_MESSAGE = 256 * 1024 * 1024
#: An event-stream message's prelude: total length, headers length, prelude CRC.
PRELUDE = 12


class CredentialsSource(Protocol):
    """Where signing credentials come from: botocore's or aiobotocore's credentials objects
    (refreshable ones refresh in ``get_frozen_credentials``, sync or async)."""

    def get_frozen_credentials(self) -> Any: ...


async def kinesis_credentials(config: Config, stats: RequestStats) -> CredentialsSource:
    """The credentials the engine's Kinesis client uses, from the same session helpers
    (:mod:`kinesumer.aws.clients`): the caller's own, or ``config.role_arn``'s (STS,
    refreshing before they expire)."""
    session = assumed_role_session(config, stats) if config.role_arn else session_for(config)
    credentials: CredentialsSource | None = await session.get_credentials()
    if credentials is None:
        raise ClientError(
            {"Error": {"Code": "NoCredentials", "Message": "no AWS credentials found"}},
            "SubscribeToShard",
        )
    return credentials


def endpoint_for(config: Config, region: str | None = None) -> str:
    """``config.kinesis_endpoint`` (``http://``: HTTP/2 with prior knowledge; ``https://``:
    HTTP/2 by ALPN), or the region's public Kinesis endpoint. ``region``: the streams of that
    region (a stream ARN's), at its endpoint (:meth:`~kinesumer.Config.kinesis_endpoint_of`)."""
    local = config.kinesis_endpoint if region is None else config.kinesis_endpoint_of(region)
    if local:
        return local.rstrip("/")
    region = region or config.effective_kinesis_region
    if not region:
        raise ClientError(
            {"Error": {"Code": "NoRegion", "Message": "set Config.region or kinesis_region"}},
            "SubscribeToShard",
        )
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://kinesis.{region}.{suffix}"


class ShardSubscriber:
    """SubscribeToShard for one member: :meth:`open` once, :meth:`subscribe` per shard and
    subscription, :meth:`close` at the end (subscriptions still open are closed by their own
    iterators: close those first, ``contextlib.aclosing``)."""

    def __init__(
        self,
        config: Config,
        credentials_source: CredentialsSource | None,
        stats: RequestStats,
        *,
        region: str | None = None,
    ) -> None:
        """``credentials_source`` None: :func:`kinesis_credentials` at :meth:`open`.
        ``region``: subscribe to the streams of that region (at its endpoint, signed for it);
        None: ``config``'s Kinesis region."""
        self._config = config
        self._credentials = credentials_source
        self._stats = stats
        self._endpoint = endpoint_for(config, region)
        self._region = region or config.effective_kinesis_region or "us-east-1"
        self._ssl: ssl.SSLContext | None = None
        self._model: Any = None
        self._open: set[httpx.AsyncClient] = set()

    async def open(self) -> None:
        if moto_loaded():
            from ...aws.moto_adapter import enhanced_fan_out_unsupported, mock_active

            if mock_active():
                raise enhanced_fan_out_unsupported()
        if self._credentials is None:
            self._credentials = await kinesis_credentials(self._config, self._stats)
        self._model = botocore.session.get_session().get_service_model("kinesis")
        self._operation = self._model.operation_model("SubscribeToShard")
        self._serializer = create_serializer(self._model.metadata["protocol"])
        self._response_parser = JSONParser(timestamp_parser=parse_timestamp)
        self._event_parser = EventStreamJSONParser(timestamp_parser=parse_timestamp)
        self._event_shape = self._operation.get_event_stream_output()
        self._ssl = ssl.create_default_context(cafile=certifi.where())

    async def close(self) -> None:
        """Close the connections of subscriptions still open: their iterators then raise
        :class:`~.errors.SubscriptionReset`."""
        self._ssl = None
        for client in list(self._open):
            await client.aclose()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[httpx.AsyncClient]:
        """A connection of its own for one subscription (see the module's docstring)."""
        if self._ssl is None:
            raise RuntimeError("ShardSubscriber.subscribe() before open() or after close()")
        timeout = httpx.Timeout(READ_TIMEOUT, connect=10.0)
        client = httpx.AsyncClient(transport=Http2Transport(self._ssl), timeout=timeout)
        self._open.add(client)
        try:
            yield client
        finally:
            self._open.discard(client)
            # Closing the connection is what ends the subscription on a kinesis-mock server
            # (its lease of the shard lasts as long as the stream does): shielded, so that a
            # second cancellation (a handoff during a close) cannot leave it open.
            await asyncio.shield(client.aclose())

    async def _signed(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> tuple[str, bytes, dict[str, str]]:
        params = {"ConsumerARN": consumer_arn, "ShardId": shard_id, "StartingPosition": position}
        serialized = self._serializer.serialize_to_request(params, self._operation)
        url = self._endpoint + serialized["url_path"]
        body: bytes = serialized["body"]
        request = AWSRequest(method="POST", url=url, data=body, headers=serialized["headers"])
        assert self._credentials is not None
        frozen = self._credentials.get_frozen_credentials()
        if inspect.isawaitable(frozen):
            frozen = await frozen
        SigV4Auth(frozen, self._model.signing_name, self._region).add_auth(request)
        return url, body, {k: str(v) for k, v in request.headers.items()}

    def _account(self, started: float, error: str | None) -> None:
        seconds = time.perf_counter() - started
        self._stats.request("kinesis", "SubscribeToShard", seconds, error, 0.0)

    def _event(self, message: EventStreamMessage, where: str) -> SubscribeEvent | None:
        """The message as an event; None for the initial-response (AWS sends one first;
        kinesis-local sends none); raises the error a message carries."""
        headers = message.headers
        if headers.get(":event-type") == "initial-response":
            return None
        response = message.to_response_dict()
        parsed = self._event_parser.parse(response, self._event_shape)
        if response["status_code"] != 200:
            raise error_for(ClientError(parsed, "SubscribeToShard"), where)
        body = parsed.get("SubscribeToShardEvent")
        if body is None:
            log.debug("%s: skipped event %s", where, headers.get(":event-type"))
            return None
        return SubscribeEvent(
            records=body.get("Records", []),
            continuation_sequence_number=body.get("ContinuationSequenceNumber"),
            millis_behind_latest=body.get("MillisBehindLatest"),
            child_shards=body.get("ChildShards"),
        )

    async def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncGenerator[SubscribeEvent, None]:
        """Subscribe to ``shard_id`` through ``consumer_arn`` from ``position`` (AWS's
        StartingPosition: ``{"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": ...}``,
        ``AT_SEQUENCE_NUMBER``, ``TRIM_HORIZON``, ``LATEST``, ``AT_TIMESTAMP`` with
        ``Timestamp``) and yield its events as they arrive.

        Ends after the event whose continuation sequence number is None (SHARD_END); raises
        :class:`SubscriptionEnded` when the subscription ends before that (expiry). Errors
        (:mod:`.errors`): :class:`~.errors.SubscribeRetryable` (a
        :class:`~kinesumer.errors.TransientAWSError` with ``code``) for what heals by waiting
        (ResourceInUse, LimitExceeded, server errors, resets, timeouts): back off and subscribe
        again from the last event; other errors are final. Close the iterator when done with it
        early (``contextlib.aclosing``): that closes its connection.
        """
        if self._model is None:
            raise RuntimeError("ShardSubscriber.subscribe() before open()")
        where = f"{shard_id} via {consumer_arn}"
        url, body, headers = await self._signed(consumer_arn, shard_id, position)
        started = time.perf_counter()
        last: str | None = None
        async with self._connection() as client:
            try:
                response_cm = client.stream("POST", url, content=body, headers=headers)
                response = await response_cm.__aenter__()
            except httpx.HTTPError as exc:
                self._account(started, type(exc).__name__)
                raise reset_error(exc, where) from exc
            try:
                if response.status_code != 200:
                    try:
                        raw = await response.aread()
                    except httpx.HTTPError as exc:
                        self._account(started, type(exc).__name__)
                        raise reset_error(exc, where) from exc
                    parsed = self._response_parser.parse(
                        {
                            "status_code": response.status_code,
                            "headers": dict(response.headers),
                            "body": raw,
                        },
                        self._operation.output_shape,
                    )
                    failure = ClientError(parsed, "SubscribeToShard")
                    self._account(started, error_code(failure) or "HTTP")
                    raise error_for(failure, where)
                self._account(started, None)
                frames = EventFrames()
                chunks = response.aiter_raw()
                while True:
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except httpx.HTTPError as exc:
                        raise reset_error(exc, where) from exc
                    frames.add_data(chunk)
                    for message in _messages(frames, where):
                        event = self._event(message, where)
                        if event is None:
                            continue
                        last = event.continuation_sequence_number
                        yield event
                        if last is None:
                            return
                raise SubscriptionEnded(f"{where}: subscription ended (continue after {last})")
            finally:
                # Closing a stream the server already reset may raise again: the first error
                # (or the caller's exit) is the one that matters.
                with contextlib.suppress(httpx.HTTPError):
                    await response_cm.__aexit__(None, None, None)


class PlacedSubscriber:
    """A member's subscriptions to the streams of every account and region it reads: each
    through a :class:`ShardSubscriber` of the consumer ARN's (account, region), signed with
    that account's credentials (its role's, as its Kinesis client's) for that region, at that
    region's endpoint; the home account and region's through ``config``'s own. One is made
    and opened at the first subscription of its place; all close with this one."""

    def __init__(self, config: Config, places: AccountPlaces, stats: RequestStats) -> None:
        self._config = config
        self._places = places
        self._stats = stats
        self._home = ShardSubscriber(config, None, stats)
        self._placed: dict[tuple[str, str], ShardSubscriber] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    async def open(self) -> None:
        await self._home.open()

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            subscribers, self._placed = list(self._placed.values()), {}
        for subscriber in [self._home, *subscribers]:
            await subscriber.close()

    async def _subscriber(self, consumer_arn: str) -> ShardSubscriber:
        place = kinesis_place(consumer_arn)
        # Home account unknown: the member was given no stream by ARN (its join learns the
        # account before reading one), so every consumer is the home's; a group reading names
        # never asks STS who it is.
        if place is None or self._places.home.account is None:
            return self._home
        found = self._placed.get(place)
        if found is not None:
            return found
        async with self._lock:
            found = self._placed.get(place)
            if found is not None:
                return found
            account, region = place
            session = await self._places.session(account, region)
            if session is None:
                return self._home
            credentials = await session.get_credentials()
            if credentials is None:
                raise ClientError(
                    {"Error": {"Code": "NoCredentials", "Message": "no AWS credentials found"}},
                    "SubscribeToShard",
                )
            if self._closed:
                raise RuntimeError("PlacedSubscriber.subscribe() after close()")
            subscriber = ShardSubscriber(self._config, credentials, self._stats, region=region)
            await subscriber.open()
            self._placed[place] = subscriber
            return subscriber

    async def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncGenerator[SubscribeEvent, None]:
        """:meth:`ShardSubscriber.subscribe` through the subscriber of ``consumer_arn``'s
        place."""
        subscriber = await self._subscriber(consumer_arn)
        async with contextlib.aclosing(
            subscriber.subscribe(consumer_arn, shard_id, position)
        ) as events:
            async for event in events:
                yield event


def _messages(frames: EventFrames, where: str) -> list[EventStreamMessage]:
    """The whole messages buffered so far; a broken frame (CRC, length) is a reset."""
    try:
        return list(frames)
    except ParserError as exc:
        raise reset_error(exc, where) from exc


class EventFrames:
    """The event-stream messages in the bytes read so far, CRCs checked, as botocore's
    ``EventStreamBuffer`` parses them but up to :data:`MAX_MESSAGE` bytes a message: botocore
    refuses payloads over 24 MiB, and kinesis-mock puts up to 10,000 records (of up to 1 MiB)
    in one event."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._headers = EventStreamHeaderParser()

    def add_data(self, data: bytes) -> None:
        self._data += data

    def __iter__(self) -> Iterator[EventStreamMessage]:
        data = self._data
        while len(data) >= PRELUDE:
            total, headers_length, prelude_crc = struct.unpack("!III", data[:PRELUDE])
            if zlib.crc32(data[:8]) != prelude_crc:
                raise ParserError("event-stream prelude checksum mismatch")
            if not PRELUDE + 4 + headers_length <= total <= MAX_MESSAGE:
                raise ParserError(f"event-stream message of {total} bytes (at most {MAX_MESSAGE})")
            if len(data) < total:
                return
            message = bytes(data[:total])
            del data[:total]
            (crc,) = struct.unpack("!I", message[-4:])
            if zlib.crc32(message[:-4]) != crc:
                raise ParserError("event-stream message checksum mismatch")
            headers_end = PRELUDE + headers_length
            yield EventStreamMessage(
                MessagePrelude(total, headers_length, prelude_crc),
                self._headers.parse(message[PRELUDE:headers_end]),
                message[headers_end:-4],
                crc,
            )
