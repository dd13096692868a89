"""The bytes of a read-ahead file (:mod:`.readahead`): a msgpack header saying whose records
they are and how the read ended, then the records as an Arrow IPC stream in Spark's schema.

Arrow, not the records themselves: the worker reading ahead builds the Arrow table the task
would have built, in the background, and the task hands a slice of it to Spark as it is. Records
stored as msgpack had to be decoded back into records and then built into Arrow by the task:
about 0.1 CPU-s per 100k records more than reading for itself (measured in
``docs/measured.md``). Data only, never code (no pickle): the files are in a folder this user
alone can open, and are checked as if they were not.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..arrow import arrow_schema
from ..deps import require_pyarrow

if TYPE_CHECKING:
    import pyarrow

#: The layout's name, first in the header: a file another kinesumer version wrote (a query
#: restarted with the same id finds its previous run's files) is refused, not misread.
LAYOUT = "kinesumer-read-ahead-arrow-1"


class Header(msgspec.Struct, array_like=True):
    layout: str
    stream: str
    shard_id: str
    after: tuple[str, int]
    caught_up: bool
    shard_end: bool
    millis_behind: int | None
    # The query run that read it ahead (a token the driver makes per run: no clocks).
    run: str


class UnreadableReadAhead(ValueError):
    """A read-ahead file that is not this layout, or damaged."""


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Header)
_LENGTH_BYTES = 4


def write(path: Path, header: Header, rows: pyarrow.Table) -> None:
    """``header`` and ``rows`` (in :func:`~kinesumer.spark.arrow.arrow_schema`) as the file
    ``path``, streamed into it (building the bytes first cost two more copies of them: twice the
    CPU of the write itself, measured)."""
    pa = require_pyarrow()
    head = _ENCODER.encode(header)
    with pa.OSFile(str(path), "wb") as file:
        file.write(len(head).to_bytes(_LENGTH_BYTES, "big") + head)
        with pa.ipc.new_stream(file, rows.schema) as writer:
            writer.write_table(rows)


def decode(data: bytes) -> tuple[Header, pyarrow.Table]:
    """What :func:`write` wrote; :class:`UnreadableReadAhead` for anything else."""
    pa = require_pyarrow()
    length = int.from_bytes(data[:_LENGTH_BYTES], "big")
    try:
        header = _DECODER.decode(data[_LENGTH_BYTES : _LENGTH_BYTES + length])
        if header.layout != LAYOUT:
            raise UnreadableReadAhead(f"layout {header.layout!r}, not {LAYOUT!r}")
        body = pa.py_buffer(data)[_LENGTH_BYTES + length :]
        rows = pa.ipc.open_stream(body).read_all()
    except (msgspec.DecodeError, pa.ArrowException) as error:
        raise UnreadableReadAhead(str(error)) from error
    if not rows.schema.equals(arrow_schema()):  # Spark takes nothing else
        raise UnreadableReadAhead(f"schema {rows.schema}, not the records' Arrow schema")
    return header, rows
