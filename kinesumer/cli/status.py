"""``kinesumer status``: the group once, or every ``--watch`` seconds until Ctrl-C (text, or one
JSON document per refresh)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .controls import controls_json, controls_lines, status_controls
from .errors import EXIT_OK
from .options import group_config
from .render import printable_lines, render
from .streams import state_names
from .view import collect, open_table

__all__ = ["open_table", "status_command"]


def status_command(args: argparse.Namespace) -> int:
    """``kinesumer status``: once, or every ``--watch`` seconds until Ctrl-C."""
    try:
        return asyncio.run(_status(args))
    except KeyboardInterrupt:
        if args.watch is None:
            raise
        return EXIT_OK  # the way to end --watch


async def _status(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    config = group_config(args)
    names = await state_names(config, args.stream)
    async with open_table(config) as (_, store):
        while True:
            controls = status_controls(args)
            status = await collect(
                store,
                app=args.app,
                table=args.table,
                client_timeout=args.client_timeout,
                streams=names.keys_list(),
                controls=controls,
                shown_as={key: names.given(key) for key in names.keys_list()},
            )
            if args.json:
                document = {**status.to_json(), "controls": controls_json(controls)}
                text = json.dumps(document, indent=None if args.watch else 2)
            else:
                text = printable_lines(render(status) + controls_lines(controls))
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
