"""``kinesumer checkpoints list|reset|set``: show checkpoints, and move them as an operator.

Without a position a shard resumes where a ``LATEST`` read of it began (its checkpoint's
``started_at``; for the Spark source's queries, their LATEST pin): ``list`` shows it, and
``reset`` forgets it with the position (else a backfill at ``TRIM_HORIZON`` after a ``LATEST``
run would still start there and read nothing older).

Moves go through the state store's own codec and condition
(:meth:`~kinesumer.statestore.dynamodb.DynamoDBStateStore.move_checkpoint`): conditional on the
lease read just before, so a racing claim makes them fail, never clobber; and they refuse a shard
a live member owns (or one the table does not know) unless ``--force``, before writing anything.
Whether an owner is live is judged by the members' own rule, with the group's ``client_timeout``
(:mod:`.liveness`): no clock of this host is compared with the owner's stamps.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from typing import Any

from ..core import live_clients
from ..models import Position
from ..statestore.dynamodb.store import DynamoDBStateStore
from . import view
from .errors import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CliError
from .liveness import live_owners
from .options import group_config
from .render import printable, printable_lines, shard_table
from .streams import Names, state_names


def checkpoints_command(args: argparse.Namespace) -> int:
    """``kinesumer checkpoints list|reset|set``."""
    return asyncio.run(_checkpoints(args))


async def _checkpoints(args: argparse.Namespace) -> int:
    config = group_config(args)
    # Looked up by state key (a home stream given by ARN: under its name), shown as given.
    names = await state_names(config, [args.stream] if args.stream else [])
    async with view.open_table(config) as (_, store):
        now_ms = int(time.time() * 1000)
        if args.action == "list":  # a display: the heartbeat ages by this host's clock
            clients = await store.list_clients()
            timeout_ms = int(args.client_timeout * 1000)
            live = {c.client_id: c for c in live_clients(clients, now_ms, timeout_ms)}
            return await _list(args, store, live, now_ms, names)
        return await _move_checkpoints(args, store, names[args.stream])


async def _list(
    args: argparse.Namespace,
    store: DynamoDBStateStore,
    live: dict[str, Any],
    now_ms: int,
    names: Names,
) -> int:
    keys = names.keys_list() if args.stream else await store.cached_streams()
    streams = [names.given(key) for key in keys]
    shards = [
        dataclasses.replace(s, stream=names.given(key))
        for key in keys
        for s in await view.stream_shards(store, key, live)
    ]
    shards = [s for s in shards if args.shard in (None, s.shard_id)]
    if args.json:
        print(json.dumps([view.shard_json(s) for s in shards], indent=2))
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
            print(printable_lines([f"stream {stream}", *shard_table(rows, now_ms, lease=True)]))
    return EXIT_OK


async def _move_checkpoints(args: argparse.Namespace, store: DynamoDBStateStore, key: str) -> int:
    """Move the shards of ``args.stream``, kept under ``key`` in the table."""
    stream = args.stream  # in messages, as the user named it
    if args.action == "reset" and not args.shard and not args.all_shards:
        raise CliError("reset needs --shard ID or --all-shards", EXIT_USAGE)
    known = {s.shard_id: s for s in await view.stream_shards(store, key, {})}
    targets = [args.shard] if args.shard else sorted(known)
    owners = {known[t].owner for t in targets if t in known and not known[t].finished}
    # Judged as the members judge each other, with the group's timeout (--force: no waiting).
    named = {o for o in owners if o}
    live = await live_owners(store, named, args.client_timeout, watch=not args.force)
    known = {k: dataclasses.replace(s, owner_live=s.owner in live) for k, s in known.items()}
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
        shard = known.get(shard_id)
        seen = shard.checkpoint if shard is not None else None
        # Where readers resume without a position (a recorded LATEST start, the Spark source's
        # LATEST pin) is forgotten by a reset too, or it would still win over the initial
        # position. A set moves past both: its position is read first.
        pin = shard.spark_pin_ms if shard is not None and position is None else None
        if position is None and (shard is None or shard.resumes_at == "-"):
            print(f"{stream}/{shard_id}: no position to reset (starts at the initial position)")
            if shard is None or not shard.finished:
                continue
        forgets = seen is not None and (
            seen.sequence_number is not None or seen.started_at_ms is not None or seen.finished
        )
        # The pin first, then the checkpoint: a query claiming the shard between the two
        # would otherwise record the pin's instant into the freshly reset item (the move is
        # conditional on the claim it read, so a claim between them makes it fail instead).
        if pin is not None and not await store.forget_latest_pin(key, shard_id, pin):
            conflicts += 1
            print(
                f"kinesumer: the Spark LATEST pin of {stream}/{shard_id} changed while it was "
                f"being removed: run the command again",
                file=sys.stderr,
            )
            continue
        moves = position is not None or forgets
        if moves and not await store.move_checkpoint(key, shard_id, seen, position):
            conflicts += 1
            print(
                f"kinesumer: {stream}/{shard_id} changed while it was being written (a member "
                f"claimed it or moved its checkpoint): "
                f"{'only its Spark pin was removed' if pin is not None else 'nothing written'}; "
                f"run the command again",
                file=sys.stderr,
            )
            continue
        was = shard.resumes_at if shard is not None else "-"
        was = seen.sequence_number if seen and seen.sequence_number else was
        was = "no position" if was == "-" else was
        taken = ""
        if seen and seen.owner in live:  # the id comes from the table: escaped, as status does
            taken = f"; taken from live member {printable(seen.owner)}"
        if position is None:
            print(
                f"{stream}/{shard_id}: reset (was {was}); restarts at the initial position{taken}"
            )
        else:
            print(f"{stream}/{shard_id}: set to {position.sequence_number} (was {was}){taken}")
        if seen is not None and seen.finished:
            print(f"{stream}/{shard_id}: was finished; it is read again after the next shard sync")
    return EXIT_REFUSED if conflicts else EXIT_OK
