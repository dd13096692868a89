"""The per-batch ledger: where each shard's read of a micro-batch stopped, first attempt wins.

Items live in the state table beside the group's own (``pk``/``sk`` from
:mod:`kinesumer.statestore.schema`)::

    pk = spark_ledger#<app>#<query id>      sk = <batch, 10 digits>#<stream>#<shard id>
    end_sequence_number (S, absent when the read found nothing), end_sub_sequence_number (N),
    count (N), caught_up (BOOL), shard_end (BOOL), last_arrival (N, epoch ms), owner (S),
    lease (N), written_at (N, epoch ms), expires_at (N, TTL epoch s), millis_behind (N: the
    last answer's MillisBehindLatest, how far the read stopped behind the shard's tip)

Executors write an item with ``attribute_not_exists(pk)``: the first attempt of a task fixes the
batch's range for that shard, and every later attempt (a retry, a speculative copy, a replay
after a restart) reads the item and returns exactly that range. The driver reads a batch's items
to form the next offset, and deletes the items of older batches once a batch commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ...aws import RequestStats
from ...models import Position
from ...statestore.dynamodb.codecs import ABSENT, item_key
from ...statestore.dynamodb.table import StateTable
from ...statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE


def ledger_pk(app: str, query: str) -> str:
    return f"spark_ledger#{app}#{query}"


def batch_prefix(batch: int) -> str:
    return f"{batch:010d}#"


def ledger_sk(batch: int, stream: str, shard_id: str) -> str:
    return f"{batch_prefix(batch)}{stream}#{shard_id}"


@dataclass(frozen=True)
class LedgerEntry:
    """What one read of (batch, shard) found: its last record (None: nothing), how many records,
    whether it reached the shard's tip or SHARD_END, and who planned it."""

    batch: int
    stream: str
    shard_id: str
    end: Position | None
    count: int
    caught_up: bool
    shard_end: bool
    last_arrival_ms: int | None = None
    owner: str = ""
    lease: int = 0
    millis_behind: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.stream, self.shard_id


class Ledger:
    """The ledger of one query (``query`` id) in one app's state table."""

    def __init__(
        self, client: Any, table: str, app: str, query: str, stats: RequestStats, ttl: int
    ) -> None:
        # The state store's table calls: the same retries, named errors and query paging.
        self._table = StateTable(client, table, stats)
        self._pk = ledger_pk(app, query)
        self._ttl = ttl

    def _key(self, batch: int, stream: str, shard_id: str) -> dict[str, Any]:
        return item_key(self._pk, ledger_sk(batch, stream, shard_id))

    async def get(self, batch: int, stream: str, shard_id: str) -> LedgerEntry | None:
        item = await self._table.get(self._key(batch, stream, shard_id))
        return None if item is None else _parse(item)

    async def record(self, entry: LedgerEntry) -> LedgerEntry:
        """Write ``entry`` unless an item for its (batch, shard) exists; return the item that
        holds (``entry``, or the one an earlier attempt wrote)."""
        item = self._key(entry.batch, entry.stream, entry.shard_id) | _attributes(entry)
        now = time.time()
        item["written_at"] = {"N": str(int(now * 1000))}
        item[TTL_ATTRIBUTE] = {"N": str(int(now) + self._ttl)}
        if await self._table.put_if(item, ABSENT) is not None:
            return entry
        existing = await self.get(entry.batch, entry.stream, entry.shard_id)
        if existing is None:  # pragma: no cover - deleted between the two calls: batch committed
            return entry
        return existing

    async def batch(self, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        """Every item of ``batch``, by ``(stream, shard_id)``."""
        items = await self._table.query(
            self._pk, sort_key=("begins_with(#sk, :sk)", batch_prefix(batch))
        )
        entries = (_parse(i) for i in items)
        return {e.key: e for e in entries}

    async def delete_before(self, batch: int) -> int:
        """Delete the items of batches before ``batch``; returns how many."""
        keys = await self._table.query(
            self._pk,
            projection=f"{PARTITION_KEY}, {SORT_KEY}",
            sort_key=("#sk < :sk", batch_prefix(batch)),
        )
        await self._table.delete_many(keys)
        return len(keys)


def _attributes(entry: LedgerEntry) -> dict[str, Any]:
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


def _parse(item: dict[str, Any]) -> LedgerEntry:
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
