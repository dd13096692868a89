"""EventFrames, the subscriber's event-stream splitter: messages split across reads at any byte
boundary come out whole and once, a broken checksum or an impossible length is a ParserError
(the subscriber's reset) before anything is buffered for it, a truncated message waits."""

from __future__ import annotations

import itertools
import struct
import zlib

import pytest
from botocore.eventstream import ParserError
from hypothesis import given, settings
from hypothesis import strategies as st

from kinesumer.kinesis.efo.subscriber import MAX_MESSAGE, EventFrames


def message(event_type: str, payload: bytes) -> bytes:
    """One event-stream message as AWS frames it (a string header, the payload, two CRCs)."""
    headers = b""
    for name, value in ((":event-type", event_type), (":message-type", "event")):
        raw = value.encode()
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack("!H", len(raw)) + raw
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack("!II", total, len(headers))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    body = prelude + headers + payload
    return body + struct.pack("!I", zlib.crc32(body))


MESSAGES = [message("SubscribeToShardEvent", b'{"n":%d}' % i) for i in range(3)]
WIRE = b"".join(MESSAGES)


def feed(chunks: list[bytes]) -> list[bytes]:
    """The payloads EventFrames gives for ``chunks`` read one by one."""
    frames, got = EventFrames(), []
    for chunk in chunks:
        frames.add_data(chunk)
        got.extend(m.payload for m in frames)
    return got


def test_a_message_split_at_every_byte_boundary_arrives_whole_and_once() -> None:
    expected = [b'{"n":%d}' % i for i in range(3)]
    for cut in range(len(WIRE) + 1):
        assert feed([WIRE[:cut], WIRE[cut:]]) == expected, cut
    assert feed([bytes([b]) for b in WIRE]) == expected  # one byte a read


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(WIRE)), max_size=12))
def test_any_chunking_gives_the_same_messages(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(WIRE)]
    chunks = [WIRE[a:b] for a, b in itertools.pairwise(points)]
    assert feed(chunks) == [b'{"n":%d}' % i for i in range(3)]
    frames = EventFrames()
    frames.add_data(WIRE[:-1])  # truncated: the last message waits for its last byte
    assert len(list(frames)) == 2


@pytest.mark.parametrize("where", [4, 9, len(MESSAGES[0]) - 2, 20])
def test_a_corrupted_byte_is_a_parser_error(where: int) -> None:
    """Prelude (length or its CRC), message CRC, headers: every byte is covered by a CRC."""
    broken = bytearray(WIRE)
    broken[where] ^= 0x01
    frames = EventFrames()
    frames.add_data(bytes(broken))
    with pytest.raises(ParserError):
        list(frames)


def test_an_impossible_length_is_refused_before_the_message_is_buffered() -> None:
    """A prelude claiming more than MAX_MESSAGE (or less than its own parts) is refused from
    its first 12 bytes: nothing waits to buffer gigabytes."""
    for total, headers in ((MAX_MESSAGE + 1, 0), (2**32 - 1, 0), (15, 0), (40, 30)):
        prelude = struct.pack("!II", total, headers)
        frames = EventFrames()
        frames.add_data(prelude + struct.pack("!I", zlib.crc32(prelude)))
        with pytest.raises(ParserError):
            list(frames)
