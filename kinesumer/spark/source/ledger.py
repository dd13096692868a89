"""The per-batch ledger: where each shard's read of a micro-batch stopped, first attempt wins.

Items live in the state table beside the group's own (``pk``/``sk`` from
:mod:`kinesumer.statestore.schema`)::

    pk = spark_ledger#<app>#<query id>      sk = <batch, 10 digits>#<stream>#<shard id>
    end_sequence_number (S, absent when the read found nothing), end_sub_sequence_number (N),
    count (N), caught_up (BOOL), shard_end (BOOL), last_arrival (N, epoch ms), owner (S),
    lease (N), written_at (N, epoch ms), expires_at (N, TTL epoch s)

Executors write an item with ``attribute_not_exists(pk)``: the first attempt of a task fixes the
batch's range for that shard, and every later attempt (a retry, a speculative copy, a replay
after a restart) reads the item and returns exactly that range. The driver reads a batch's items
to form the next offset, and deletes the items of older batches once a batch commits.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from ...aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ...errors import StateTableNotFoundError
from ...models import Position
from ...statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

T = TypeVar("T")


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

    @property
    def key(self) -> tuple[str, str]:
        return self.stream, self.shard_id


class Ledger:
    """The ledger of one query (``query`` id) in one app's state table."""

    def __init__(
        self, client: Any, table: str, app: str, query: str, stats: RequestStats, ttl: int
    ) -> None:
        self._db = client
        self._table = table
        self._pk = ledger_pk(app, query)
        self._stats = stats
        self._ttl = ttl

    async def _call(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call_with_retry(f"dynamodb.{operation}", fn, self._stats)
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise StateTableNotFoundError(
                    f"DynamoDB table {self._table!r} does not exist (the source's ledger lives "
                    f"there): provision it (infra/modules/state-table or `kinesumer create-table`)"
                ) from exc
            if is_denied(exc):
                raise denied(exc, f"dynamodb:{operation}", f"table {self._table!r}") from exc
            raise

    def _key(self, batch: int, stream: str, shard_id: str) -> dict[str, Any]:
        return {
            PARTITION_KEY: {"S": self._pk},
            SORT_KEY: {"S": ledger_sk(batch, stream, shard_id)},
        }

    async def get(self, batch: int, stream: str, shard_id: str) -> LedgerEntry | None:
        response = await self._call(
            "GetItem",
            lambda: self._db.get_item(
                TableName=self._table, Key=self._key(batch, stream, shard_id), ConsistentRead=True
            ),
        )
        item = response.get("Item")
        return None if item is None else _parse(item)

    async def record(self, entry: LedgerEntry) -> LedgerEntry:
        """Write ``entry`` unless an item for its (batch, shard) exists; return the item that
        holds (``entry``, or the one an earlier attempt wrote)."""
        item = self._key(entry.batch, entry.stream, entry.shard_id) | _attributes(entry)
        now = time.time()
        item["written_at"] = {"N": str(int(now * 1000))}
        item[TTL_ATTRIBUTE] = {"N": str(int(now) + self._ttl)}
        try:
            await self._call(
                "PutItem",
                lambda: self._db.put_item(
                    TableName=self._table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames={"#pk": PARTITION_KEY},
                ),
            )
            return entry
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
        existing = await self.get(entry.batch, entry.stream, entry.shard_id)
        if existing is None:  # pragma: no cover - deleted between the two calls: batch committed
            return entry
        return existing

    async def batch(self, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        """Every item of ``batch``, by ``(stream, shard_id)``."""
        items = await self._query(
            "#pk = :pk AND begins_with(#sk, :prefix)",
            {":pk": {"S": self._pk}, ":prefix": {"S": batch_prefix(batch)}},
        )
        entries = (_parse(i) for i in items)
        return {e.key: e for e in entries}

    async def delete_before(self, batch: int) -> int:
        """Delete the items of batches before ``batch``; returns how many."""
        items = await self._query(
            "#pk = :pk AND #sk < :prefix",
            {":pk": {"S": self._pk}, ":prefix": {"S": batch_prefix(batch)}},
            keys_only=True,
        )
        for start in range(0, len(items), 25):
            requests = [{"DeleteRequest": {"Key": i}} for i in items[start : start + 25]]
            while requests:
                response = await self._call(
                    "BatchWriteItem",
                    lambda r=requests: self._db.batch_write_item(  # type: ignore[misc]
                        RequestItems={self._table: r}
                    ),
                )
                requests = response.get("UnprocessedItems", {}).get(self._table, [])
        return len(items)

    async def _query(
        self, condition: str, values: dict[str, Any], keys_only: bool = False
    ) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": {"#pk": PARTITION_KEY, "#sk": SORT_KEY},
            "ExpressionAttributeValues": values,
            "ConsistentRead": True,
        }
        if keys_only:
            kwargs["ProjectionExpression"] = "#pk, #sk"
        items: list[dict[str, Any]] = []
        while True:
            response = await self._call("Query", lambda k=kwargs: self._db.query(**k))  # type: ignore[misc]
            items.extend(response.get("Items", []))
            last = response.get("LastEvaluatedKey")
            if not last:
                return items
            kwargs = {**kwargs, "ExclusiveStartKey": last}


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
    return item


def _parse(item: dict[str, Any]) -> LedgerEntry:
    batch_text, stream, shard_id = item[SORT_KEY]["S"].split("#", 2)
    end = None
    if "end_sequence_number" in item:
        end = Position(item["end_sequence_number"]["S"], int(item["end_sub_sequence_number"]["N"]))
    arrival = item.get("last_arrival", {}).get("N")
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
    )
