"""``kinesumer checkpoints rewind``: every shard of a stream to a time, through
:func:`kinesumer.admin.rewind_group` (the plan, the conditional writes, the shard cache), printed
as a table of each shard's old and new place, or as one JSON document."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from ..admin import RewindResult, rewind_group
from ..core.rewind import RewindTarget, ShardRewind
from ..models import Checkpoint
from ..statestore.group_view import iso_time
from .errors import EXIT_OK
from .options import group_config
from .render import printable_lines, table
from .streams import state_names_now


def rewind_command(args: argparse.Namespace) -> int:
    """``kinesumer checkpoints rewind``."""
    config = group_config(args)
    result = rewind_group(
        config,
        state_names_now(config, [args.stream])[args.stream],  # as the table keeps it
        to_time=args.to_time,
        by=args.by_duration,
        to=args.to,
        dry_run=args.dry_run,
    )
    result = dataclasses.replace(result, stream=args.stream)
    if args.json:
        print(json.dumps(result_json(result), indent=2))
    else:
        print(printable_lines(render(result)))
    return EXIT_OK


def render(result: RewindResult) -> list[str]:
    """The table: one row per shard, ancestors first."""
    moved = set(result.moved)
    rows = [
        [
            move.shard_id,
            old_place(move.seen),
            new_place(move.target),
            _state(move, moved, result.dry_run),
            move.reason,
        ]
        for move in result.shards
    ]
    head = "dry run: nothing written; " if result.dry_run else ""
    lines = [
        f"{head}app {result.app}  stream {result.stream}  rewind to {result.to}",
        *table(["SHARD", "WAS", "NOW", "", "WHY"], rows),
    ]
    if not result.shards:
        lines.append("  (the stream has no shards)")
    if not result.dry_run:
        lines.append(
            f"{len(moved)} shard(s) moved; running members drop what they buffered of them and "
            f"read them from the new place within their commit_interval"
            + ("" if result.cache_synced else "; the shard cache follows at the next shard sync")
        )
    return lines


def _state(move: ShardRewind, moved: set[str], dry_run: bool) -> str:
    if move.shard_id in moved:
        return "moved"
    if move.unchanged and (move.seen is None or move.seen.owner is None):
        return "unchanged"
    return "to move" if dry_run else "-"


def old_place(seen: Checkpoint | None) -> str:
    """Where the shard's item said the group resumes, before the rewind."""
    if seen is None:
        return "no checkpoint"
    if seen.finished:
        return "finished"
    if seen.sequence_number:
        sub = f"/{seen.sub_sequence_number}" if seen.sub_sequence_number else ""
        return f"after {seen.sequence_number}{sub}"
    if seen.started_at_ms is not None:
        return f"from {iso_time(seen.started_at_ms)}"
    return "initial position"


def new_place(target: RewindTarget) -> str:
    """Where the rewind makes the group resume."""
    if target.finished:
        return "finished"
    if target.position is not None:
        sub = target.position.sub_sequence_number
        return f"after {target.position.sequence_number}" + (f"/{sub}" if sub else "")
    if target.started_at_ms == 0:
        return "from the oldest record"
    return f"from {iso_time(target.started_at_ms or 0)}"


def result_json(result: RewindResult) -> dict[str, Any]:
    moved = set(result.moved)
    return {
        "app": result.app,
        "stream": result.stream,
        "to": result.to,
        "instant": None if result.instant_ms is None else iso_time(result.instant_ms),
        "dry_run": result.dry_run,
        "cache_synced": result.cache_synced,
        "shards": [
            {
                "shard_id": move.shard_id,
                "old": _checkpoint_json(move.seen),
                "new": _target_json(move.target),
                "was": old_place(move.seen),
                "now": new_place(move.target),
                "moved": move.shard_id in moved,
                "reason": move.reason,
            }
            for move in result.shards
        ],
    }


def _checkpoint_json(seen: Checkpoint | None) -> dict[str, Any] | None:
    if seen is None:
        return None
    return {
        "sequence_number": seen.sequence_number,
        "sub_sequence_number": seen.sub_sequence_number,
        "started_at": None if seen.started_at_ms is None else iso_time(seen.started_at_ms),
        "finished": seen.finished,
        "owner": seen.owner,
        "lease": seen.lease,
    }


def _target_json(target: RewindTarget) -> dict[str, Any]:
    position = target.position
    return {
        "sequence_number": None if position is None else position.sequence_number,
        "sub_sequence_number": None if position is None else position.sub_sequence_number,
        "started_at": None if target.started_at_ms is None else iso_time(target.started_at_ms),
        "finished": target.finished,
    }
