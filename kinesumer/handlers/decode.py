"""Typed payloads: turn ``run(decode=...)`` into a decoder that gives the handler a
:class:`Message` (the decoded value and the record it came from).

``decode`` may be:

- ``"json"``: any JSON value (dicts, lists, ...), decoded by msgspec;
- a type msgspec decodes JSON into: a dataclass, a ``msgspec.Struct``, a ``TypedDict``, or any
  annotated type such as ``list[int]`` (validated: a wrong field type is a decode error);
- a pydantic model (anything with ``model_validate_json``; pydantic is not a dependency);
- any other callable taking the record's bytes and returning the value.

The decoder is built once per run (msgspec's ``Decoder`` compiles the type once). A payload that
does not decode raises :class:`~kinesumer.errors.DecodeError` naming the stream, shard, sequence
and the decoder's message; it goes through the failure policy like a handler error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from ..errors import ConfigError, DecodeError
from ..models import Record

T = TypeVar("T")

#: The decoder's own message is cut to this many characters (a pydantic report of a large payload
#: can run to pages); the DecodeError still chains the original exception.
MAX_MESSAGE = 1000


@dataclass(frozen=True)
class Message(Generic[T]):
    """What a handler with ``decode=`` receives: the decoded ``value`` and its ``record``."""

    value: T
    record: Record


class RecordDecoder:
    """Decodes records into :class:`Message` objects with one parse function, built once."""

    def __init__(self, parse: Callable[[bytes], Any], description: str) -> None:
        self._parse = parse
        self.description = description

    def __call__(self, record: Record) -> Message[Any]:
        try:
            value = self._parse(record.data)
        except Exception as exc:
            report = _without_input(exc)
            message = f"{self.description}: {type(exc).__name__}: {report or exc}"
            if len(message) > MAX_MESSAGE:
                message = message[: MAX_MESSAGE - 3] + "..."
            error = DecodeError(record.stream, record.shard_id, record.sequence_number, message)
            if report is None:
                raise error from exc
            # pydantic's own text quotes the payload (input_value): chained, it would reach
            # every traceback logged. The report above keeps what failed and where.
            raise error from None
        return Message(value, record)

    def __repr__(self) -> str:
        return f"RecordDecoder({self.description})"


def _without_input(exc: Exception) -> str | None:
    """A pydantic ``ValidationError``'s report without the payload it quotes
    (``errors(include_input=False)``: where and what, never ``input_value``); None for any other
    exception."""
    errors = getattr(exc, "errors", None)
    if not callable(errors) or not hasattr(exc, "error_count"):
        return None
    try:
        found = errors(include_input=False, include_url=False, include_context=False)
    except TypeError:
        return None  # not pydantic v2's ValidationError after all
    parts = [
        f"{'.'.join(map(str, e.get('loc', ()))) or '(payload)'}: {e.get('msg')} "
        f"[type={e.get('type')}]"
        for e in found
    ]
    return f"{len(parts)} validation error(s) for {getattr(exc, 'title', '?')}: " + "; ".join(parts)


def make_decoder(decode: object) -> RecordDecoder | None:
    """The decoder for ``run(decode=...)``; None when ``decode`` is None (handlers get records).

    Raises ConfigError("decode") for something that is none of the accepted forms.
    """
    if decode is None:
        return None
    if isinstance(decode, str):
        if decode != "json":
            raise ConfigError("decode", f'must be "json", a type or a callable, not {decode!r}')
        return RecordDecoder(msgspec.json.Decoder().decode, "JSON")
    name = getattr(decode, "__qualname__", None) or repr(decode)
    validate_json = getattr(decode, "model_validate_json", None)
    if isinstance(decode, type) and callable(validate_json):
        return RecordDecoder(validate_json, f"{name}.model_validate_json")
    try:
        typed = msgspec.json.Decoder(decode)
    except TypeError:
        typed = None  # not a type msgspec knows: a plain callable, below
    if typed is not None:
        return RecordDecoder(typed.decode, f"JSON as {name}")
    if callable(decode):
        return RecordDecoder(decode, name)
    raise ConfigError(
        "decode",
        f'must be "json", a dataclass/msgspec.Struct/TypedDict/pydantic type, or a callable '
        f"taking bytes, not {decode!r}",
    )
