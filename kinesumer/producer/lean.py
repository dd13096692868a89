"""The producer's lean PutRecords: its entries in the wire form the shared lean-call module
(:mod:`kinesumer.kinesis.lean`) sends as the call's body, botocore still signing and sending it.

Why and how: see :mod:`kinesumer.kinesis.lean` (botocore's per-entry validation, serialization
and parsing were about three quarters of the producer's CPU per record). A client the lean path
cannot serve (not a JSON client) gets the ordinary call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..kinesis import lean
from ..kinesis.lean import install, is_lean

if TYPE_CHECKING:
    from .batching import Entry

__all__ = ["install", "is_lean", "put_records", "request_body"]

request_body = lean.put_records_body


async def put_records(client: Any, stream: str, entries: list[Entry]) -> dict[str, Any]:
    """Call PutRecords with ``entries``: leanly when :func:`install` succeeded on ``client``,
    else the ordinary way."""
    response: dict[str, Any]
    if not is_lean(client):
        requests = [entry.request() for entry in entries]
        response = await client.put_records(StreamName=stream, Records=requests)
        return response
    body = request_body(stream, [entry.wire() for entry in entries])
    return await lean.put_records(client, stream, entries[0].request(), body)
