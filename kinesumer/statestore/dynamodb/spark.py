"""The Spark source's items in the DynamoDB state table (:mod:`kinesumer.statestore.spark`).

Items, for app ``A`` (keys from :mod:`..schema`):

- ledger entry ``pk=spark_ledger#A#<query id>, sk=<batch, 10 digits>#<stream>#<shard id>``:
  ``end_sequence_number`` (S, absent when the read found nothing), ``end_sub_sequence_number``
  (N), ``count`` (N), ``caught_up`` (BOOL), ``shard_end`` (BOOL), ``last_arrival`` (N, epoch
  ms), ``owner`` (S), ``lease`` (N), ``written_at`` (N, epoch ms), ``expires_at`` (N, TTL epoch
  s), ``millis_behind`` (N: the last answer's MillisBehindLatest). Written with
  ``attribute_not_exists(pk)``: the first attempt of a task fixes the batch's range.
- ``LATEST`` pin ``pk=spark_latest#A, sk=<stream>#<shard id>``: ``started_at`` (N, epoch ms: the
  first pin), ``written_at`` (N, epoch ms). Written with ``attribute_not_exists(pk)``; no TTL.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ...errors import CorruptStateError
from ...models import Position
from ..schema import (
    PARTITION_KEY,
    SORT_KEY,
    TTL_ATTRIBUTE,
    checkpoint_pk,
    client_pk,
    shard_cache_pk,
    spark_latest_pk,
)
from ..spark import LedgerEntry
from .attributes import attribute
from .codecs import ABSENT, item_key
from .controls import load_pk
from .table import StateTable
from .unreadable import Unreadable
from .view import view_pk

#: The projection of a read that only needs the keys (to delete the items).
KEYS_ONLY = f"{PARTITION_KEY}, {SORT_KEY}"


def ledger_pk(app: str, query: str) -> str:
    return f"spark_ledger#{app}#{query}"


def batch_prefix(batch: int) -> str:
    return f"{batch:010d}#"


def ledger_sk(batch: int, stream: str, shard_id: str) -> str:
    return f"{batch_prefix(batch)}{stream}#{shard_id}"


def pins_pk(app: str) -> str:
    """The partition key of ``app``'s ``LATEST`` pins."""
    return spark_latest_pk(app)


def pin_key(app: str, stream: str, shard_id: str) -> dict[str, Any]:
    return item_key(spark_latest_pk(app), f"{stream}#{shard_id}")


def group_partitions(group: str, streams: Iterable[str]) -> list[str]:
    """Every partition key of consumer group ``group``'s items (not its queries' ledgers)."""
    fixed = [client_pk(group), shard_cache_pk(group), pins_pk(group), view_pk(group)]
    fixed += [f"controls#{group}", f"weights#{group}", load_pk(group)]
    return fixed + [checkpoint_pk(group, stream) for stream in streams]


class SparkItems:
    """The Spark source's items of one app in the state ``table``."""

    def __init__(self, table: StateTable, app: str, unreadable: Unreadable) -> None:
        self._table = table
        self._app = app
        self._unreadable = unreadable

    # -- ledger -------------------------------------------------------------------------------
    def _ledger_key(self, query: str, batch: int, stream: str, shard_id: str) -> dict[str, Any]:
        return item_key(ledger_pk(self._app, query), ledger_sk(batch, stream, shard_id))

    async def ledger_entry(
        self, query: str, batch: int, stream: str, shard_id: str
    ) -> LedgerEntry | None:
        item = await self._table.get(self._ledger_key(query, batch, stream, shard_id))
        return None if item is None else decode_ledger_entry(item)

    async def add_ledger_entry(
        self, query: str, entry: LedgerEntry, ttl_seconds: int
    ) -> LedgerEntry:
        key = self._ledger_key(query, entry.batch, entry.stream, entry.shard_id)
        item = key | ledger_attributes(entry)
        now = time.time()
        item["written_at"] = {"N": str(int(now * 1000))}
        item[TTL_ATTRIBUTE] = {"N": str(int(now) + ttl_seconds)}
        if await self._table.put_if(item, ABSENT) is not None:
            return entry
        existing = await self.ledger_entry(query, entry.batch, entry.stream, entry.shard_id)
        if existing is None:  # pragma: no cover - deleted between the two calls: batch committed
            return entry
        return existing

    async def ledger_batch(self, query: str, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        items = await self._table.query(
            ledger_pk(self._app, query), sort_key=("begins_with(#sk, :sk)", batch_prefix(batch))
        )
        entries = (decode_ledger_entry(i) for i in items)
        return {e.key: e for e in entries}

    async def delete_ledger_before(self, query: str, batch: int) -> int:
        keys = await self._table.query(
            ledger_pk(self._app, query),
            projection=KEYS_ONLY,
            sort_key=("#sk < :sk", batch_prefix(batch)),
        )
        await self._table.delete_many(keys)
        return len(keys)

    async def forget_ledger(self, query: str) -> int:
        return await self._delete_partitions([ledger_pk(self._app, query)])

    # -- LATEST pins --------------------------------------------------------------------------
    async def latest_pin(self, stream: str, shard_id: str) -> int | None:
        held = await self._table.get(pin_key(self._app, stream, shard_id))
        return None if held is None else int(attribute(held, "started_at", "N"))

    async def add_latest_pin(
        self, stream: str, shard_id: str, started_at_ms: int, written_at_ms: int
    ) -> int:
        item = pin_key(self._app, stream, shard_id) | {
            "started_at": {"N": str(started_at_ms)},
            "written_at": {"N": str(written_at_ms)},
        }
        if await self._table.put_if(item, ABSENT) is not None:
            return started_at_ms
        held = await self.latest_pin(stream, shard_id)  # another query pinned it meanwhile
        return started_at_ms if held is None else held

    async def latest_pins(self, stream: str) -> dict[str, int]:
        items = await self._table.query(
            spark_latest_pk(self._app), sort_key=("begins_with(#sk, :sk)", f"{stream}#")
        )
        pins = {}
        for item in items:
            shard_id = str(item[SORT_KEY]["S"]).removeprefix(f"{stream}#")
            try:
                pins[shard_id] = int(attribute(item, "started_at", "N"))
            except CorruptStateError as exc:
                self._unreadable.skip("spark_latest", exc)
        return pins

    async def forget_latest_pin(self, stream: str, shard_id: str, started_at_ms: int) -> bool:
        return await self._table.delete_if(
            pin_key(self._app, stream, shard_id),
            {
                "ConditionExpression": "attribute_not_exists(pk) OR started_at = :seen",
                "ExpressionAttributeValues": {":seen": {"N": str(started_at_ms)}},
            },
        )

    # -- the group ----------------------------------------------------------------------------
    async def client_marks(self) -> frozenset[tuple[str, str]]:
        items = await self._table.query(client_pk(self._app))
        return frozenset((i[SORT_KEY]["S"], str(i.get("last_update", {}).get("N"))) for i in items)

    async def forget_group(self, streams: Iterable[str]) -> int:
        return await self._delete_partitions(group_partitions(self._app, streams))

    async def _delete_partitions(self, partitions: list[str]) -> int:
        keys: list[dict[str, Any]] = []
        for pk in partitions:
            items = await self._table.query(pk, projection=KEYS_ONLY)
            keys += [{PARTITION_KEY: i[PARTITION_KEY], SORT_KEY: i[SORT_KEY]} for i in items]
        await self._table.delete_many(keys)
        return len(keys)


def ledger_attributes(entry: LedgerEntry) -> dict[str, Any]:
    item: dict[str, Any] = {
        "count": {"N": str(entry.count)},
        "caught_up": {"BOOL": entry.caught_up},
        "shard_end": {"BOOL": entry.shard_end},
        "owner": {"S": entry.owner or "-"},
        "lease": {"N": str(entry.lease)},
    }
    if entry.end is not None:
        # A string: sequence numbers have up to 56 digits, beyond DynamoDB's 38-digit numbers.
        item["end_sequence_number"] = {"S": entry.end.sequence_number}
        item["end_sub_sequence_number"] = {"N": str(entry.end.sub_sequence_number)}
    if entry.last_arrival_ms is not None:
        item["last_arrival"] = {"N": str(entry.last_arrival_ms)}
    if entry.millis_behind is not None:
        item["millis_behind"] = {"N": str(entry.millis_behind)}
    return item


def decode_ledger_entry(item: dict[str, Any]) -> LedgerEntry:
    batch_text, stream, shard_id = item[SORT_KEY]["S"].split("#", 2)
    end = None
    if "end_sequence_number" in item:
        end = Position(item["end_sequence_number"]["S"], int(item["end_sub_sequence_number"]["N"]))
    arrival = item.get("last_arrival", {}).get("N")
    behind = item.get("millis_behind", {}).get("N")
    return LedgerEntry(
        batch=int(batch_text),
        stream=stream,
        shard_id=shard_id,
        end=end,
        count=int(item["count"]["N"]),
        caught_up=bool(item["caught_up"]["BOOL"]),
        shard_end=bool(item["shard_end"]["BOOL"]),
        last_arrival_ms=int(arrival) if arrival is not None else None,
        owner=item.get("owner", {}).get("S", ""),
        lease=int(item.get("lease", {}).get("N", "0")),
        millis_behind=int(behind) if behind is not None else None,
    )
