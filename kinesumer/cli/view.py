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

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core import leader_of, live_clients
from ..core.controls import Controls, controlled_leader
from ..errors import ConfigError
from ..models import ClientInfo
from ..statestore.dynamodb.store import DynamoDBStateStore

# The shard view and the table's opening live below the command line, in the state store
# (the admin functions the commands call read them too); the commands reach them through here.
from ..statestore.group_view import ShardView, iso_time, open_table, stream_shards
from ..stream_refs import parse_stream

__all__ = [
    "GroupStatus",
    "MemberView",
    "ShardView",
    "collect",
    "iso_time",
    "open_table",
    "shard_json",
    "stream_shards",
]


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
    shown_as: Mapping[str, str] | None = None,
) -> GroupStatus:
    """Read the group's state. ``streams``: only these, by their state keys (default: every
    stream the app has a shard cache for or a live member consumes); ``shown_as``: a key ->
    the stream as the user named it (a home stream given by ARN is kept under its name)."""
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
    for stream in [s for s in names if not views[s] and _home_arn_alias(s, names)]:
        del views[stream]  # kept under its plain name, which its member announces beside it
    if shown_as:
        views = {
            shown_as.get(key, key): tuple(replace(v, stream=shown_as.get(key, key)) for v in rows)
            for key, rows in views.items()
        }
    for stream in views:
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


def _home_arn_alias(stream: str, names: Sequence[str]) -> bool:
    """Whether ``stream`` is a Kinesis stream ARN whose stream is also listed by its plain name:
    a member giving its home stream by ARN announces both, and the items are kept under the
    name (the ARN's own rows would be empty)."""
    try:
        ref = parse_stream(stream)
    except ConfigError:
        return False
    return ref.kind == "kinesis-arn" and ref.name in names
