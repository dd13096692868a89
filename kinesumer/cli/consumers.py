"""``kinesumer deregister-consumer``: remove the app's enhanced fan-out stream consumer.

Members register the consumer (``Config(enhanced_fan_out=True)``) and never deregister it on
close: another member, or the next start, still reads through it. This command is the way to
remove it when the app stops using enhanced fan-out on a stream (AWS charges per consumer-shard
hour while it exists, and allows 20 consumers per stream).
"""

from __future__ import annotations

import argparse
import asyncio

from .errors import EXIT_OK
from .options import group_config


def add_deregister_consumer(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: list[argparse.ArgumentParser],
) -> None:
    command = commands.add_parser(
        "deregister-consumer",
        help="deregister the app's enhanced fan-out consumer of a stream",
        description="Deregister the stream consumer the app's members read through with "
        "enhanced fan-out (`consume --efo`). Members never do it on close. Members still "
        "running lose their subscriptions and register it again.",
        parents=parents,
    )
    command.add_argument(
        "--stream",
        required=True,
        help="the stream whose consumer goes: a name or a stream ARN (deregistered in the "
        "stream's own account and region)",
    )
    command.add_argument(
        "--consumer-name", help="the consumer's name (default: the app's name, as members use)"
    )
    command.set_defaults(handler=deregister_consumer_command)


def deregister_consumer_command(args: argparse.Namespace) -> int:
    # aioboto3: only when the command runs, not at every start of the command line.
    from ..kinesis.efo.consumers import deregister_stream_consumer

    config = group_config(args, enhanced_fan_out=True, consumer_name=args.consumer_name)
    name = config.effective_consumer_name
    # A stream ARN's consumer goes in its own account and region, through --account's role.
    if asyncio.run(deregister_stream_consumer(config, args.stream)):
        print(f"deregistered consumer {name!r} of stream {args.stream!r}")
    else:
        print(f"stream {args.stream!r} has no consumer named {name!r}: nothing to do")
    return EXIT_OK
