"""The bytes of a read-ahead file (:mod:`.readahead`): a msgpack header saying whose records
they are, how many, and how the read ended, then the records as an Arrow IPC stream in Spark's
schema, from the next multiple of 8 bytes (zeros between).

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

from ...arrow import arrow_schema
from ...deps import require_pyarrow

if TYPE_CHECKING:
    import pyarrow

#: The layout's name, first in the header: a file another kinesumer version wrote (a query
#: restarted with the same id finds its previous run's files) is refused, not misread.
LAYOUT = "kinesumer-read-ahead-arrow-2"


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
    # The records' number, set by :func:`encode`: an IPC stream cut after a record batch
    # message is a valid stream (its end mark is optional) of fewer records.
    count: int = 0


class UnreadableReadAhead(ValueError):
    """A read-ahead file that is not this layout, or damaged."""


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Header)
_LENGTH_BYTES = 4
#: Where the IPC stream starts: the table is read from the file's bytes without a copy, and
#: Arrow lays its buffers out at multiples of 8 and reads int64s and timestamps as aligned
#: (pyarrow does not realign by default; the bytes object's own start is a multiple of 8).
_ALIGNMENT = 8


def _body_at(head_length: int) -> int:
    end = _LENGTH_BYTES + head_length
    return end + -end % _ALIGNMENT


def write(path: Path, header: Header, rows: pyarrow.Table) -> None:
    """``header`` and ``rows`` (in :func:`~kinesumer.spark.arrow.arrow_schema`) as the file
    ``path``, streamed into it (building the bytes first cost two more copies of them: twice the
    CPU of the write itself, measured)."""
    with require_pyarrow().OSFile(str(path), "wb") as file:
        _write_to(file, header, rows)


def encode(header: Header, rows: pyarrow.Table) -> bytes:
    """The bytes :func:`write` puts in a file."""
    sink = require_pyarrow().BufferOutputStream()
    _write_to(sink, header, rows)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _write_to(sink: pyarrow.NativeFile, header: Header, rows: pyarrow.Table) -> None:
    pa = require_pyarrow()
    head = _ENCODER.encode(msgspec.structs.replace(header, count=rows.num_rows))
    padding = bytes(_body_at(len(head)) - _LENGTH_BYTES - len(head))
    sink.write(len(head).to_bytes(_LENGTH_BYTES, "big") + head + padding)
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)


def decode(data: bytes) -> tuple[Header, pyarrow.Table]:
    """What :func:`write` wrote; :class:`UnreadableReadAhead` for anything else."""
    pa = require_pyarrow()
    length = int.from_bytes(data[:_LENGTH_BYTES], "big")
    try:
        header = _DECODER.decode(data[_LENGTH_BYTES : _LENGTH_BYTES + length])
        if header.layout != LAYOUT:
            raise UnreadableReadAhead(f"layout {header.layout!r}, not {LAYOUT!r}")
        body = pa.py_buffer(data)[_body_at(length) :]
        rows = pa.ipc.open_stream(body).read_all()
    # OSError: pyarrow's ArrowIOError (a message cut short, an invalid one) is not an
    # ArrowException.
    except (msgspec.DecodeError, pa.ArrowException, OSError) as error:
        raise UnreadableReadAhead(str(error)) from error
    if not rows.schema.equals(arrow_schema()):  # Spark takes nothing else
        raise UnreadableReadAhead(f"schema {rows.schema}, not the records' Arrow schema")
    if rows.num_rows != header.count:
        raise UnreadableReadAhead(f"{rows.num_rows} records, not the {header.count} written")
    return header, rows
