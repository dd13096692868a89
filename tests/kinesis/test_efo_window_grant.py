"""The subscription transport's connection window grant (kinesumer/kinesis/efo/transport.py),
frame by frame: the WINDOW_UPDATE h2 writes with the client preface is held back until the
server's first frame on a request stream has been read, then written; nothing else changes.
Real frames from ``h2`` on both sides; the network is an in-memory stream."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import httpcore

from kinesumer.kinesis.efo.transport import WINDOW_UPDATE, WindowGrantStream, frames


class MemoryStream(httpcore.AsyncNetworkStream):
    def __init__(self, incoming: list[bytes]) -> None:
        self.incoming = incoming
        self.written: list[bytes] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.incoming.pop(0) if self.incoming else b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.written.append(buffer)

    async def aclose(self) -> None:
        pass

    def get_extra_info(self, info: str) -> Any:
        return None


def kinds(data: bytes) -> list[tuple[int, int]]:
    return [(kind, stream) for kind, stream, _ in frames(data)]


async def test_the_preface_window_update_waits_for_the_response_headers() -> None:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.increment_flow_control_window(2**24)  # as httpcore does, right after the preface
    opening = client.data_to_send()
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    settings = server.data_to_send()
    server.receive_data(opening)
    request = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/")]
    client.send_headers(1, request, end_stream=True)
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(":status", "200")])
    headers = server.data_to_send()
    # The server's SETTINGS, then its response HEADERS split across two reads.
    inner = MemoryStream([settings, headers[:5], headers[5:]])
    stream = WindowGrantStream(inner)

    await stream.write(opening)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    assert inner.written[0].startswith(preface)
    assert (WINDOW_UPDATE, 0) not in kinds(inner.written[0][len(preface) :])
    assert await stream.read(65536) == settings  # a frame on stream 0: still held
    assert await stream.read(65536) == headers[:5]  # not a whole frame header yet
    assert len(inner.written) == 1
    assert await stream.read(65536) == headers[5:]
    assert kinds(inner.written[1]) == [(WINDOW_UPDATE, 0)]
    # Granted: from now on every write goes through as it is.
    await stream.write(opening[len(preface) :])
    assert inner.written[2] == opening[len(preface) :]
