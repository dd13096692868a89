"""The per-batch ledger: where each shard's read of a micro-batch stopped, first attempt wins.

Items live in the state table beside the group's own, written and read through the state
store (:mod:`kinesumer.statestore.spark`; the item layout is in
:mod:`kinesumer.statestore.dynamodb.spark`)::

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

from ...statestore.spark import LedgerEntry, SparkSourceStore

__all__ = ["Ledger", "LedgerEntry"]


class Ledger:
    """The ledger of one query (``query`` id), in the state store of the source's app."""

    def __init__(self, store: SparkSourceStore, query: str, ttl: int) -> None:
        self._store = store
        self._query = query
        self._ttl = ttl

    async def get(self, batch: int, stream: str, shard_id: str) -> LedgerEntry | None:
        return await self._store.ledger_entry(self._query, batch, stream, shard_id)

    async def record(self, entry: LedgerEntry) -> LedgerEntry:
        """Write ``entry`` unless an item for its (batch, shard) exists; return the item that
        holds (``entry``, or the one an earlier attempt wrote)."""
        return await self._store.add_ledger_entry(self._query, entry, self._ttl)

    async def batch(self, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        """Every item of ``batch``, by ``(stream, shard_id)``."""
        return await self._store.ledger_batch(self._query, batch)

    async def delete_before(self, batch: int) -> int:
        """Delete the items of batches before ``batch``; returns how many."""
        return await self._store.delete_ledger_before(self._query, batch)
