"""Where the app's Spark queries first opened each shard at ``LATEST``: the instant every later
``LATEST`` open of that shard starts from instead of "now".

``LATEST`` means "from when reading began", and reading may begin again: a restart with a new
(empty) checkpoint folder, the shard moving to another query of the app, a lost and re-claimed
lease. Until a batch of the shard commits a record there is no group checkpoint, so each of these
would open ``LATEST`` anew and skip whatever reached the shard in between. The planner therefore
pins a ``LATEST`` start to an instant (``AT_TIMESTAMP``, so a replay of the batch reads the same
records) and keeps the first such instant per shard in the state table, beside the group's
items; every later ``LATEST`` start of the shard, by any query of the app, reads from there::

    pk = spark_latest#<app>      sk = <stream>#<shard id>
    started_at (N, epoch ms: the first pin), written_at (N, epoch ms)

The instant is Kinesis's, by the rule every face of the group uses for a ``LATEST`` start
(:func:`~kinesumer.kinesis.reader.start_instant_ms`): the ``Date`` of the GetShardIterator
answer that opened the shard at ``LATEST``, minus ``SERVER_CLOCK_MARGIN_MS``. A driver whose
clock runs ahead, or a DynamoDB whose clock runs ahead of Kinesis's, cannot pin after records
that already arrived (this host's clock, minus a wider margin, only when Kinesis sends no
``Date``). It may read a few seconds of earlier records, never fewer. Written with
``attribute_not_exists``: the first pin wins and is never moved.

The pin is also recorded in the group's checkpoint item (``started_at``, fenced by the query's
lease, kept if one is there: :meth:`~kinesumer.group.external.ExternalReadMember.record_start`)
before the shard's first batch is planned, so a plain or fan-out member, or a ``foreach_batch``
driver, that takes the shard over before any batch committed starts there too. Once the shard
has a checkpoint (a batch read a record and was settled) the checkpoint is where reading
resumes and the pin is no longer looked at. The item has no TTL: a query down for longer than
any TTL must still resume from its pin (from the trim horizon if retention dropped older records).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from ....statestore.spark import SparkSourceStore
from ..offsets import Start, epoch_ms

Key = tuple[str, str]


class LatestPins:
    """The pins of one app's Spark queries, in that app's state store."""

    def __init__(self, store: SparkSourceStore) -> None:
        self._store = store

    async def pin(self, key: Key, instant: Callable[[], Awaitable[int]], local_ms: int) -> int:
        """The shard's pin: the one it has, or ``instant()`` (where a ``LATEST`` read opened now
        begins, by Kinesis's clock), written now; ``local_ms``: this host's clock (the item's
        ``written_at``)."""
        found = await self._store.latest_pin(*key)
        if found is not None:
            return found
        return await self._store.add_latest_pin(*key, await instant(), local_ms)

    async def started_at(self, key: Key) -> int | None:
        """The shard's pin, or None."""
        return await self._store.latest_pin(*key)


def local_now_ms() -> int:
    """This host's clock (epoch ms)."""
    return int(time.time() * 1000)


def pinned(start: Start, pin_ms: int, handed_over_ms: int | None = None) -> Start:
    """``start`` (a ``LATEST`` one) as ``AT_TIMESTAMP`` of the earliest known instant reading of
    the shard began: this app's Spark pin, or ``handed_over_ms``, where a plain member of the
    group began reading it (its checkpoint's start instant, when the group records one)."""
    at = pin_ms if handed_over_ms is None else min(pin_ms, handed_over_ms)
    return Start(at_timestamp_ms=at, lease=start.lease)


def initial_start(start: Any, lease: int, initial_position: Any = None) -> Start:
    """A shard's start when it has no checkpoint: the member's start position for it
    (``Config.initial_position``, or TRIM_HORIZON for a child of a reshard).

    With a starting instant (``initial_position`` a datetime: options ``starting_timestamp``,
    or a timestamp under ``initial_position`` or another connector's name), every shard starts
    there, children too: a child born after the instant holds only records after it (the
    instant is its beginning), and one born before it (its parents closed before the instant)
    would otherwise give the records between its birth and the instant. A parent closed before
    the instant is read past its end from there (nothing to read) and finished, so its
    children follow as usual."""
    if isinstance(initial_position, datetime):
        start = initial_position
    if isinstance(start, str):
        return Start(at=start, lease=lease)
    return Start(at_timestamp_ms=epoch_ms(start), lease=lease)
