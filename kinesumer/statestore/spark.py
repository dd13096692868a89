"""The Spark source's items in the state table: its per-batch ledger, its ``LATEST`` pins, and
what its driver reads and removes of its consumer group.

The Spark source (:mod:`kinesumer.spark.source`) talks only to :class:`SparkSourceStore`;
:class:`~kinesumer.statestore.dynamodb.DynamoDBStateStore` implements it beside
:class:`~kinesumer.statestore.base.StateStore`. As there, every write that can race is
conditional and says in its return value what holds after it: the caller never raises for a
refused condition.

A store is one app's (``DynamoDBStateStore(client, table, app, stats)``): a query's ledger lives
under the source's ``app``, its pins and its group's items under the group's app
(:mod:`kinesumer.spark.source.driver.groups`), so the source holds one store of each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..models import Position


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


@runtime_checkable
class SparkSourceStore(Protocol):
    """The Spark source's reads and writes of one app's items in the state table.

    Errors as :class:`~kinesumer.statestore.base.StateStore`'s: named errors for a missing
    table, a refused permission or an outage; :class:`~kinesumer.errors.CorruptStateError` for
    an item that cannot be read back.
    """

    # -- the per-batch ledger of query ``query`` (first attempt wins) -----------------------
    async def ledger_entry(
        self, query: str, batch: int, stream: str, shard_id: str
    ) -> LedgerEntry | None:
        """The entry of (batch, shard), strongly consistent; None when there is none."""

    async def add_ledger_entry(
        self, query: str, entry: LedgerEntry, ttl_seconds: int
    ) -> LedgerEntry:
        """Write ``entry`` unless its (batch, shard) has one (conditional on its absence), to
        expire ``ttl_seconds`` from now. Returns the entry that holds: ``entry``, or the one an
        earlier attempt wrote (a retry, a speculative copy, a replay after a restart)."""

    async def ledger_batch(self, query: str, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        """Every entry of ``batch``, by ``(stream, shard_id)`` (strongly consistent)."""

    async def delete_ledger_before(self, query: str, batch: int) -> int:
        """Delete the entries of batches before ``batch``; returns how many."""

    # -- LATEST pins: where the app's queries first opened each shard at LATEST ---------------
    async def latest_pin(self, stream: str, shard_id: str) -> int | None:
        """The shard's pin (epoch ms), strongly consistent; None when it has none."""

    async def add_latest_pin(
        self, stream: str, shard_id: str, started_at_ms: int, written_at_ms: int
    ) -> int:
        """Pin the shard at ``started_at_ms`` unless it is pinned already (conditional on the
        pin's absence: the first pin wins and never moves). Returns the pin that holds."""

    async def latest_pins(self, stream: str) -> dict[str, int]:
        """Every pin of ``stream``'s shards: shard id -> epoch ms (unreadable ones skipped)."""

    async def forget_latest_pin(self, stream: str, shard_id: str, started_at_ms: int) -> bool:
        """An operator's removal of a pin, if it still holds ``started_at_ms`` (or is gone
        already). False: it was pinned again since; it stays."""

    # -- the app's consumer group, as the driver sees it --------------------------------------
    async def client_marks(self) -> frozenset[tuple[str, str]]:
        """(client id, ``last_update`` as stored) of every client item, readable or not: two
        reads that differ saw a heartbeat or a join in between."""

    async def forget_group(self, streams: Iterable[str]) -> int:
        """Delete every item of the app's group (clients, shard caches, membership view,
        controls, pins, and the checkpoints of ``streams``); returns how many. Unconditional:
        the caller made sure no member is alive."""

    async def forget_ledger(self, query: str) -> int:
        """Delete every ledger entry of ``query``; returns how many."""
