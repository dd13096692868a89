"""``kinesumer create-table``: create the state table for local work (idempotent)."""

from __future__ import annotations

import argparse

from ..admin import create_state_table
from ..config import Config
from .errors import EXIT_OK


def create_table_command(args: argparse.Namespace) -> int:
    config = Config(
        app="kinesumer-cli",
        dynamodb_table=args.table,
        region=args.region,
        dynamodb_endpoint=args.dynamodb_endpoint,
        allow_insecure_endpoints=getattr(args, "allow_insecure_endpoints", False),
    )
    if create_state_table(config):
        print(f"created table {args.table!r} (keys pk/sk, on-demand, TTL on expires_at)")
    else:
        print(f"table {args.table!r} already exists with the right keys: nothing to do")
    return EXIT_OK
