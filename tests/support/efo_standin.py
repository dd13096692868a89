"""A small SubscribeToShard server over HTTP/2 (the ``h2`` library) on 127.0.0.1, for what
kinesis-local does not show: the initial-response event, child shards in the last event,
subscriptions that expire, a takeover of an open subscription, a reset mid-stream, error answers
and HTTP/2 flow control. It is not a Kinesis: shards are scripted lists of records.

Run it on the test's event loop (``async with EfoStandIn() as server``). Event-stream messages
are framed by :func:`encode_message` (prelude, string headers, payload, two CRC32s); the client
decodes them with botocore's parser, which checks both checksums.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events

LOOPBACK = "127.0.0.1"
FIRST_SEQUENCE = 49_600_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: total and header lengths, prelude CRC, headers (all strings,
    type 7), payload, message CRC."""
    encoded = b"".join(
        bytes([len(name)])
        + name.encode()
        + b"\x07"
        + struct.pack(">H", len(value))
        + value.encode()
        for name, value in headers.items()
    )
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event_message(event_type: str, body: dict[str, Any]) -> bytes:
    headers = {":message-type": "event", ":event-type": event_type}
    headers[":content-type"] = "application/json"
    return encode_message(headers, json.dumps(body).encode())


def exception_message(code: str, message: str) -> bytes:
    headers = {":message-type": "exception", ":exception-type": code}
    headers[":content-type"] = "application/json"
    return encode_message(headers, json.dumps({"message": message}).encode())


@dataclass
class ScriptedShard:
    """Records (``SequenceNumber`` as an int, ``Data`` bytes, ``PartitionKey``); closed shards
    end with an event that has no continuation and carries ``child_shards``."""

    records: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False
    child_shards: list[dict[str, Any]] | None = None

    def put(self, data: bytes, key: str = "k") -> int:
        sequence = FIRST_SEQUENCE + 1000 * len(self.records)
        self.records.append({"SequenceNumber": sequence, "Data": data, "PartitionKey": key})
        return sequence

    def start_index(self, position: dict[str, Any]) -> int:
        kind = position["Type"]
        if kind in ("TRIM_HORIZON", "AT_TIMESTAMP"):  # every scripted record is "later"
            return 0
        if kind == "LATEST":
            return len(self.records)
        sequence = int(position["SequenceNumber"])
        numbers = [r["SequenceNumber"] for r in self.records]
        after = kind == "AFTER_SEQUENCE_NUMBER"
        return next(
            (i for i, n in enumerate(numbers) if n > sequence or (n == sequence and not after)),
            len(numbers),
        )


@dataclass
class Subscription:
    shard_id: str
    stream_id: int
    started: float
    taken_over: bool = False
    sent_bytes: int = 0
    events: int = 0
    done: bool = False


class _Connection(asyncio.Protocol):
    def __init__(self, server: EfoStandIn) -> None:
        self.server = server
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.transport: asyncio.Transport | None = None
        self.requests: dict[int, dict[str, Any]] = {}
        self.window = asyncio.Event()
        self.closed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()
        self.window.set()

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.requests[event.stream_id] = {"headers": dict(event.headers), "body": b""}
            elif isinstance(event, h2.events.DataReceived):
                self.requests[event.stream_id]["body"] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                request = self.requests.pop(event.stream_id)
                task = asyncio.ensure_future(self.server.serve(self, event.stream_id, request))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                self.window.set()
        self.flush()

    async def send(self, stream_id: int, data: bytes, subscription: Subscription | None) -> None:
        """Send ``data`` within HTTP/2 flow control: wait for window updates when it is used up."""
        while data:
            if self.closed.is_set():
                raise ConnectionError("client went away")
            window = min(self.h2.local_flow_control_window(stream_id), len(data))
            if window <= 0:
                self.server.flow_blocked += 1
                self.window.clear()
                await self.window.wait()
                continue
            chunk_size = min(window, self.h2.max_outbound_frame_size)
            self.h2.send_data(stream_id, data[:chunk_size])
            self.flush()
            if subscription is not None:
                subscription.sent_bytes += chunk_size
            data = data[chunk_size:]
            await asyncio.sleep(0)


class EfoStandIn:
    """SubscribeToShard on ``url`` (h2c, prior knowledge) for the scripted ``shards``.

    ``initial_response``: send AWS's initial-response event first. ``expire_after``: end each
    subscription normally after that many seconds (``expire_after_events``: after that many
    events). ``takeover_after``: a second subscription to
    a shard within that many seconds of the first gets ResourceInUse, later it takes over (the
    first gets a ResourceInUse exception event); None: always ResourceInUse (kinesis-local).
    ``reset_after_events``: reset the HTTP/2 stream after that many events. ``fail_with``:
    answer the next subscriptions with these ``(status, code)`` errors, one each.
    """

    def __init__(
        self,
        *,
        initial_response: bool = True,
        expire_after: float | None = None,
        expire_after_events: int | None = None,
        takeover_after: float | None = 5.0,
        reset_after_events: int | None = None,
        batch_size: int = 10,
        event_interval: float = 0.02,
    ) -> None:
        self.shards: dict[str, ScriptedShard] = {}
        self.initial_response = initial_response
        self.expire_after = expire_after
        self.expire_after_events = expire_after_events
        self.takeover_after = takeover_after
        self.reset_after_events = reset_after_events
        self.batch_size = batch_size
        self.event_interval = event_interval
        self.fail_with: list[tuple[int, str]] = []
        self.requests: list[dict[str, Any]] = []
        self.subscriptions: list[Subscription] = []
        self.flow_blocked = 0
        self._server: asyncio.Server | None = None
        self._connections: list[_Connection] = []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def open_subscriptions(self, shard_id: str) -> list[Subscription]:
        return [s for s in self.subscriptions if s.shard_id == shard_id and not s.done]

    async def __aenter__(self) -> EfoStandIn:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, LOOPBACK, 0)
        self.port: int = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        tasks = [task for connection in self._connections for task in connection.tasks]
        for connection in self._connections:
            if connection.transport is not None:
                connection.transport.abort()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _connection(self) -> _Connection:
        connection = _Connection(self)
        self._connections.append(connection)
        return connection

    async def serve(self, conn: _Connection, stream_id: int, request: dict[str, Any]) -> None:
        self.requests.append(request)
        body = json.loads(request["body"])
        shard = self.shards.get(body["ShardId"])
        refusal = self._refusal(body["ShardId"], shard)
        if refusal is not None:
            status, code = refusal
            payload = json.dumps({"__type": code, "message": f"scripted {code}"}).encode()
            headers = [(":status", str(status)), ("content-type", "application/x-amz-json-1.1")]
            conn.h2.send_headers(stream_id, headers)
            await conn.send(stream_id, payload, None)
            conn.h2.end_stream(stream_id)
            conn.flush()
            return
        assert shard is not None
        subscription = Subscription(body["ShardId"], stream_id, time.monotonic())
        self.subscriptions.append(subscription)
        try:
            await self._stream(conn, subscription, shard, body["StartingPosition"])
        except ConnectionError:
            pass
        finally:
            subscription.done = True

    def _refusal(self, shard_id: str, shard: ScriptedShard | None) -> tuple[int, str] | None:
        if self.fail_with:
            return self.fail_with.pop(0)
        if shard is None:
            return 400, "ResourceNotFoundException"
        for open_one in self.open_subscriptions(shard_id):
            age = time.monotonic() - open_one.started
            if self.takeover_after is None or age < self.takeover_after:
                return 400, "ResourceInUseException"
            open_one.taken_over = True
        return None

    async def _stream(
        self, conn: _Connection, sub: Subscription, shard: ScriptedShard, position: dict[str, Any]
    ) -> None:
        headers = [(":status", "200"), ("content-type", "application/vnd.amazon.eventstream")]
        conn.h2.send_headers(sub.stream_id, headers)
        conn.flush()

        def send(data: bytes) -> Awaitable[None]:
            return conn.send(sub.stream_id, data, sub)

        if self.initial_response:
            await send(event_message("initial-response", {}))
        index = shard.start_index(position)
        continuation = str(shard.records[index - 1]["SequenceNumber"]) if index else "0"
        while True:
            if sub.taken_over:
                await send(exception_message("ResourceInUseException", "taken over"))
                break
            if (
                self.expire_after is not None
                and time.monotonic() - sub.started >= self.expire_after
            ):
                break
            if self.expire_after_events is not None and sub.events >= self.expire_after_events:
                break
            if self.reset_after_events is not None and sub.events >= self.reset_after_events:
                conn.h2.reset_stream(sub.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                conn.flush()
                return
            batch = shard.records[index : index + self.batch_size]
            index += len(batch)
            if batch:
                continuation = str(batch[-1]["SequenceNumber"])
            ended = shard.closed and index >= len(shard.records)
            event: dict[str, Any] = {
                "Records": [_wire(r) for r in batch],
                "MillisBehindLatest": 0 if index >= len(shard.records) else 1000,
            }
            if ended:
                event["ChildShards"] = shard.child_shards or []
            else:
                event["ContinuationSequenceNumber"] = continuation
            await send(event_message("SubscribeToShardEvent", event))
            sub.events += 1
            if ended:
                break
            if not batch:
                await asyncio.sleep(self.event_interval)
        conn.h2.end_stream(sub.stream_id)
        conn.flush()


def _wire(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "SequenceNumber": str(record["SequenceNumber"]),
        "Data": base64.b64encode(record["Data"]).decode(),
        "PartitionKey": record["PartitionKey"],
        "ApproximateArrivalTimestamp": 1_700_000_000.5,
    }
