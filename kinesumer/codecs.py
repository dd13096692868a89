"""Payload codecs both sides use: :func:`make_encoder` turns a value into a record's bytes the
way ``run(decode=...)`` (:mod:`kinesumer.handlers.decode`) turns bytes back into the value, and
:func:`make_parser` is that decoding without the record around it.

A payload type may be:

- ``"json"``: any JSON value, by msgspec;
- a type msgspec encodes as JSON: a dataclass, a ``msgspec.Struct``, a ``TypedDict``, or an
  annotated type such as ``list[int]``;
- a pydantic model (anything with ``model_dump_json`` / ``model_validate_json``; pydantic is not
  a dependency).

Low on the map (it imports nothing of kinesumer's but errors), so the producer and the handlers
can both use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from .errors import ConfigError

_json = msgspec.json.Encoder()


def make_encoder(payload: object) -> Callable[[Any], bytes]:
    """The function that turns a value of ``payload`` (see the module docstring) into bytes.

    Raises ConfigError("type") for something that is none of the accepted forms."""
    if isinstance(payload, str):
        if payload != "json":
            raise ConfigError("type", f'must be "json" or a type, not {payload!r}', "Topic")
        return _json.encode
    if isinstance(payload, type) and callable(getattr(payload, "model_dump_json", None)):
        return _pydantic_encode
    try:
        msgspec.json.Decoder(payload)  # msgspec knows the type: it encodes it as well
    except TypeError:
        raise ConfigError(
            "type",
            f'must be "json", a dataclass/msgspec.Struct/TypedDict/pydantic type, not {payload!r}',
            "Topic",
        ) from None
    return _json.encode


def make_parser(payload: object) -> Callable[[bytes], Any]:
    """The function that turns bytes back into a value of ``payload``."""
    if isinstance(payload, str):
        if payload != "json":
            raise ConfigError("type", f'must be "json" or a type, not {payload!r}', "Topic")
        return msgspec.json.Decoder().decode
    validate = getattr(payload, "model_validate_json", None)
    if isinstance(payload, type) and callable(validate):
        parse: Callable[[bytes], Any] = validate
        return parse
    try:
        return msgspec.json.Decoder(payload).decode
    except TypeError:
        raise ConfigError(
            "type", f"not a type msgspec or pydantic decodes: {payload!r}", "Topic"
        ) from None


def _pydantic_encode(value: Any) -> bytes:
    text: str = value.model_dump_json()
    return text.encode("utf-8")
