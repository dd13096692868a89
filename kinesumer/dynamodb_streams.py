"""DynamoDB table changes as plain Python values, for handlers of a table's stream.

A DynamoDB stream ARN (``arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL``) is read
wherever a Kinesis stream name is: each change arrives as a :class:`~kinesumer.Record` whose
``data`` is the stream record as DynamoDB Streams returns it, as JSON (``eventID``,
``eventName``, ``dynamodb`` with ``Keys``, ``NewImage``, ``OldImage``, ``SequenceNumber``,
``ApproximateCreationDateTime`` in epoch seconds, ``StreamViewType``; ``userIdentity`` for a TTL
deletion), and whose ``partition_key`` is the item's key as canonical JSON. :func:`change`
gives it as a :class:`Change`, attribute values decoded by boto3's ``TypeDeserializer``
(numbers as :class:`~decimal.Decimal`, sets as :class:`set`, binary as ``Binary``)::

    from kinesumer.dynamodb_streams import change

    def handle(record):
        c = change(record)
        if c.event_name == "REMOVE" and c.is_ttl_delete:
            return  # expired, not deleted by a user
        print(c.keys["pk"], c.new_image)
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from boto3.dynamodb.types import TypeDeserializer

from .models import Record

__all__ = ["TTL_PRINCIPAL", "Change", "EventName", "change", "decode_item"]

EventName = Literal["INSERT", "MODIFY", "REMOVE"]

#: The ``userIdentity.principalId`` of the deletions DynamoDB's TTL makes.
TTL_PRINCIPAL = "dynamodb.amazonaws.com"

_DESERIALIZE = TypeDeserializer().deserialize


@dataclass(frozen=True)
class Change:
    """One change of a table's item. ``keys``, ``new_image`` and ``old_image`` are plain Python
    values; an image is None when the stream's view type does not carry it (or for the
    ``INSERT``'s old image and the ``REMOVE``'s new one). ``created_at``: when DynamoDB wrote the
    change (``ApproximateCreationDateTime``, UTC). ``is_ttl_delete``: a ``REMOVE`` made by the
    table's time to live, not by a user."""

    event_name: EventName
    keys: dict[str, Any]
    new_image: dict[str, Any] | None
    old_image: dict[str, Any] | None
    sequence_number: str
    created_at: datetime | None
    is_ttl_delete: bool
    event_id: str
    stream_view_type: str | None
    size_bytes: int | None
    raw: dict[str, Any]


def change(record: Record | bytes | str) -> Change:
    """The change a record of a DynamoDB stream carries (its ``data``, or that JSON itself).
    ``ValueError`` when it is not a DynamoDB Streams record."""
    data = record.data if isinstance(record, Record) else record
    raw = json.loads(data)
    if not isinstance(raw, dict) or not isinstance(raw.get("dynamodb"), dict):
        raise ValueError("not a DynamoDB Streams record: no 'dynamodb' member")
    body: dict[str, Any] = raw["dynamodb"]
    created = body.get("ApproximateCreationDateTime")
    identity = raw.get("userIdentity") or {}
    size = body.get("SizeBytes")
    return Change(
        event_name=raw.get("eventName"),  # type: ignore[arg-type]
        keys=decode_item(body.get("Keys", {})),
        new_image=decode_item(body["NewImage"]) if "NewImage" in body else None,
        old_image=decode_item(body["OldImage"]) if "OldImage" in body else None,
        sequence_number=str(body.get("SequenceNumber", "")),
        created_at=None
        if not isinstance(created, (int, float))
        else datetime.fromtimestamp(created, timezone.utc),
        is_ttl_delete=identity.get("type") == "Service"
        and identity.get("principalId") == TTL_PRINCIPAL,
        event_id=str(raw.get("eventID", "")),
        stream_view_type=body.get("StreamViewType"),
        size_bytes=size if isinstance(size, int) else None,
        raw=raw,
    )


def decode_item(item: dict[str, Any]) -> dict[str, Any]:
    """An item in DynamoDB's JSON (binary values in base64, as on the wire) as plain values."""
    return {name: _DESERIALIZE(_binary(value)) for name, value in item.items()}


def _binary(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with its base64 binaries as bytes, which ``TypeDeserializer`` takes."""
    if "B" in value:
        return {"B": base64.b64decode(value["B"])}
    if "BS" in value:
        return {"BS": [base64.b64decode(b) for b in value["BS"]]}
    if "M" in value:
        return {"M": {k: _binary(v) for k, v in value["M"].items()}}
    if "L" in value:
        return {"L": [_binary(v) for v in value["L"]]}
    return value
