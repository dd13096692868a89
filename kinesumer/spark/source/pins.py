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
from typing import Any

from ...aws import RequestStats
from ...statestore.dynamodb.codecs import ABSENT, item_key
from ...statestore.dynamodb.table import StateTable
from ...statestore.schema import spark_latest_pk
from .offsets import Start

Key = tuple[str, str]


def pins_pk(app: str) -> str:
    """The partition key of ``app``'s pins (the state store's schema owns the name)."""
    return spark_latest_pk(app)


class LatestPins:
    """The pins of one app's Spark queries in its state table."""

    def __init__(self, client: Any, table: str, app: str, stats: RequestStats) -> None:
        self._table = StateTable(client, table, stats)
        self._pk = pins_pk(app)

    def _key(self, key: Key) -> dict[str, Any]:
        return item_key(self._pk, f"{key[0]}#{key[1]}")

    async def pin(self, key: Key, instant: Callable[[], Awaitable[int]], local_ms: int) -> int:
        """The shard's pin: the one it has, or ``instant()`` (where a ``LATEST`` read opened now
        begins, by Kinesis's clock), written now; ``local_ms``: this host's clock (the item's
        ``written_at``)."""
        table = self._table
        found = await table.get(self._key(key))
        if found is not None:
            return int(found["started_at"]["N"])
        now_ms = await instant()
        item = self._key(key) | {
            "started_at": {"N": str(now_ms)},
            "written_at": {"N": str(local_ms)},
        }
        if await table.put_if(item, ABSENT) is not None:
            return now_ms
        held = await table.get(self._key(key))  # another query pinned it meanwhile
        return now_ms if held is None else int(held["started_at"]["N"])

    async def started_at(self, key: Key) -> int | None:
        """The shard's pin, or None."""
        held = await self._table.get(self._key(key))
        return None if held is None else int(held["started_at"]["N"])


def local_now_ms() -> int:
    """This host's clock (epoch ms)."""
    return int(time.time() * 1000)


def pinned(start: Start, pin_ms: int, handed_over_ms: int | None = None) -> Start:
    """``start`` (a ``LATEST`` one) as ``AT_TIMESTAMP`` of the earliest known instant reading of
    the shard began: this app's Spark pin, or ``handed_over_ms``, where a plain member of the
    group began reading it (its checkpoint's start instant, when the group records one)."""
    at = pin_ms if handed_over_ms is None else min(pin_ms, handed_over_ms)
    return Start(at_timestamp_ms=at, lease=start.lease)


def initial_start(start: Any, lease: int) -> Start:
    """A shard's start when it has no checkpoint: the member's start position for it
    (``Config.initial_position``, or TRIM_HORIZON for a child of a reshard)."""
    if isinstance(start, str):
        return Start(at=start, lease=lease)
    return Start(at_timestamp_ms=int(start.timestamp() * 1000), lease=lease)
