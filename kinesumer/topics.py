"""A topic: a stream bound to the type of its payloads, for both sides.

::

    orders = Topic("orders", Order)
    producer.put(orders, Order(id=1), partition_key="order-1")   # encoded as JSON
    orders.decode(record.data)                                    # an Order again

The codecs are :mod:`kinesumer.codecs` (the ones ``run(decode=...)`` uses). A producer built
with ``topics=[...]`` refuses any other stream; so does a consumer (:class:`TopicList`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Generic, TypeVar, overload

from .codecs import make_encoder, make_parser
from .errors import ConfigError, InvalidRecordError
from .stream_refs import DYNAMODB_STREAM_FORM, is_readable

T = TypeVar("T")
#: What a topic's stream must be, for messages.
_READABLE = (
    f"a Kinesis stream name (1-128 of [A-Za-z0-9_.-]) or a DynamoDB table's stream ARN "
    f"({DYNAMODB_STREAM_FORM})"
)


class Topic(Generic[T]):
    """Stream ``stream`` carrying values of ``type`` (``"json"``, a dataclass, a
    ``msgspec.Struct``, a ``TypedDict``, a pydantic model: see :mod:`kinesumer.codecs`)."""

    # Overloads so that ``Topic("orders", Order)`` is a ``Topic[Order]`` to a type checker, and
    # ``Topic("orders")`` (JSON) or a TypedDict, which is no class at runtime, a ``Topic[Any]``.
    @overload
    def __init__(self, stream: str, type: type[T]) -> None: ...

    @overload
    def __init__(self: Topic[Any], stream: str, type: Any = "json") -> None: ...

    def __init__(self, stream: str, type: type[T] | Any = "json") -> None:
        if not is_readable(stream):
            raise ConfigError("stream", f"{_READABLE}, got {stream!r}", "Topic")
        self.stream = stream
        self.type = type
        self._encode = make_encoder(type)
        self._parse = make_parser(type)
        self._instance_of = _checkable(type)

    def encode(self, value: T) -> bytes:
        """The record bytes of ``value``; InvalidRecordError if it does not encode."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)  # already encoded
        if self._instance_of is not None and not isinstance(value, self._instance_of):
            raise InvalidRecordError(
                f"put(data): topic {self.stream!r} carries {self._describe()}, not "
                f"{type(value).__name__}; this value does not encode for it"
            )
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


def _checkable(payload: object) -> type | None:
    """The class a value must be an instance of (dataclasses, Structs, models); None where
    isinstance cannot tell (``"json"``, TypedDict, generic aliases)."""
    if not isinstance(payload, type) or issubclass(payload, dict):
        return None
    try:
        isinstance(None, payload)
    except TypeError:
        return None
    return payload


def run_streams(streams: Any, decode: object) -> tuple[list[str], object]:
    """``run()``'s streams as names, and its ``decode``: the topics' type when ``streams`` are
    :class:`Topic` objects (one, or several of one type) and ``decode`` is not given. Plain
    stream names pass through unchanged; topics of different types need ``decode=``."""
    items = [streams] if isinstance(streams, (Topic, str)) else list(streams)
    topics = [item for item in items if isinstance(item, Topic)]
    if topics and decode is None:
        types = {id(topic.type): topic.type for topic in topics}
        if len(types) > 1 or len(topics) < len(items):
            raise ConfigError(
                "decode",
                "the streams are topics of different types (or topics and plain names): "
                "pass decode=, or run each type on its own",
                "run",
            )
        decode = next(iter(types.values()))
    names = [item.stream if isinstance(item, Topic) else item for item in items]
    return names, decode


class TopicList:
    """A producer's or consumer's ``topics=[...]``: the only streams it accepts, each bound to
    its :class:`Topic` (None for a plain stream name). Built once by the constructor (``where``
    names it in errors); the producer checks each ``put`` against :attr:`by_stream`, the
    consumer every call that names streams with :meth:`refuse_others`."""

    def __init__(self, topics: Iterable[str | Topic[Any]], where: str) -> None:
        if isinstance(topics, (str, Topic)) or not hasattr(topics, "__iter__"):
            raise ConfigError(
                "topics", f"must be a list of stream names or Topics, got {topics!r}", where
            )
        self.by_stream: dict[str, Topic[Any] | None] = {}
        for topic in topics:
            name = topic.stream if isinstance(topic, Topic) else topic
            if not is_readable(name):
                raise ConfigError("topics", f"{name!r} is not {_READABLE}", where)
            listed = self.by_stream.get(name)
            if isinstance(topic, Topic) and listed is not None and listed != topic:
                raise ConfigError(
                    "topics", f"{listed!r} and {topic!r}: one stream, one payload type", where
                )
            self.by_stream[name] = listed or (topic if isinstance(topic, Topic) else None)

    def refuse_others(self, streams: Iterable[str | Topic[Any]], where: str) -> None:
        """ConfigError naming ``where``'s ``streams`` unless every one is listed, and every
        :class:`Topic` among them is the listed one: a second payload type for a listed stream
        is the disagreement the list is there to catch (a plain name reads raw records)."""
        items = list(streams)
        names = [item.stream if isinstance(item, Topic) else item for item in items]
        refused = outside_topics(names, self.by_stream, "consumer")
        if refused is not None:
            raise ConfigError("streams", refused, where)
        for item in items:
            listed = self.by_stream.get(item.stream) if isinstance(item, Topic) else None
            if listed is not None and listed != item:
                raise ConfigError(
                    "streams",
                    f"{item!r} is not this consumer's topic {listed!r}: read the listed topic, "
                    f"or a plain stream name with decode=",
                    where,
                )


def outside_topics(names: Iterable[str], topics: Collection[str], whose: str) -> str | None:
    """Why ``names`` are refused by a ``whose`` (producer, consumer) limited to ``topics``, in
    the same words for both; None when every one is listed."""
    unlisted = sorted({name for name in names if name not in topics})
    if not unlisted:
        return None
    verb, it = ("is not one of", "it") if len(unlisted) == 1 else ("are not among", "them")
    return (
        f"{', '.join(map(repr, unlisted))} {verb} this {whose}'s topics "
        f"({', '.join(sorted(topics)) or 'none'}); add {it} to topics=[...]"
    )
