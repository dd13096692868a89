"""``kinesumer lag``: how far behind the group is, per shard, per stream and for the group, read
from the streams themselves (:func:`kinesumer.admin.probe_group_lag`), so that it is there with
no member running. Read-only.

A shard's figure is the age of its oldest record not yet checkpointed, by Kinesis's clock: 0
when every record is checkpointed, and for a closed parent that is finished. Each run reads,
per shard not finished, 1 GetShardIterator and usually 1 GetRecords, which count against the 5
a second per shard that every reader of the stream shares: run it every few seconds at most.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from ..admin import probe_group_lag
from ..core.lag import GroupLag
from .errors import EXIT_OK, EXIT_USAGE, CliError
from .lag_serve import DEFAULT_HOST, DEFAULT_INTERVAL, DEFAULT_PORT, serve_command
from .options import group_config
from .render import printable_lines, table
from .streams import lag_as_given, state_names_now

#: ``--serve``'s defaults: loopback only (the server has no authentication), a probe every
#: 10 s (:mod:`.lag_serve` says why).
SERVE_DEFAULTS = {"host": DEFAULT_HOST, "port": DEFAULT_PORT, "interval": DEFAULT_INTERVAL}


def lag_command(args: argparse.Namespace) -> int:
    """``kinesumer lag``: one probe, printed as text or one JSON document; with ``--serve``, a
    service (:mod:`.lag_serve`)."""
    serve_only = [*SERVE_DEFAULTS, "cloudwatch_namespace", "cloudwatch_endpoint"]
    given = [
        "--" + name.replace("_", "-")
        for name in serve_only
        if getattr(args, name, None) is not None
    ]
    if args.serve:
        if args.json:
            raise CliError("--json prints one probe; --serve serves /lag.json", EXIT_USAGE)
        for name, value in SERVE_DEFAULTS.items():
            if getattr(args, name, None) is None:
                setattr(args, name, value)
        return serve_command(args)
    if given:
        raise CliError(f"{', '.join(given)} only with --serve", EXIT_USAGE)
    config = group_config(args)
    names = state_names_now(config, args.stream)
    figure = asyncio.run(probe_group_lag(config, names.keys_list() or None))
    figure = lag_as_given(figure, names)
    if args.json:
        print(json.dumps(figure.to_json(), indent=2))
    else:
        print(printable_lines(lag_lines(figure)))
    return EXIT_OK


def lag_lines(figure: GroupLag) -> list[str]:
    """The text ``kinesumer lag`` prints: the group's maximum, then per stream its maximum and
    a table of its shards."""
    count = len(figure.shards)
    lines = [
        f"app {figure.app}  table {figure.table}  group lag {_ms(figure.max_millis_behind)} "
        f"(the most of {count} shard{'' if count == 1 else 's'})"
    ]
    for stream, most in sorted(figure.streams.items()):
        rows = [
            [
                row.shard_id,
                row.owner or "-",
                "finished" if row.finished else (row.checkpoint or "-"),
                _ms(row.millis_behind),
            ]
            for row in figure.shards
            if row.stream == stream
        ]
        lines += ["", f"stream {stream}: lag {_ms(most)}"]
        lines += table(["SHARD", "OWNER", "CHECKPOINT", "LAG"], rows) if rows else ["  (no shards)"]
    if not figure.stream_names:
        lines += ["", "no streams: name one with --stream, or start a member of this app"]
    return lines


def _ms(millis: int) -> str:
    return f"{millis} ms"
