"""The HTTP/2 transport of subscriptions: httpx over httpcore and h2, with the connection's flow
control window granted after the response headers instead of with the client preface.

Why: kinesis-mock's HTTP/2 server (http4s ember; kinesis-local and LocalStack serve Kinesis with
it) ignores a connection-level WINDOW_UPDATE that arrives with the client's preface and SETTINGS,
which is where httpcore sends its 16 MiB grant. Its connection send window then stays at 64 KiB
while h2, believing it granted 16 MiB, sends no other update before 8 MiB arrived: every
subscription stalls once 64 KiB went through (at once for any event over 64 KiB) until the read
times out. The same update sent after the response headers is honoured
(tests/kinesis/test_efo_large_events.py pins both).

:class:`WindowGrantBackend` wraps httpcore's own network backend: it holds back a
WINDOW_UPDATE on stream 0 written before the server's first frame on a request stream (the
response HEADERS), and writes it as soon as that frame is read. Nothing else changes: the same
frames, the same bytes, in the same connection; a server sends no DATA before its response
headers, so a grant that waits for them costs nothing on AWS (which honours either).

:class:`Http2Transport` is httpx's transport over an httpcore pool with that backend (httpx
takes no backend of its own), with httpcore's errors mapped to httpx's as httpx does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore
import httpx

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
WINDOW_UPDATE = 0x8

#: httpcore's errors and the httpx errors callers catch (httpx maps them the same way).
ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProxyError, httpx.ProxyError),
)


def mapped(exc: Exception) -> Exception:
    """httpx's error for an httpcore one (the same class names); anything else unchanged."""
    for core, public in ERRORS:
        if isinstance(exc, core):
            return public(str(exc))
    if isinstance(exc, (httpcore.NetworkError, httpcore.ProtocolError)):
        return httpx.TransportError(str(exc))
    return exc


def frames(data: bytes) -> Iterable[tuple[int, int, bytes]]:
    """(type, stream id, whole frame) of each frame in ``data``; raises ValueError when
    ``data`` does not hold whole frames."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < FRAME_HEADER:
            raise ValueError("partial frame header")
        end = pos + FRAME_HEADER + int.from_bytes(data[pos : pos + 3], "big")
        if end > len(data):
            raise ValueError("partial frame")
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        yield data[pos + 3], stream, data[pos:end]
        pos = end


class WindowGrantStream(httpcore.AsyncNetworkStream):
    """One connection: holds back connection-level WINDOW_UPDATEs until the server's first
    frame on a request stream was read, then passes everything through."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._granted = False
        self._held: list[bytes] = []
        self._lock = asyncio.Lock()
        #: Incoming parse state until the grant: bytes of a partial frame header, and how many
        #: bytes of the current frame's payload are still to come.
        self._header = b""
        self._payload_left = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._inner.read(max_bytes, timeout)
        if not self._granted and self._request_frame_in(data):
            self._granted = True
            held, self._held = b"".join(self._held), []
            if held:
                async with self._lock:
                    await self._inner.write(held, timeout)
        return data

    def _request_frame_in(self, data: bytes) -> bool:
        """Whether ``data`` starts a frame on a stream other than 0 (parsing frame by frame
        across reads)."""
        pos = 0
        while pos < len(data):
            if self._payload_left:
                step = min(self._payload_left, len(data) - pos)
                self._payload_left -= step
                pos += step
                continue
            need = FRAME_HEADER - len(self._header)
            self._header += data[pos : pos + need]
            pos += need
            if len(self._header) < FRAME_HEADER:
                return False
            header, self._header = self._header, b""
            if int.from_bytes(header[5:9], "big") & 0x7FFFFFFF:
                return True
            self._payload_left = int.from_bytes(header[:3], "big")
        return False

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not self._granted:
            buffer = self._hold_window_updates(buffer)
        if buffer:
            async with self._lock:
                await self._inner.write(buffer, timeout)

    def _hold_window_updates(self, buffer: bytes) -> bytes:
        start = len(PREFACE) if buffer.startswith(PREFACE) else 0
        try:
            parsed = list(frames(buffer[start:]))
        except ValueError:
            return buffer  # not whole frames (h2 writes whole ones): leave it alone
        kept = [buffer[:start]]
        for kind, stream, frame in parsed:
            if kind == WINDOW_UPDATE and stream == 0:
                self._held.append(frame)
            else:
                kept.append(frame)
        return b"".join(kept)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return WindowGrantStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class WindowGrantBackend(httpcore.AsyncNetworkBackend):
    """httpcore's backend (asyncio or trio, as httpx picks) with :class:`WindowGrantStream`
    connections."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return WindowGrantStream(inner)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return WindowGrantStream(
            await self._inner.connect_unix_socket(path, timeout, socket_options)
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class ResponseBody(httpx.AsyncByteStream):
    """httpcore's response stream as httpx's, with errors mapped."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except Exception as exc:
            raise mapped(exc) from exc

    async def aclose(self) -> None:
        closer = getattr(self._stream, "aclose", None)
        if closer is not None:
            await closer()


class Http2Transport(httpx.AsyncBaseTransport):
    """httpx's transport for subscriptions: HTTP/2 only (prior knowledge on ``http://``, ALPN
    on ``https://``), over :class:`WindowGrantBackend`."""

    def __init__(self, ssl_context: Any) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            http1=False,
            http2=True,
            network_backend=WindowGrantBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core)
        except Exception as exc:
            raise mapped(exc) from exc
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=ResponseBody(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
