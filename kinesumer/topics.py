"""A topic: a stream bound to the type of its payloads, for both sides.

::

    orders = Topic("orders", Order)
    producer.put(orders, Order(id=1), partition_key="order-1")   # encoded as JSON
    orders.decode(record.data)                                    # an Order again

The codecs are :mod:`kinesumer.codecs` (the ones ``run(decode=...)`` uses). A producer built
with ``topics=[...]`` refuses any other stream.
"""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

from .codecs import make_encoder, make_parser
from .errors import ConfigError, InvalidRecordError

T = TypeVar("T")
_STREAM = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class Topic(Generic[T]):
    """Stream ``stream`` carrying values of ``type`` (``"json"``, a dataclass, a
    ``msgspec.Struct``, a ``TypedDict``, a pydantic model: see :mod:`kinesumer.codecs`)."""

    def __init__(self, stream: str, type: type[T] | Any = "json") -> None:
        if not isinstance(stream, str) or not _STREAM.match(stream):
            raise ConfigError("stream", f"1-128 of [A-Za-z0-9_.-], got {stream!r}", "Topic")
        self.stream = stream
        self.type = type
        self._encode = make_encoder(type)
        self._parse = make_parser(type)

    def encode(self, value: T) -> bytes:
        """The record bytes of ``value``; InvalidRecordError if it does not encode."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)  # already encoded
        try:
            return self._encode(value)
        except Exception as exc:
            raise InvalidRecordError(
                f"put(data): {type(value).__name__} value does not encode for topic "
                f"{self.stream!r} ({self._describe()}): {exc}"
            ) from exc

    def decode(self, data: bytes) -> T:
        """``data`` parsed back into the topic's type (the decoder's own error if not)."""
        value: T = self._parse(data)
        return value

    def _describe(self) -> str:
        return (
            self.type
            if isinstance(self.type, str)
            else getattr(self.type, "__qualname__", repr(self.type))
        )

    def __repr__(self) -> str:
        return f"Topic({self.stream!r}, {self._describe()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topic) and (self.stream, self.type) == (other.stream, other.type)

    def __hash__(self) -> int:
        return hash(self.stream)
