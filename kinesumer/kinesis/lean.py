"""Lean Kinesis calls: PutRecords with a body kinesumer builds itself, GetRecords with an answer
kinesumer decodes itself; botocore still does everything else (endpoint, SigV4 signing, HTTP,
retries of whole calls, error parsing and error codes). One module for the producer and the
readers (the engine's fetchers, the Spark executors).

Why: botocore validates, serializes and parses these calls shape by shape, record by record
(base64 per record, a timestamp parser per record, a dict per record). That was about three
quarters of the producer's CPU per record, and most of a reader's: a call's body and answer are
plain JSON (Kinesis' ``x-amz-json-1.1`` protocol), which :func:`json.dumps` builds in C and
:mod:`msgspec` decodes in C, base64 ``Data`` into ``bytes`` and epoch timestamps into aware
datetimes included.

How, through botocore's public events on clients :func:`install` was given:

- PutRecords is made with its first entry alone (botocore validates and serializes that one);
  ``before-call.kinesis.PutRecords`` then replaces the serialized body with the whole call's,
  before the request is built and signed, so the signature covers the real body;
- ``before-parse.kinesis.<operation>``, for a successful (HTTP 200) answer, decodes the JSON once
  and hands botocore an empty body to parse. PutRecords' ``FailedRecordCount`` and ``Records``
  (the names and string values botocore would return) become the response; GetRecords' decoded
  answer (:class:`RecordsAnswer`) is handed to the caller directly. An answer the decoder does
  not accept (not the shape Kinesis documents) is left to botocore, the reference. A GetRecords
  answer that botocore's parse shows is not Kinesis's either (a gateway's HTML page, a garbled
  body, JSON without ``Records``: botocore parses each into no members at all, which would
  read as "no next iterator", the shard's end) raises
  :class:`~kinesumer.aws.retry.MalformedAnswer`, a transient error the readers retry.

What a call needs travels in a context variable set around the call: each call runs in its own
task, whose context the handlers see, so the same client's other calls (a user's own client, say)
are untouched. A client whose protocol is not JSON (a future botocore might speak CBOR to
Kinesis) is left alone: :func:`install` says so and the calls fall back to the ordinary ones.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

from ..aws.retry import MalformedAnswer

log = logging.getLogger("kinesumer.kinesis")


class PutEntry(msgspec.Struct, omit_defaults=True, gc=False):
    """One PutRecords entry as it goes in the call's body (``Data`` encoded to base64)."""

    Data: bytes
    PartitionKey: str
    ExplicitHashKey: str | None = None


class _PutBody(msgspec.Struct, gc=False):
    StreamName: str
    Records: list[PutEntry]


class RawRecord(msgspec.Struct, gc=False):
    """One Kinesis record of a GetRecords answer, as the readers need it. ``gc=False``: its
    fields are text, bytes and a datetime, which cannot form a cycle; 10,000 of them per answer
    would otherwise each be tracked (and walked) by the cyclic garbage collector."""

    SequenceNumber: str
    PartitionKey: str
    Data: bytes
    ApproximateArrivalTimestamp: datetime | None = None


class EpochRawRecord(msgspec.Struct, gc=False):
    """:class:`RawRecord` with the arrival time as the answer holds it: epoch seconds (a float).
    The Spark executors build the Arrow column from these in C; a datetime per record, made by
    the decoder and then taken apart again by Arrow, was a third of their Arrow building."""

    SequenceNumber: str
    PartitionKey: str
    Data: bytes
    ApproximateArrivalTimestamp: float | None = None


#: The record type an answer is decoded into.
AnyRawRecord = TypeVar("AnyRawRecord", RawRecord, EpochRawRecord)


class RecordsAnswer(msgspec.Struct, Generic[AnyRawRecord], gc=False):
    """A GetRecords answer: what the readers use of it (``ChildShards`` as botocore gives it).

    ``Records`` is required, as Kinesis's API model has it: a body without it is not a Kinesis
    answer, and with a default even ``{}`` would decode as "no next iterator", an open shard's
    end. Checked by the decoder itself, once per answer (:func:`well_formed` checks botocore's
    parse the same way). ``MillisBehindLatest`` is optional in the model, though Kinesis,
    kinesalite, kinesis-local and moto send it in every answer: one without it is taken, its lag
    unknown (an "end" it brings is still confirmed by the reader)."""

    Records: list[AnyRawRecord]
    MillisBehindLatest: int | None = None
    NextShardIterator: str | None = None
    ChildShards: list[dict[str, Any]] | None = None


#: ``strict=False``: an epoch-seconds number decodes to a UTC datetime, the instant botocore's
#: timestamp parser gives (it picks the local zone; aware datetimes compare by instant).
_DECODE_RECORDS = msgspec.json.Decoder(RecordsAnswer[RawRecord], strict=False).decode
_DECODE_EPOCH = msgspec.json.Decoder(RecordsAnswer[EpochRawRecord], strict=False).decode
_ENCODE = msgspec.json.Encoder().encode
_DECODE_ANY = msgspec.json.Decoder().decode


class _AnswerSlot:
    """Where a GetRecords call's decoded answer is left, in the form the caller wants."""

    __slots__ = ("answers", "epoch", "epoch_answers")

    def __init__(self, epoch: bool) -> None:
        self.epoch = epoch
        self.answers: list[RecordsAnswer[RawRecord]] = []
        self.epoch_answers: list[RecordsAnswer[EpochRawRecord]] = []


_PUT_BODY: ContextVar[bytes | None] = ContextVar("kinesumer_put_records_body", default=None)
_GET_SLOT: ContextVar[_AnswerSlot | None] = ContextVar("kinesumer_get_records_answer", default=None)
#: Clients whose PutRecords and GetRecords calls go leanly (:func:`install` registered them).
_LEAN_CLIENTS: weakref.WeakSet[Any] = weakref.WeakSet()
#: Successful answers the lean decoders refused (handed to botocore), by operation.
_refusals: dict[str, int] = {}
_refusals_lock = threading.Lock()


def refused_answers() -> dict[str, int]:
    """How many successful answers, by operation (``GetRecords``, ``PutRecords``), this
    process's lean decoders did not accept and handed to botocore's parser instead. Each such
    answer still gives botocore's result, only slower; the 1st, 10th, 100th... are logged as
    warnings (with the reason), since a steady count means the answers changed shape."""
    with _refusals_lock:
        return dict(_refusals)


def _refused(operation: str, reason: Callable[[], str]) -> None:
    with _refusals_lock:
        count = _refusals[operation] = _refusals.get(operation, 0) + 1
    if str(count).strip("0") == "1":  # 1, 10, 100, ...: a changed shape is seen, not a flood
        log.warning(
            "a %s answer is not in the shape kinesumer's lean decoder knows (%s): botocore "
            "parsed it instead (%d such answers in this process so far); the result is "
            "botocore's, only slower.%s",
            operation,
            reason(),
            count,
            " Set KINESUMER_BOTOCORE_GET_RECORDS=1 to skip the lean decoder for GetRecords."
            if operation == "GetRecords"
            else "",
        )


def install(client: Any) -> bool:
    """Register the handlers on ``client`` (once; again is a no-op); False: not a JSON client,
    whose calls then go the ordinary way."""
    try:
        if client in _LEAN_CLIENTS:
            return True
    except TypeError:  # not weakly referenceable: not a botocore client
        return False
    model = getattr(getattr(client, "meta", None), "service_model", None)
    protocol = getattr(model, "resolved_protocol", None) or getattr(model, "protocol", None)
    if protocol != "json":
        return False
    client.meta.events.register("before-call.kinesis.PutRecords", _swap_body)
    client.meta.events.register("before-parse.kinesis.PutRecords", _read_put_answer)
    client.meta.events.register("before-parse.kinesis.GetRecords", _read_get_answer)
    _LEAN_CLIENTS.add(client)
    return True


def is_lean(client: Any) -> bool:
    """Whether :func:`install` succeeded on ``client``."""
    try:
        return client in _LEAN_CLIENTS
    except TypeError:
        return False


def put_records_body(stream: str, entries: list[PutEntry]) -> bytes:
    """The PutRecords JSON body of ``entries``."""
    return _ENCODE(_PutBody(stream, entries))


async def put_records(
    client: Any, stream: str, first: dict[str, object], body: bytes
) -> dict[str, Any]:
    """PutRecords with ``body`` (:func:`put_records_body`) on a client :func:`install`
    succeeded on; ``first``: the call's first entry as botocore takes it (validated)."""
    token = _PUT_BODY.set(body)
    try:
        response: dict[str, Any] = await client.put_records(StreamName=stream, Records=[first])
    finally:
        _PUT_BODY.reset(token)
    return response


async def get_records(client: Any, iterator: str, limit: int) -> RecordsAnswer[RawRecord]:
    """GetRecords, decoded by :mod:`msgspec` on a client :func:`install` succeeded on, by
    botocore otherwise (or when the answer is not the documented shape). Errors are botocore's
    ``ClientError`` either way, and :class:`MalformedAnswer` for an answer that is not Kinesis's
    (:func:`well_formed`)."""
    if not is_lean(client):
        return from_botocore(await client.get_records(ShardIterator=iterator, Limit=limit))
    slot = _AnswerSlot(epoch=False)
    response = await _get(slot, client, iterator, limit)
    return slot.answers[-1] if slot.answers else from_botocore(response)


async def get_epoch_records(
    client: Any, iterator: str, limit: int
) -> RecordsAnswer[EpochRawRecord]:
    """:func:`get_records` with arrival times as epoch seconds (:class:`EpochRawRecord`)."""
    if not is_lean(client):
        response = await client.get_records(ShardIterator=iterator, Limit=limit)
        return epoch_answer(from_botocore(response))
    slot = _AnswerSlot(epoch=True)
    response = await _get(slot, client, iterator, limit)
    return slot.epoch_answers[-1] if slot.epoch_answers else epoch_answer(from_botocore(response))


async def _get(slot: _AnswerSlot, client: Any, iterator: str, limit: int) -> dict[str, Any]:
    """GetRecords with ``slot`` for the lean decoder's answer (left empty if it refused it:
    then botocore's parse of it is returned)."""
    token = _GET_SLOT.set(slot)
    try:
        response: dict[str, Any] = await client.get_records(ShardIterator=iterator, Limit=limit)
    finally:
        _GET_SLOT.reset(token)
    return response


def well_formed(response: dict[str, Any]) -> dict[str, Any]:
    """``response``, botocore's parse of a GetRecords answer, if it is a Kinesis answer:
    ``Records`` a list (the model's one required member), ``MillisBehindLatest`` a number if
    there. Else :class:`MalformedAnswer` (transient): botocore parses a body that is not JSON,
    or JSON of another shape, into none of the members, which must not read as the shard's
    end."""
    lag = response.get("MillisBehindLatest")
    if isinstance(response.get("Records"), list) and (lag is None or isinstance(lag, int)):
        return response
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    raise MalformedAnswer(
        f"a GetRecords answer without Records (content-type "
        f"{headers.get('content-type')!r}; a proxy's or gateway's page, or a garbled body?)"
    )


def from_botocore(response: dict[str, Any]) -> RecordsAnswer[RawRecord]:
    """The answer botocore parsed, in the form the lean decoder gives; :class:`MalformedAnswer`
    if it is not a Kinesis answer (:func:`well_formed`)."""
    well_formed(response)
    return RecordsAnswer[RawRecord](
        Records=[
            RawRecord(
                r["SequenceNumber"],
                r["PartitionKey"],
                r["Data"],
                r.get("ApproximateArrivalTimestamp"),
            )
            for r in response.get("Records", [])
        ],
        MillisBehindLatest=response.get("MillisBehindLatest"),
        NextShardIterator=response.get("NextShardIterator"),
        ChildShards=response.get("ChildShards"),
    )


def epoch_answer(answer: RecordsAnswer[RawRecord]) -> RecordsAnswer[EpochRawRecord]:
    """``answer`` with its arrival times as epoch seconds (botocore's answers, the rare path)."""
    return RecordsAnswer[EpochRawRecord](
        Records=[
            EpochRawRecord(
                r.SequenceNumber,
                r.PartitionKey,
                r.Data,
                None
                if r.ApproximateArrivalTimestamp is None
                else r.ApproximateArrivalTimestamp.timestamp(),
            )
            for r in answer.Records
        ],
        MillisBehindLatest=answer.MillisBehindLatest,
        NextShardIterator=answer.NextShardIterator,
        ChildShards=answer.ChildShards,
    )


def decode_records_answer(body: bytes) -> RecordsAnswer[RawRecord] | None:
    """A GetRecords answer's body decoded; None when it is not the shape Kinesis documents."""
    try:
        return _DECODE_RECORDS(body)
    except (msgspec.DecodeError, ValueError):
        return None


def decode_epoch_answer(body: bytes) -> RecordsAnswer[EpochRawRecord] | None:
    """:func:`decode_records_answer` with arrival times as epoch seconds."""
    try:
        return _DECODE_EPOCH(body)
    except (msgspec.DecodeError, ValueError):
        return None


def _swap_body(params: dict[str, Any], **_: Any) -> None:
    body = _PUT_BODY.get()
    if body is not None:
        params["body"] = body


def _successful_body(response_dict: dict[str, Any]) -> bytes | None:
    if response_dict.get("status_code") != 200:
        return None  # errors go through botocore's own parser (codes, messages, retries)
    body = response_dict.get("body")
    if not isinstance(body, (bytes, bytearray)) or not body:
        return None
    return bytes(body)


def _read_put_answer(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any
) -> None:
    if _PUT_BODY.get() is None:
        return
    body = _successful_body(response_dict)
    if body is None:
        return
    try:
        answer = _DECODE_ANY(body)
    except msgspec.DecodeError as exc:
        reason = str(exc)
        _refused("PutRecords", lambda: reason)
        return  # not JSON: botocore's parser says what it is
    if not isinstance(answer, dict) or not isinstance(answer.get("Records"), list):
        _refused("PutRecords", lambda: "no list of Records")
        return  # not the answer we know: botocore parses it
    records = answer["Records"]
    if b"null" in body:
        # botocore leaves a member out when its value is null (kinesis-local, and LocalStack,
        # send "ErrorCode": null, "ErrorMessage": null on every written entry): so does the
        # lean path. AWS sends no nulls: its answers skip this loop (the search is C-fast).
        records = [
            {key: value for key, value in entry.items() if value is not None}
            if isinstance(entry, dict)
            else entry
            for entry in records
        ]
    customized_response_dict["Records"] = records
    for name in ("FailedRecordCount", "EncryptionType"):
        if answer.get(name) is not None:
            customized_response_dict[name] = answer[name]
    response_dict["body"] = b"{}"


def _read_get_answer(response_dict: dict[str, Any], **_: Any) -> None:
    slot = _GET_SLOT.get()
    if slot is None:
        return
    body = _successful_body(response_dict)
    if body is None:
        return
    if slot.epoch:
        epoch = decode_epoch_answer(body)
        if epoch is not None:
            slot.epoch_answers.append(epoch)
        refused = epoch is None
    else:
        answer = decode_records_answer(body)
        if answer is not None:
            slot.answers.append(answer)
        refused = answer is None
    if refused:
        _refused("GetRecords", lambda: _refusal_reason(body, slot.epoch))
        return  # not the answer we know: botocore parses it
    response_dict["body"] = b"{}"


def _refusal_reason(body: bytes, epoch: bool) -> str:
    """Why the decoder refused ``body`` (decoded again: refusals are the rare path)."""
    try:
        (_DECODE_EPOCH if epoch else _DECODE_RECORDS)(body)
    except (msgspec.DecodeError, ValueError) as exc:
        return str(exc)
    return "refused"
