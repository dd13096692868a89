"""The bytes of a read-ahead file (kinesumer.spark.source.executor.readahead_format): what the
worker reading ahead wrote comes back whole, its Arrow buffers aligned as Arrow requires; anything
else (a cut file, the previous kinesumer version's msgpack, garbage or another schema after a valid
header) is refused with :class:`UnreadableReadAhead`, never read as fewer records."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec
import pyarrow
import pytest

from kinesumer.models import Record
from kinesumer.spark.arrow import arrow_schema, records_to_arrow
from kinesumer.spark.source.executor.readahead_format import (
    LAYOUT,
    Header,
    UnreadableReadAhead,
    decode,
    encode,
)

SHARD = "shardId-000000000000"
#: A Kinesis sequence number: 56 digits.
AFTER = ("4959" + "0" * 52, 3)


def records(count: int, first: int = 0) -> list[Record]:
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [
        Record(
            "s",
            SHARD,
            str(10**55 + n),
            n % 3,
            f"k{n}",
            b"x" * (n % 5),
            None if n % 4 == 0 else start + timedelta(milliseconds=n),
        )
        for n in range(first, first + count)
    ]


def header(stream: str = "s", layout: str = LAYOUT) -> Header:
    return Header(layout, stream, SHARD, AFTER, True, True, 0, "run")


def ipc(table: pyarrow.Table) -> bytes:
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def refused(data: bytes) -> bool:
    try:
        decode(data)
    except UnreadableReadAhead:
        return True
    return False


@pytest.mark.parametrize("stream", ["s" * n for n in range(1, 9)])
def test_the_rows_come_back_whole_with_their_buffers_aligned(stream: str) -> None:
    """Zero-copy from the file's bytes: the IPC stream started wherever the header ended, so the
    int64 and timestamp buffers sat at any address (Arrow requires multiples of 8; its kernels
    read them as such)."""
    table = records_to_arrow(records(50))
    got, rows = decode(encode(header(stream), table))
    assert (got.layout, got.stream, got.shard_id, tuple(got.after)) == (
        LAYOUT,
        stream,
        SHARD,
        AFTER,
    )
    assert rows.equals(table) and rows.schema.equals(arrow_schema())
    buffers = [b for column in rows.columns for c in column.chunks for b in c.buffers() if b]
    assert buffers and all(b.address % 8 == 0 for b in buffers)


def test_a_file_cut_anywhere_is_refused() -> None:
    """A cut at the end of a record batch message left a valid stream (the end-of-stream mark is
    optional): it read as the records before the cut, with the whole read's caught-up and
    SHARD_END. Two batches here; a cut IPC message once raised OSError, not the refusal."""
    table = pyarrow.concat_tables([records_to_arrow(records(20)), records_to_arrow(records(9, 20))])
    data = encode(header(), table)
    assert decode(data)[1].equals(table)
    kept = [cut for cut in range(len(data)) if not refused(data[:cut])]
    # Only a cut in the end-of-stream mark (the last 8 bytes) may be read: it loses no record.
    assert all(cut >= len(data) - 8 and decode(data[:cut])[1].equals(table) for cut in kept)


def test_the_previous_versions_msgpack_records_are_refused() -> None:
    class Stored(msgspec.Struct, array_like=True):  # kinesumer 0.x's read-ahead file
        stream: str
        shard_id: str
        after: tuple[str, int]
        caught_up: bool
        shard_end: bool
        millis_behind: int | None
        run: str
        records: list[Record]

    for stream in ("s", "st", "a-stream", "x" * 300):
        old = Stored(stream, SHARD, AFTER, True, False, 5, "run", records(10))
        assert refused(msgspec.msgpack.encode(old))


def test_garbage_or_another_schema_after_a_valid_header_is_refused() -> None:
    head = msgspec.msgpack.encode(header())
    table = records_to_arrow(records(2))
    nullable = pyarrow.schema([f.with_nullable(True) for f in arrow_schema()])
    bodies = [
        b"",
        b"\x00" * 40,
        b"\xff\xff\xff\xff" + b"\x10\x00\x00\x00" + b"\x01" * 64,  # continuation, bad message
        b"\xff\xff\xff\xff" + b"\xfe\xff\xff\xff",  # negative length
        ipc(pyarrow.table({"a": [1, 2]})),
        ipc(table.cast(nullable)),
    ]
    for body in bodies:
        for pad in range(8):  # wherever the body is taken to start
            assert refused(len(head).to_bytes(4, "big") + head + b"\x00" * pad + body)
    assert refused(encode(header(layout="kinesumer-read-ahead-arrow-0"), table))
    assert refused(b"") and refused(b"\x00\x00")
