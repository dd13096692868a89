"""The group's shards as the state table shows them: lineage from the shard cache, owner and
position from the checkpoint items, the Spark source's ``LATEST`` pins. Read through the
library's own state store, so every reader (``kinesumer status``, ``checkpoints``, the lag
probe of :mod:`kinesumer.admin`) parses the items exactly as the consumers write them.

It lives here, below both the command line and :mod:`kinesumer.admin`, because both read it:
the command line calls the admin functions, so the view cannot live in ``cli/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from ..aws import ClientFactory, RequestStats
from ..config import Config
from ..models import Checkpoint, ClientInfo, Shard
from .base import MembershipView, PublishedMembers, ShardCache
from .dynamodb.store import DynamoDBStateStore

__all__ = ["ShardView", "TableReads", "iso_time", "open_table", "stream_shards"]


class TableReads(Protocol):
    """The reads of the state table that a view of the group needs: what both the DynamoDB
    store and ``kinesumer.testing.MemoryState`` answer, so the operator's views work on
    either."""

    async def list_clients(self) -> list[ClientInfo]: ...

    async def read_view_head(self, *, consistent: bool) -> MembershipView | None: ...

    async def read_view_members(self, members_key: str) -> PublishedMembers | None: ...

    async def cached_streams(self) -> list[str]: ...

    async def load_shard_cache(self, stream: str) -> ShardCache | None: ...

    async def get_checkpoints(
        self, stream: str, shard_ids: Iterable[str] | None = None
    ) -> dict[str, Checkpoint]: ...

    async def latest_pins(self, stream: str) -> dict[str, int]: ...


@dataclass(frozen=True)
class ShardView:
    """One shard: lineage from the shard cache, position and owner from its checkpoint."""

    stream: str
    shard: Shard
    checkpoint: Checkpoint | None
    owner_live: bool
    lag_ms: int | None  # MillisBehindLatest the (live) owner reports; None when unknown
    efo_stalls: int = 0  # enhanced fan-out stalls the (live) owner reports
    #: Where the app's Spark queries first opened the shard at LATEST (epoch ms), if they did.
    spark_pin_ms: int | None = None

    @property
    def shard_id(self) -> str:
        return self.shard.shard_id

    @property
    def owner(self) -> str | None:
        return self.checkpoint.owner if self.checkpoint else None

    @property
    def finished(self) -> bool:
        return bool(self.checkpoint and self.checkpoint.finished)

    @property
    def position(self) -> str | None:
        """The checkpointed position (``sequence[/sub-sequence]``), or None."""
        checkpoint = self.checkpoint
        if checkpoint is None or not checkpoint.sequence_number:
            return None
        sub = checkpoint.sub_sequence_number
        return checkpoint.sequence_number + (f"/{sub}" if sub else "")

    @property
    def started_at_ms(self) -> int | None:
        """Where a LATEST read of the shard began (epoch ms, Kinesis's clock), while it has no
        position: readers resume there, whatever their initial position, until a position is
        checkpointed or ``checkpoints reset`` forgets it."""
        return self.checkpoint.started_at_ms if self.checkpoint else None

    @property
    def resumes_at(self) -> str:
        """Where the next reader of the shard starts, as the tables show it."""
        if self.position is not None:
            return self.position
        if self.started_at_ms is not None:
            return f"started at {iso_time(self.started_at_ms)} (LATEST)"
        if self.spark_pin_ms is not None:
            return f"Spark started at {iso_time(self.spark_pin_ms)} (LATEST)"
        return "-"

    @property
    def state(self) -> str:
        """finished: read to SHARD_END; owned: a live member reads it; stale: its owner is no
        longer live (another member takes it over); free: nobody owns it."""
        if self.finished:
            return "finished"
        if self.owner is None:
            return "free"
        return "owned" if self.owner_live else "stale"


async def stream_shards(
    store: TableReads, stream: str, live: dict[str, ClientInfo]
) -> tuple[ShardView, ...]:
    """Every shard of ``stream`` the table knows: from the shard cache and the checkpoints (a
    checkpoint can outlive its shard in the cache, and a new shard has no checkpoint yet)."""
    cache = await store.load_shard_cache(stream)
    checkpoints = await store.get_checkpoints(stream)
    pins = await store.latest_pins(stream)
    shards = cache.by_id() if cache is not None else {}
    for shard_id in checkpoints:
        shards.setdefault(shard_id, Shard(shard_id))
    views = []
    for shard_id in sorted(shards):
        checkpoint = checkpoints.get(shard_id)
        owner = checkpoint.owner if checkpoint else None
        lag = live[owner].owned.get(f"{stream}/{shard_id}") if owner in live else None
        stalls = live[owner].efo_stalls.get(f"{stream}/{shard_id}", 0) if owner in live else 0
        views.append(
            ShardView(
                stream=stream,
                shard=shards[shard_id],
                checkpoint=checkpoint,
                owner_live=owner in live,
                lag_ms=None if lag is None or lag < 0 else lag,
                efo_stalls=stalls,
                spark_pin_ms=pins.get(shard_id),
            )
        )
    return tuple(views)


def iso_time(ms: int) -> str:
    """Epoch milliseconds as an ISO 8601 UTC time, to the millisecond."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


@contextlib.asynccontextmanager
async def open_table(config: Config) -> AsyncIterator[tuple[Any, DynamoDBStateStore]]:
    """A DynamoDB client and the library's state store on it, after checking the table."""
    async with ClientFactory(config).dynamodb() as db:
        store = DynamoDBStateStore(db, config.dynamodb_table, config.app, RequestStats())
        await store.check()
        yield db, store
