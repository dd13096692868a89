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

The instant is AWS's, not the driver's: the ``Date`` header of the DynamoDB answer that found no
pin (whole seconds, rounded down; botocore sends ``AT_TIMESTAMP`` in whole seconds anyway), so a
driver whose clock runs ahead cannot pin after records that already arrived (the driver's clock
only when an endpoint sends no ``Date``). It may read up to a second of earlier records, never
fewer. Written with ``attribute_not_exists``: the first pin wins and is never moved. Once the
shard has a checkpoint (a batch read a record and was settled) the checkpoint is where reading
resumes and the pin is no longer looked at. The item has no TTL: a query down for longer than
any TTL must still resume from its pin (from the trim horizon if retention dropped older records).
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime
from functools import partial
from typing import Any

from ...aws import RequestStats
from ...statestore.dynamodb.codecs import ABSENT, item_key
from ...statestore.dynamodb.table import StateTable
from .offsets import Start

Key = tuple[str, str]


def pins_pk(app: str) -> str:
    return f"spark_latest#{app}"


class LatestPins:
    """The pins of one app's Spark queries in its state table."""

    def __init__(self, client: Any, table: str, app: str, stats: RequestStats) -> None:
        self._table = StateTable(client, table, stats)
        self._pk = pins_pk(app)

    def _key(self, key: Key) -> dict[str, Any]:
        return item_key(self._pk, f"{key[0]}#{key[1]}")

    async def pin(self, key: Key, local_ms: int) -> int:
        """The shard's pin: the one it has, or AWS's "now" (``local_ms``, this host's clock,
        if the answer has no ``Date``), written now."""
        table = self._table
        found = await table.call(
            "GetItem",
            partial(
                table.dynamodb.get_item, TableName=table.name, Key=self._key(key),
                ConsistentRead=True,
            ),
        )  # fmt: skip
        if "Item" in found:
            return int(found["Item"]["started_at"]["N"])
        now_ms = server_ms(found)
        now_ms = local_ms if now_ms is None else now_ms
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


def server_ms(response: dict[str, Any]) -> int | None:
    """The ``Date`` of an AWS answer (epoch ms, whole seconds), or None."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    date = headers.get("date")
    if not date:
        return None
    try:
        return int(parsedate_to_datetime(date).timestamp()) * 1000
    except (TypeError, ValueError):
        return None


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
