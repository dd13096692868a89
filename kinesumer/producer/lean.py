"""A lean PutRecords: the producer builds the JSON body itself and reads the answer's records
itself, while botocore still does everything else (endpoint, SigV4 signing, HTTP, retries of
whole calls, error parsing).

Why: botocore validates, serializes (base64 included) and parses a PutRecords call shape by
shape, record by record: about three quarters of the producer's CPU per record went there
(profiled: ``validate``, ``serialize``, ``parsers``). A call's body is plain JSON (Kinesis'
``x-amz-json-1.1`` protocol), which :func:`json.dumps` builds in C from ready entries.

How, through botocore's public events on the producer's own client only:

- the call is made with its first entry alone (botocore validates and serializes that one);
  ``before-call.kinesis.PutRecords`` then replaces the serialized body with the whole call's,
  before the request is built and signed, so the signature covers the real body;
- ``before-parse.kinesis.PutRecords``, for a successful (HTTP 200) answer, decodes the JSON once
  and hands botocore an empty body to parse; the decoded ``FailedRecordCount`` and ``Records``
  (the same names and string values botocore would return) become the response.

The body travels in a context variable set by :func:`put_records` around the call: each call
runs in its own task, whose context the handlers see. A client whose protocol is not JSON (a
future botocore might speak CBOR to Kinesis) is left alone: :func:`install` says so and
:func:`put_records` falls back to the ordinary call.
"""

from __future__ import annotations

import json
import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batching import Entry

_BODY: ContextVar[bytes | None] = ContextVar("kinesumer_put_records_body", default=None)
#: Clients whose PutRecords calls go leanly (:func:`install` registered the handlers).
_LEAN_CLIENTS: weakref.WeakSet[Any] = weakref.WeakSet()


def install(client: Any) -> bool:
    """Register the handlers on ``client`` (the producer's own); False: not a JSON client."""
    model = client.meta.service_model
    protocol = getattr(model, "resolved_protocol", None) or model.protocol
    if protocol != "json":
        return False
    client.meta.events.register("before-call.kinesis.PutRecords", _swap_body)
    client.meta.events.register("before-parse.kinesis.PutRecords", _read_answer)
    _LEAN_CLIENTS.add(client)
    return True


def request_body(stream: str, wire_entries: list[dict[str, str]]) -> bytes:
    """The PutRecords JSON body for entries already in wire form (base64 ``Data``)."""
    return json.dumps(
        {"StreamName": stream, "Records": wire_entries}, separators=(",", ":")
    ).encode("utf-8")


async def put_records(client: Any, stream: str, entries: list[Entry]) -> dict[str, Any]:
    """Call PutRecords with ``entries``: leanly when :func:`install` succeeded on ``client``,
    else the ordinary way."""
    response: dict[str, Any]
    if client not in _LEAN_CLIENTS:
        requests = [entry.request() for entry in entries]
        response = await client.put_records(StreamName=stream, Records=requests)
        return response
    token = _BODY.set(request_body(stream, [entry.wire() for entry in entries]))
    try:
        response = await client.put_records(StreamName=stream, Records=[entries[0].request()])
    finally:
        _BODY.reset(token)
    return response


def _swap_body(params: dict[str, Any], **_: Any) -> None:
    body = _BODY.get()
    if body is not None:
        params["body"] = body


def _read_answer(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any
) -> None:
    if _BODY.get() is None or response_dict.get("status_code") != 200:
        return  # errors go through botocore's own parser (codes, messages, retries)
    body = response_dict.get("body")
    if not isinstance(body, (bytes, bytearray)) or not body:
        return
    answer = json.loads(body)
    if not isinstance(answer, dict) or not isinstance(answer.get("Records"), list):
        return  # not the answer we know: botocore parses it
    customized_response_dict["FailedRecordCount"] = answer.get("FailedRecordCount", 0)
    customized_response_dict["Records"] = answer["Records"]
    if "EncryptionType" in answer:
        customized_response_dict["EncryptionType"] = answer["EncryptionType"]
    response_dict["body"] = b"{}"
