"""What a stream given to ``consume()``, ``subscribe()`` or ``run()`` refers to: a Kinesis stream
by name, a Kinesis stream by ARN, or a DynamoDB table's stream by its ARN. Pure: no I/O.

The text as given stays the stream's name everywhere (records' ``stream``, stats, metrics);
in the state table too, but for a Kinesis ARN of the config's own account and region, kept under
its plain name (:mod:`kinesumer.accounts`): two different streams never share an item. This
module only says what kind of stream it is, and where (region, account), so that the transport
can send its calls to the right service.

- ``orders``: a Kinesis stream of the configured region and account.
- ``arn:aws:kinesis:eu-west-1:123456789012:stream/orders``: a Kinesis stream by ARN, of any
  account and region (``Config.accounts`` says how each account is reached). Its state items are
  keyed by :func:`kinesumer.accounts.state_key`. Refused by :func:`check_stream`, where a stream
  is to be created by its name (a local stand-in's).
- ``arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000``: a
  DynamoDB table's stream (its ``LatestStreamArn``).

A text that starts with ``arn:`` and is not one of these raises
:class:`~kinesumer.errors.ConfigError` saying what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, TypeGuard

from .errors import ConfigError

__all__ = [
    "DYNAMODB_STREAM_FORM",
    "TABLE_STREAM_WRITES",
    "StreamKind",
    "StreamRef",
    "check_stream",
    "is_dynamodb_stream",
    "is_kinesis_name",
    "is_readable",
    "parse_stream",
    "stream_of_token",
]

StreamKind = Literal["kinesis-name", "kinesis-arn", "dynamodb-stream"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_PARTITION = re.compile(r"^aws(-[a-z]+)*$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_ACCOUNT = re.compile(r"^\d{12}$")
_TABLE = re.compile(r"^[A-Za-z0-9_.\-]{3,255}$")
#: A stream label: the stream's creation time as DynamoDB writes it (``2026-01-01T00:00:00.000``);
#: any run of these characters is taken, AWS's format may change.
_LABEL = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")

#: What a DynamoDB stream ARN looks like, for messages.
DYNAMODB_STREAM_FORM = "arn:aws:dynamodb:<region>:<12-digit account>:table/<table>/stream/<label>"
_DYNAMODB_FORM = DYNAMODB_STREAM_FORM
#: Why nothing is put to a table's stream, for every writer's refusal.
TABLE_STREAM_WRITES = (
    "a DynamoDB table's stream is written through its table (PutItem, UpdateItem, "
    "DeleteItem), not with PutRecord(s)"
)
_KINESIS_FORM = "arn:aws:kinesis:<region>:<12-digit account>:stream/<name>"


@dataclass(frozen=True)
class StreamRef:
    """A parsed stream reference. ``text``: as given (the stream's name in kinesumer).
    ``name``: the Kinesis stream's name, or the DynamoDB table's. ``region`` and ``account``:
    None for a bare name (the configured ones). ``label``: a DynamoDB stream's label."""

    text: str
    kind: StreamKind
    name: str
    region: str | None = None
    account: str | None = None
    partition: str | None = None
    label: str | None = None

    @property
    def is_dynamodb_stream(self) -> bool:
        return self.kind == "dynamodb-stream"


def parse_stream(text: object) -> StreamRef:
    """What ``text`` refers to; :class:`ConfigError` (field ``streams``) for anything that is
    neither a Kinesis stream name nor a well-formed ARN of a Kinesis or DynamoDB stream."""
    if not isinstance(text, str):
        raise ConfigError("streams", f"{text!r} is not a stream name or ARN (a string)")
    if not text.startswith("arn:"):
        if not _NAME.match(text):
            raise ConfigError(
                "streams",
                f"{text!r} is not a valid Kinesis stream name (1-128 of [A-Za-z0-9_.-]), nor an "
                f"ARN (a DynamoDB table's stream: {_DYNAMODB_FORM})",
            )
        return StreamRef(text, "kinesis-name", text)
    parts = text.split(":", 5)
    if len(parts) != 6:
        raise _malformed(text, "an ARN has six ':'-separated parts")
    _, partition, service, region, account, resource = parts
    form = _DYNAMODB_FORM if service == "dynamodb" else _KINESIS_FORM
    if not _PARTITION.match(partition):
        raise _malformed(text, f"the partition {partition!r} is not 'aws' or 'aws-<name>'", form)
    if service not in ("dynamodb", "kinesis"):
        raise _malformed(
            text, f"the service {service!r} is neither 'dynamodb' (a table's stream) nor 'kinesis'"
        )
    if not _REGION.match(region):
        raise _malformed(text, f"the region {region!r} is not a region such as 'eu-west-1'", form)
    if not _ACCOUNT.match(account):
        raise _malformed(text, f"the account {account!r} is not 12 digits", form)
    if service == "kinesis":
        kind, _, name = resource.partition("/")
        if kind != "stream" or not _NAME.match(name):
            raise _malformed(text, f"the resource {resource!r} is not 'stream/<name>'", form)
        return StreamRef(text, "kinesis-arn", name, region, account, partition)
    pieces = resource.split("/")
    if len(pieces) != 4 or pieces[0] != "table" or pieces[2] != "stream":
        if len(pieces) == 2 and pieces[0] == "table":
            raise _malformed(
                text,
                "it is a table's ARN, not its stream's: use the table's LatestStreamArn "
                "(DescribeTable), which ends in /stream/<label>",
                form,
            )
        raise _malformed(text, f"the resource {resource!r} is not 'table/<t>/stream/<l>'", form)
    _, table, _, label = pieces
    if not _TABLE.match(table):
        raise _malformed(text, f"the table name {table!r} is not 3-255 of [A-Za-z0-9_.-]", form)
    if not _LABEL.match(label):
        raise _malformed(text, f"the stream label {label!r} is not a label", form)
    return StreamRef(text, "dynamodb-stream", table, region, account, partition, label)


def check_stream(text: object) -> StreamRef:
    """:func:`parse_stream`, refusing a Kinesis stream ARN where a stream's name is needed (a
    stream to create)."""
    ref = parse_stream(text)
    if ref.kind == "kinesis-arn":
        raise ConfigError(
            "streams",
            f"{ref.text!r}: a stream's name is needed here, not its ARN: give {ref.name!r}",
        )
    return ref


def is_kinesis_name(text: object) -> TypeGuard[str]:
    """Whether ``text`` is a Kinesis stream name (1-128 of ``[A-Za-z0-9_.-]``); never raises."""
    return isinstance(text, str) and _NAME.match(text) is not None


def is_readable(text: object) -> bool:
    """Whether kinesumer reads ``text`` (what :func:`check_stream` accepts): a Kinesis stream
    name or a DynamoDB table's stream ARN. Never raises."""
    return is_kinesis_name(text) or (isinstance(text, str) and is_dynamodb_stream(text))


@lru_cache(maxsize=4096)
def is_dynamodb_stream(text: str) -> bool:
    """Whether ``text`` is a well-formed DynamoDB stream ARN (never raises). Cached: the
    routing transport asks it of every call's stream."""
    if not text.startswith("arn:") or ":dynamodb:" not in text:
        return False
    try:
        return parse_stream(text).is_dynamodb_stream
    except ConfigError:
        return False


def stream_of_token(token: str) -> str | None:
    """The DynamoDB stream an opaque token belongs to, or None: DynamoDB Streams' shard
    iterators begin with the stream's ARN and ``|`` (AWS's and moto's), and so do the paging
    tokens the DynamoDB Streams transport makes."""
    arn, bar, _ = token.partition("|")
    return arn if bar and is_dynamodb_stream(arn) else None


def _malformed(text: str, why: str, form: str | None = None) -> ConfigError:
    expected = f"; expected {form}" if form else ""
    return ConfigError("streams", f"{text!r} is not a stream ARN kinesumer reads: {why}{expected}")
