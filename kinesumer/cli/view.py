"""The group as the state table shows it, for ``status``, ``checkpoints`` and the demo: members,
leader, shards, owners, checkpoints and lag, read through the library's own state store (so the
command line parses client, shard-cache and checkpoint items exactly as the consumers write them).

- members: the client items; live and leader are decided by the pure :mod:`kinesumer.core`
  functions, with the same ``client_timeout`` the members use, so the command line and the group
  agree on who is alive;
- streams: those with a shard cache, plus the streams live members say they consume;
- shards: the shard cache (lineage, closed) and the checkpoint items (``owner``, ``lease``,
  position, ``finished``, and without a position the recorded ``LATEST`` start that readers
  resume from), plus the Spark source's ``LATEST`` pins; lag is what the owner reports in its
  client item's ``owned`` map.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..aws import ClientFactory, RequestStats
from ..config import Config
from ..core import leader_of, live_clients
from ..core.controls import Controls, controlled_leader
from ..models import Checkpoint, ClientInfo, Shard
from ..statestore.dynamodb.store import DynamoDBStateStore


@dataclass(frozen=True)
class MemberView:
    """A registered member as the table shows it."""

    info: ClientInfo
    live: bool
    leader: bool
    shards: tuple[str, ...] = ()  # "stream/shard" it owns according to the checkpoint items

    @property
    def client_id(self) -> str:
        return self.info.client_id


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


@dataclass(frozen=True)
class GroupStatus:
    app: str
    table: str
    now_ms: int
    client_timeout: float
    members: tuple[MemberView, ...]
    streams: dict[str, tuple[ShardView, ...]] = field(default_factory=dict)

    @property
    def leader(self) -> str | None:
        return next((m.client_id for m in self.members if m.leader), None)

    @property
    def live_ids(self) -> list[str]:
        return [m.client_id for m in self.members if m.live]

    def to_json(self) -> dict[str, Any]:
        """The document ``kinesumer status --json`` prints: stable keys, for scripts."""
        return {
            "app": self.app,
            "table": self.table,
            "time": iso_time(self.now_ms),
            "client_timeout": self.client_timeout,
            "leader": self.leader,
            "members": [
                {
                    "client_id": m.client_id,
                    "live": m.live,
                    "leader": m.leader,
                    "host": m.info.host,
                    "pid": m.info.pid,
                    "version": m.info.version,
                    "streams": sorted(m.info.streams),
                    "last_update": iso_time(m.info.last_update_ms),
                    "heartbeat_age_seconds": round((self.now_ms - m.info.last_update_ms) / 1000, 3),
                    "shards": list(m.shards),
                }
                for m in self.members
            ],
            "streams": [
                {"stream": stream, "shards": [shard_json(s) for s in shards]}
                for stream, shards in sorted(self.streams.items())
            ],
        }


def shard_json(view: ShardView) -> dict[str, Any]:
    checkpoint = view.checkpoint
    return {
        "stream": view.stream,
        "shard_id": view.shard_id,
        "parents": list(view.shard.parents),
        "closed": view.shard.closed,
        "state": view.state,
        "owner": view.owner,
        "owner_live": view.owner_live,
        "lease": checkpoint.lease if checkpoint else None,
        "sequence_number": checkpoint.sequence_number if checkpoint else None,
        "sub_sequence_number": checkpoint.sub_sequence_number if checkpoint else None,
        "finished": view.finished,
        "started_at": None if view.started_at_ms is None else iso_time(view.started_at_ms),
        "spark_latest_pin": None if view.spark_pin_ms is None else iso_time(view.spark_pin_ms),
        "millis_behind_latest": view.lag_ms,
        "efo_stalls": view.efo_stalls,
        "last_update": iso_time(checkpoint.last_update_ms) if checkpoint else None,
    }


async def collect(
    store: DynamoDBStateStore,
    *,
    app: str,
    table: str,
    client_timeout: float,
    streams: Sequence[str] = (),
    controls: Controls | None = None,
) -> GroupStatus:
    """Read the group's state. ``streams``: only these (default: every stream the app has a
    shard cache for or a live member consumes)."""
    clients = await store.list_clients()
    now_ms = int(time.time() * 1000)
    live = {c.client_id: c for c in live_clients(clients, now_ms, int(client_timeout * 1000))}
    leader = leader_of(sorted(live))
    if controls is not None:  # step-downs move the leader (kinesumer.core.controls)
        leader = controlled_leader(sorted(live), controls, now_ms)
    names = list(streams)
    if not names:
        found = set(await store.cached_streams())
        for client in live.values():
            found |= client.streams
        names = sorted(found)
    views: dict[str, tuple[ShardView, ...]] = {}
    owned: dict[str, list[str]] = {}
    for stream in names:
        views[stream] = await stream_shards(store, stream, live)
        for view in views[stream]:
            if view.owner is not None and not view.finished:
                owned.setdefault(view.owner, []).append(f"{stream}/{view.shard_id}")
    members = tuple(
        MemberView(
            info=c,
            live=c.client_id in live,
            leader=c.client_id == leader,
            shards=tuple(owned.get(c.client_id, ())),
        )
        for c in sorted(clients, key=lambda c: (c.client_id not in live, c.client_id))
    )
    return GroupStatus(app, table, now_ms, client_timeout, members, views)


async def stream_shards(
    store: DynamoDBStateStore, stream: str, live: dict[str, ClientInfo]
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
