"""``put(stream, records)`` and ``wait_for(expected, source)``: the two moves of a test on a
local AWS, with timeouts whose failure says what arrived and what did not.

Records are compared by their data (bytes; a str is its UTF-8) as a multiset: ``wait_for`` ends
when every expected payload has arrived at least as often as expected. A source is a consumer
(``Kinesumer`` or ``AsyncKinesumer``, polled here), a collection a handler appends to, or a
callable returning what arrived so far; its items are :class:`~kinesumer.Record`\\ s, messages
(``.record``), bytes or str.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

#: A record to put: its data (the partition key is then the data's own digest), or (key, data).
Putable = bytes | str | tuple[str, bytes | str]


class RecordsDidNotArriveError(AssertionError):
    """``wait_for`` timed out: the message lists what is missing and what arrived."""


def as_bytes(item: Any) -> bytes:
    """The payload of a received or expected item."""
    item = getattr(item, "record", item)  # a handler's Message
    item = getattr(item, "data", item)  # a Record
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    raise TypeError(f"cannot compare {item!r}: expected bytes, str or a Record")


def put(client: Any, stream: str, records: Iterable[Putable]) -> list[dict[str, Any]]:
    """Put ``records`` to ``stream`` in order with a blocking boto3 Kinesis ``client`` (one
    PutRecord each, so a key's records keep their order); returns Kinesis's answers."""
    answers = []
    for index, item in enumerate(records):
        key, data = item if isinstance(item, tuple) else (f"key-{index}", item)
        answers.append(client.put_record(StreamName=stream, Data=as_bytes(data), PartitionKey=key))
    return answers


def missing_from(expected: Iterable[Any], arrived: Iterable[Any]) -> Counter[bytes]:
    return Counter(as_bytes(x) for x in expected) - Counter(as_bytes(x) for x in arrived)


def report(expected: list[Any], arrived: list[Any], timeout: float) -> str:
    missing = missing_from(expected, arrived)
    extra = Counter(as_bytes(x) for x in arrived) - Counter(as_bytes(x) for x in expected)
    return (
        f"{sum(missing.values())} of {len(expected)} expected records did not arrive within "
        f"{timeout} s\n  missing: {sorted(missing.elements())!r}\n"
        f"  arrived ({len(arrived)}): {[as_bytes(x) for x in arrived]!r}\n"
        f"  arrived but not expected: {sorted(extra.elements())!r}"
    )


def _snapshot(source: Any) -> list[Any]:
    if callable(source):
        return list(source())
    return list(source)


def wait_for(
    expected: Iterable[Any], source: Any, *, timeout: float = 10.0, poll: float = 0.2
) -> list[Any]:
    """Wait until every expected payload arrived at ``source``; returns what arrived (for a
    consumer: the records it polled). Raises :class:`RecordsDidNotArriveError` after
    ``timeout`` seconds."""
    wanted = list(expected)
    arrived: list[Any] = []
    deadline = time.monotonic() + timeout
    polls: Callable[..., Any] | None = getattr(source, "poll", None)
    while True:
        if polls is not None:
            arrived += polls(timeout=min(poll, max(0.0, deadline - time.monotonic())))
        else:
            arrived = _snapshot(source)
        if not missing_from(wanted, arrived):
            return arrived
        if time.monotonic() >= deadline:
            raise RecordsDidNotArriveError(report(wanted, arrived, timeout))
        if polls is None:
            time.sleep(poll)


async def wait_for_async(
    expected: Iterable[Any], source: Any, *, timeout: float = 10.0, poll: float = 0.2
) -> list[Any]:
    """:func:`wait_for` for asyncio tests: an ``AsyncKinesumer`` is awaited, a collection is
    checked between sleeps that leave the event loop free."""
    wanted = list(expected)
    arrived: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    polls: Callable[..., Any] | None = getattr(source, "poll", None)
    while True:
        if polls is not None:
            batch = polls(timeout=min(poll, max(0.0, deadline - loop.time())))
            arrived += await batch if inspect.isawaitable(batch) else batch
        else:
            arrived = _snapshot(source)
        if not missing_from(wanted, arrived):
            return arrived
        if loop.time() >= deadline:
            raise RecordsDidNotArriveError(report(wanted, arrived, timeout))
        if polls is None:
            await asyncio.sleep(poll)
