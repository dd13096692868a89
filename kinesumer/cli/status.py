"""The state-table side of the ``kinesumer`` command: ``status`` and ``checkpoints`` (and what
``demo`` shows), how they read the table, print it, and move checkpoints.

Everything comes from one DynamoDB table, through the library's own state store (so the CLI parses
client, shard-cache and checkpoint items exactly as the consumers write them):

- members: the client items (``pk=client#<app>``); live and leader are decided by the pure
  :mod:`kinesumer.core` functions, with the same ``client_timeout`` the members use, so the CLI
  and the group agree on who is alive;
- streams: the shard-cache head items (``pk=shard_cache#<app>``, ``sk=<stream>``; the chunk items
  of a cache body have ``#`` in ``sk``), plus the streams live members say they consume;
- shards: the shard cache (lineage, closed) and the checkpoint items (``owner``, ``lease``,
  position, ``finished``); lag is what the owner reports in its client item's ``owned`` map.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

from ..aws import RetryStats, boto_config, error_code, session_for
from ..config import Config
from ..core import leader_of, live_clients
from ..models import Checkpoint, ClientInfo, Position, Shard
from ..statestore.dynamodb.store import DynamoDBStateStore
from ..statestore.schema import PARTITION_KEY, SORT_KEY, checkpoint_pk, shard_cache_pk

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure with a one-line message for the user and the exit code to end with."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


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
        return leader_of([m.client_id for m in self.members if m.live])

    @property
    def live_ids(self) -> list[str]:
        return [m.client_id for m in self.members if m.live]

    def to_json(self) -> dict[str, Any]:
        """The document ``kinesumer status --json`` prints: stable keys, for scripts."""
        return {
            "app": self.app,
            "table": self.table,
            "time": _iso(self.now_ms),
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
                    "last_update": _iso(m.info.last_update_ms),
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
        "millis_behind_latest": view.lag_ms,
        "last_update": _iso(checkpoint.last_update_ms) if checkpoint else None,
    }


async def cached_streams(db: Any, table: str, app: str) -> list[str]:
    """Streams that have a shard cache for ``app``: the head items, whose ``sk`` is the bare
    stream name (stream names cannot contain ``#``; the cache body chunks' keys do)."""
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": f"{PARTITION_KEY} = :pk",
        "ExpressionAttributeValues": {":pk": {"S": shard_cache_pk(app)}},
        "ProjectionExpression": SORT_KEY,
        "ConsistentRead": True,
    }
    names: list[str] = []
    while True:
        response = await db.query(**kwargs)
        names += [
            i[SORT_KEY]["S"] for i in response.get("Items", []) if "#" not in i[SORT_KEY]["S"]
        ]
        if "LastEvaluatedKey" not in response:
            return sorted(names)
        kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]


async def collect(
    db: Any,
    store: DynamoDBStateStore,
    *,
    app: str,
    table: str,
    client_timeout: float,
    streams: Sequence[str] = (),
) -> GroupStatus:
    """Read the group's state. ``streams``: only these (default: every stream the app has a
    shard cache for or a live member consumes)."""
    clients = await store.list_clients()
    now_ms = int(time.time() * 1000)
    live = {c.client_id: c for c in live_clients(clients, now_ms, int(client_timeout * 1000))}
    leader = leader_of(sorted(live))
    names = list(streams)
    if not names:
        found = set(await cached_streams(db, table, app))
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
    shards = cache.by_id() if cache is not None else {}
    for shard_id in checkpoints:
        shards.setdefault(shard_id, Shard(shard_id))
    views = []
    for shard_id in sorted(shards):
        checkpoint = checkpoints.get(shard_id)
        owner = checkpoint.owner if checkpoint else None
        lag = live[owner].owned.get(f"{stream}/{shard_id}") if owner in live else None
        views.append(
            ShardView(
                stream=stream,
                shard=shards[shard_id],
                checkpoint=checkpoint,
                owner_live=owner in live,
                lag_ms=None if lag is None or lag < 0 else lag,
            )
        )
    return tuple(views)


# -- text -------------------------------------------------------------------------------------
def render(status: GroupStatus) -> list[str]:
    """The text ``kinesumer status`` prints: members (``*`` marks the leader), then one table of
    shards per stream."""
    live = len(status.live_ids)
    lines = [
        f"app {status.app}  table {status.table}  {_iso(status.now_ms)}  "
        f"{live} live member{'' if live == 1 else 's'} (client timeout {status.client_timeout:g}s)",
        "",
    ]
    if status.members:
        rows = [
            [
                ("* " if m.leader else "  ") + m.client_id,
                "live" if m.live else "dead",
                f"{(status.now_ms - m.info.last_update_ms) / 1000:.1f}s ago",
                f"{m.info.host}/{m.info.pid}",
                ",".join(sorted(m.info.streams)) or "-",
                str(len(m.shards)),
            ]
            for m in status.members
        ]
        lines += table(["  MEMBER", "STATE", "HEARTBEAT", "HOST/PID", "STREAMS", "SHARDS"], rows)
        lines.append("  (* leader: the lowest live client id)")
    else:
        lines.append("no members registered")
    for stream, shards in sorted(status.streams.items()):
        finished = sum(1 for s in shards if s.finished)
        lines += ["", f"stream {stream}: {len(shards)} shards, {finished} finished"]
        lines += shard_table(shards, status.now_ms)
    if not status.streams:
        lines += ["", "no streams: no member has joined this app yet"]
    return lines


def shard_table(shards: Iterable[ShardView], now_ms: int, *, lease: bool = False) -> list[str]:
    headers = ["SHARD", "STATE", "OWNER", "CHECKPOINT", "LAG", "UPDATED"]
    if lease:
        headers.insert(3, "LEASE")
    rows = []
    for view in shards:
        checkpoint = view.checkpoint
        position = "-"
        if checkpoint and checkpoint.sequence_number:
            position = checkpoint.sequence_number
            if checkpoint.sub_sequence_number:
                position += f"/{checkpoint.sub_sequence_number}"
        row = [
            view.shard_id,
            view.state,
            view.owner or "-",
            position,
            "-" if view.lag_ms is None else f"{view.lag_ms} ms",
            _age(now_ms, checkpoint.last_update_ms) if checkpoint else "-",
        ]
        if lease:
            row.insert(3, str(checkpoint.lease) if checkpoint else "-")
        rows.append(row)
    return table(headers, rows) if rows else ["  (no shards known yet)"]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, indented by two."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return [
        "  " + "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _age(now_ms: int, then_ms: int) -> str:
    if not then_ms:
        return "-"
    seconds = max(0.0, (now_ms - then_ms) / 1000)
    return f"{seconds:.1f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


# -- state table access -----------------------------------------------------------------------
@contextlib.asynccontextmanager
async def open_table(config: Config) -> AsyncIterator[tuple[Any, DynamoDBStateStore]]:
    """A DynamoDB client and the library's state store on it, after checking the table."""
    session = session_for(config)
    async with session.client(
        "dynamodb",
        region_name=config.effective_dynamodb_region,
        endpoint_url=config.dynamodb_endpoint,
        config=boto_config(),
    ) as db:
        store = DynamoDBStateStore(db, config.dynamodb_table, config.app, RetryStats())
        await store.check()
        yield db, store


# -- status -----------------------------------------------------------------------------------
def status_command(args: argparse.Namespace, config: Config) -> int:
    """``kinesumer status``: once, or every ``--watch`` seconds until Ctrl-C."""
    try:
        return asyncio.run(_status(args, config))
    except KeyboardInterrupt:
        if args.watch is None:
            raise
        return EXIT_OK  # the way to end --watch


async def _status(args: argparse.Namespace, config: Config) -> int:
    tty = sys.stdout.isatty()
    async with open_table(config) as (db, store):
        while True:
            status = await collect(
                db,
                store,
                app=args.app,
                table=args.table,
                client_timeout=args.client_timeout,
                streams=args.stream,
            )
            if args.json:
                text = json.dumps(status.to_json(), indent=None if args.watch else 2)
            else:
                text = "\n".join(render(status))
                if args.watch is not None:
                    text += f"\n\n(refreshing every {args.watch:g}s; Ctrl-C to stop)"
                    if tty:
                        text = "\x1b[H\x1b[2J" + text
                    else:
                        text += "\n"
            print(text, flush=True)
            if args.watch is None:
                return EXIT_OK
            await asyncio.sleep(args.watch)


# -- checkpoints ------------------------------------------------------------------------------
def checkpoints_command(args: argparse.Namespace, config: Config) -> int:
    """``kinesumer checkpoints list|reset|set``."""
    return asyncio.run(_checkpoints(args, config))


async def _checkpoints(args: argparse.Namespace, config: Config) -> int:
    async with open_table(config) as (db, store):
        now_ms = int(time.time() * 1000)
        clients = await store.list_clients()
        live = {
            c.client_id: c for c in live_clients(clients, now_ms, int(args.client_timeout * 1000))
        }
        if args.action == "list":
            streams = (
                [args.stream] if args.stream else await cached_streams(db, args.table, args.app)
            )
            shards = [s for stream in streams for s in await stream_shards(store, stream, live)]
            shards = [s for s in shards if args.shard in (None, s.shard_id)]
            if args.json:
                print(json.dumps([shard_json(s) for s in shards], indent=2))
                return EXIT_OK
            if not shards:
                raise CliError(
                    f"no checkpoints or shards known for app {args.app!r}"
                    + (f" and stream {args.stream!r}" if args.stream else "")
                    + ": has a member of this app consumed it? (names are case-sensitive)"
                )
            for stream in streams:
                rows = [s for s in shards if s.stream == stream]
                if rows:
                    print(f"stream {stream}")
                    print("\n".join(shard_table(rows, now_ms, lease=True)))
            return EXIT_OK
        return await _move_checkpoints(db, args, live, store)


async def _move_checkpoints(
    db: Any, args: argparse.Namespace, live: dict[str, Any], store: DynamoDBStateStore
) -> int:
    stream = args.stream
    known = {s.shard_id: s for s in await stream_shards(store, stream, live)}
    if args.action == "reset" and not args.shard and not args.all_shards:
        raise CliError("reset needs --shard ID or --all-shards", EXIT_USAGE)
    targets = [args.shard] if args.shard else sorted(known)
    position = Position(args.sequence, args.sub_sequence) if args.action == "set" else None
    refusals = []
    for shard_id in targets:
        shard = known.get(shard_id)
        if shard is None and not args.force:
            refusals.append(
                f"shard {shard_id!r} is not known in stream {stream!r} of app {args.app!r} (see "
                f"`kinesumer checkpoints list --stream {stream}`); --force writes it anyway"
            )
        elif shard is not None and shard.owner_live and not args.force:
            refusals.append(
                f"{stream}/{shard_id} is owned by live member {shard.owner!r}: stop the group "
                f"(or wait for the shard to move), or pass --force to take it from its owner"
            )
    if refusals:  # refuse before writing anything, so a command does all or nothing
        raise CliError("; ".join(refusals), EXIT_REFUSED)
    conflicts = 0
    for shard_id in targets:
        seen = known[shard_id].checkpoint if shard_id in known else None
        if position is None and (seen is None or seen.sequence_number is None):
            print(f"{stream}/{shard_id}: no position to reset (starts at the initial position)")
            if seen is None or not seen.finished:
                continue
        if not await write_checkpoint(db, args.table, args.app, stream, shard_id, seen, position):
            conflicts += 1
            print(
                f"kinesumer: {stream}/{shard_id} changed while it was being written (a member "
                f"claimed it or moved its checkpoint): nothing written; run the command again",
                file=sys.stderr,
            )
            continue
        was = seen.sequence_number if seen and seen.sequence_number else "no position"
        taken = f"; taken from live member {seen.owner}" if seen and seen.owner in live else ""
        if position is None:
            print(
                f"{stream}/{shard_id}: reset (was {was}); restarts at the initial position{taken}"
            )
        else:
            print(f"{stream}/{shard_id}: set to {position.sequence_number} (was {was}){taken}")
        if seen is not None and seen.finished:
            print(f"{stream}/{shard_id}: was finished; it is read again after the next shard sync")
    return EXIT_REFUSED if conflicts else EXIT_OK


async def write_checkpoint(
    db: Any,
    table: str,
    app: str,
    stream: str,
    shard_id: str,
    seen: Checkpoint | None,
    position: Position | None,
) -> bool:
    """Move (``position``) or remove (None) a checkpoint if it is still as ``seen``.

    The write bumps the lease and removes the owner, exactly as if the shard had been released
    and re-claimed: any member still holding the old lease has its next checkpoint write
    refused (so it cannot overwrite the new position) and drops the shard; the member the
    assignment gives it to claims it again and starts from here. False: the item changed since
    it was read (a claim, a handoff, a checkpoint under a new lease); nothing was written.
    """
    key = {PARTITION_KEY: {"S": checkpoint_pk(app, stream)}, SORT_KEY: {"S": shard_id}}
    now = {"N": str(int(time.time() * 1000))}
    try:
        if seen is None:
            item: dict[str, Any] = {**key, "lease": {"N": "1"}, "last_update": now}
            if position is not None:
                item["sequence_number"] = {"S": position.sequence_number}
                item["sub_sequence_number"] = {"N": str(position.sub_sequence_number)}
            await db.put_item(
                TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)"
            )
            return True
        values: dict[str, Any] = {
            ":lease": {"N": str(seen.lease)},
            ":next": {"N": str(seen.lease + 1)},
            ":now": now,
        }
        sets, removes = ["#lease = :next", "#lu = :now"], ["#owner", "#fin"]
        if position is not None:
            sets += ["#seq = :seq", "#sub = :sub"]
            values[":seq"] = {"S": position.sequence_number}
            values[":sub"] = {"N": str(position.sub_sequence_number)}
        else:
            removes += ["#seq", "#sub"]
        lease = (
            "(attribute_not_exists(#lease) OR #lease = :lease)"
            if not seen.lease
            else ("#lease = :lease")
        )
        if seen.owner is None:
            owner = "attribute_not_exists(#owner)"
        else:
            owner = "#owner = :owner"
            values[":owner"] = {"S": seen.owner}
        await db.update_item(
            TableName=table,
            Key=key,
            UpdateExpression=f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
            ConditionExpression=f"attribute_exists(pk) AND {lease} AND {owner}",
            ExpressionAttributeNames={
                "#lease": "lease",
                "#lu": "last_update",
                "#owner": "owner",
                "#fin": "finished",
                "#seq": "sequence_number",
                "#sub": "sub_sequence_number",
            },
            ExpressionAttributeValues=values,
        )
        return True
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
