"""``kinesumer pin|unpin|pins|step-down|rebalance``: the operator's controls of a group, through
the library's own calls (:mod:`kinesumer.admin`: conditional read-modify-writes of the
``controls#<app>`` item), and the lines ``kinesumer status`` adds about them."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..admin import (
    force_rebalance,
    list_pins,
    pin_shard,
    read_controls,
    step_down,
    unpin_shard,
)
from ..core.controls import Controls
from .errors import EXIT_OK
from .options import group_config
from .render import printable
from .view import iso_time

#: Said after every change: members read the controls on a bounded schedule.
DELAY_NOTE = "members apply it within about 10 s (or one heartbeat_interval, if longer)"


def pin_command(args: argparse.Namespace) -> int:
    controls = pin_shard(group_config(args), args.stream, args.shard, args.client_id)
    print(f"pinned {args.stream}/{args.shard} to {args.client_id} (controls v{controls.version})")
    print(DELAY_NOTE)
    return EXIT_OK


def unpin_command(args: argparse.Namespace) -> int:
    controls = unpin_shard(group_config(args), args.stream, args.shard)
    print(f"unpinned {args.stream}/{args.shard} (controls v{controls.version})")
    return EXIT_OK


def pins_command(args: argparse.Namespace) -> int:
    pins = list_pins(group_config(args))
    if args.json:
        rows = [{"stream": s, "shard_id": sid, "client_id": c} for (s, sid), c in pins.items()]
        print(json.dumps(rows, indent=2))
    elif not pins:
        print("no pins")
    else:
        for (stream, shard_id), client in pins.items():
            print(printable(f"{stream}/{shard_id} -> {client}"))
    return EXIT_OK


def step_down_command(args: argparse.Namespace) -> int:
    controls = step_down(group_config(args), args.client_id, args.seconds, drain=args.drain)
    if args.seconds == 0:
        print(f"{args.client_id} no longer stepped down (controls v{controls.version})")
    else:
        what = "leadership and its shards" if args.drain else "leadership"
        print(
            f"{args.client_id} steps down from {what} for {args.seconds:g}s "
            f"(controls v{controls.version})"
        )
    print(DELAY_NOTE)
    return EXIT_OK


def rebalance_command(args: argparse.Namespace) -> int:
    controls = force_rebalance(group_config(args))
    print(f"forced rebalance #{controls.rebalance} (controls v{controls.version})")
    print(DELAY_NOTE)
    return EXIT_OK


def status_controls(args: argparse.Namespace) -> Controls:
    """The controls ``status`` shows (read once per refresh)."""
    return read_controls(group_config(args))


def controls_lines(controls: Controls) -> list[str]:
    """What ``status`` prints about the controls (nothing when none were ever set)."""
    if controls.version == 0:
        return []
    now = int(time.time() * 1000)
    lines = ["", f"controls v{controls.version}: forced rebalances {controls.rebalance}"]
    for (stream, shard_id), client in sorted(controls.pins.items()):
        lines.append(f"  pin {stream}/{shard_id} -> {client}")
    for client, step in sorted(controls.step_downs.items()):
        if step.active(now):
            what = "leadership and shards" if step.drain else "leadership"
            lines.append(f"  {client} stepped down from {what} until {iso_time(step.until_ms)}")
    return lines


def controls_json(controls: Controls) -> dict[str, Any]:
    now = int(time.time() * 1000)
    return {
        "version": controls.version,
        "rebalance": controls.rebalance,
        "pins": [
            {"stream": s, "shard_id": sid, "client_id": c}
            for (s, sid), c in sorted(controls.pins.items())
        ],
        "step_downs": [
            {"client_id": c, "until": iso_time(s.until_ms), "drain": s.drain}
            for c, s in sorted(controls.step_downs.items())
            if s.active(now)
        ],
    }
