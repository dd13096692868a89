"""The ``kinesumer`` command: consume a stream as a group member, look at a group, move its
checkpoints, create the state table, and run a self-contained demo.

Design choices:

- argparse only, plain text output: the command must work wherever the library installs, and its
  output must survive pipes, ``grep`` and CI logs (the demo alone redraws in place, and only on a
  terminal).
- Every failure the user can fix prints one line saying what to do, with a documented exit code
  (``EXIT_CODES``); tracebacks only with ``--debug``.
- Reads and writes of the state table go through the library's own state store and key schema,
  so the CLI sees items exactly as the consumers write them; checkpoint moves are conditional
  writes on the lease that was read, like every write the consumers make.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from types import FrameType
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)

from .._version import __version__
from ..admin import create_state_table
from ..aws import error_code
from ..config import Config, InitialPosition
from ..consumer.sync import Kinesumer
from ..errors import ConfigError, KinesumerError, StateTableNotFoundError
from ..models import Record
from . import status as view
from .status import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
)

__all__ = [
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "CliError",
    "build_parser",
    "main",
]

EXIT_CODES = """\
exit codes:
  0    success; `consume` and `status --watch` also end with 0 when stopped by Ctrl-C or
       SIGTERM (after a clean close: checkpoints written, shards released)
  1    runtime error (AWS, state table, stream), or `demo` lost a record
  2    usage error: bad arguments or option values
  3    refused: `checkpoints set/reset` on a shard a live member owns, or on a shard the table
       does not know, without --force; or the checkpoint changed while it was being written
  130  interrupted (Ctrl-C or SIGTERM) before the command finished"""

DEFAULT_CLIENT_TIMEOUT: float = next(
    f.default for f in dataclasses.fields(Config) if f.name == "client_timeout"
)  # type: ignore[assignment]
_MAX_SEQUENCE_DIGITS = 128  # what the state store accepts when it reads a checkpoint back
_OPTION_OF_FIELD = {
    "app": "--app",
    "dynamodb_table": "--table",
    "region": "--region",
    "kinesis_endpoint": "--kinesis-endpoint",
    "dynamodb_endpoint": "--dynamodb-endpoint",
    "client_id": "--client-id",
    "initial_position": "--initial-position",
    "streams": "STREAM",
}

log = logging.getLogger("kinesumer.cli")


# -- entry point ------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="kinesumer: %(levelname)s %(name)s: %(message)s",
    )
    if not args.debug:
        # The CLI's reads retry like the library's; one warning per retry is noise here.
        logging.getLogger("kinesumer.aws").setLevel(logging.ERROR)
    previous = _raise_on_sigterm()
    try:
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except CliError as exc:
        _fail(args, str(exc))
        return exc.code
    except KeyboardInterrupt:
        _fail(args, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except Exception as exc:
        message, code = describe_error(exc, args)
        if message is None:
            raise
        _fail(args, message)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _fail(args: argparse.Namespace, message: str) -> None:
    if args.debug:
        traceback.print_exc()
    print(f"kinesumer: {message}", file=sys.stderr)


def describe_error(exc: BaseException, args: argparse.Namespace) -> tuple[str | None, int]:
    """The one line (and exit code) for an error the user can act on; None: a bug, re-raise."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, (NoCredentialsError, NoRegionError, EndpointConnectionError)):
        exc = cause  # the library retried it as a network error: say what it really is
    if isinstance(exc, ConfigError):
        option = _OPTION_OF_FIELD.get(exc.field, exc.field)
        return f"{option}: {str(exc).split(': ', 1)[-1]}", EXIT_USAGE
    if isinstance(exc, StateTableNotFoundError):
        table = getattr(args, "table", "?")
        flags = "".join(
            f" {flag} {value}"
            for flag, value in (
                ("--region", getattr(args, "region", None)),
                ("--dynamodb-endpoint", getattr(args, "dynamodb_endpoint", None)),
            )
            if value
        )
        return (
            f"table {table!r} does not exist: create it with `kinesumer create-table --table "
            f"{table}{flags}` (production: Terraform, infra/modules/state-table)",
            EXIT_ERROR,
        )
    if isinstance(exc, KinesumerError):
        return str(exc), EXIT_ERROR
    if isinstance(exc, NoCredentialsError):
        return (
            "no AWS credentials found: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (any values do for a local endpoint)",
            EXIT_ERROR,
        )
    if isinstance(exc, NoRegionError):
        return "no AWS region: pass --region or set AWS_REGION", EXIT_ERROR
    if isinstance(exc, EndpointConnectionError):
        return f"{exc}: is the endpoint right and the server running?", EXIT_ERROR
    if isinstance(exc, ClientError):
        return f"AWS refused the call ({error_code(exc)}): {exc}", EXIT_ERROR
    if isinstance(exc, BotoCoreError):
        return str(exc), EXIT_ERROR
    return None, EXIT_ERROR


def _raise_on_sigterm() -> Any:
    """SIGTERM interrupts like Ctrl-C (commands that stop gracefully install their own)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, interrupt)


def _silence_stdout() -> None:
    """The reader of our output went away: drop what is left instead of a second error at exit."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# -- arguments --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    aws = argparse.ArgumentParser(add_help=False)
    aws.add_argument("--region", help="AWS region (default: boto3's chain, e.g. $AWS_REGION)")
    aws.add_argument("--dynamodb-endpoint", metavar="URL", help="DynamoDB endpoint (local work)")
    aws.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    kinesis = argparse.ArgumentParser(add_help=False)
    kinesis.add_argument("--kinesis-endpoint", metavar="URL", help="Kinesis endpoint (local work)")
    group = argparse.ArgumentParser(add_help=False)
    _env_option(group, "--app", "KINESUMER_APP", "the consumer group's name")
    _env_option(group, "--table", "KINESUMER_TABLE", "the DynamoDB state table")

    parser = argparse.ArgumentParser(
        prog="kinesumer",
        description="Consume Amazon Kinesis streams as a consumer group with checkpoints in "
        "DynamoDB: run a member, inspect a group, move checkpoints, try it all locally.",
        epilog=EXIT_CODES,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"kinesumer {__version__}")
    parser.set_defaults(debug=False)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def command(
        name: str, summary: str, parents: list[argparse.ArgumentParser], description: str
    ) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=description,
            parents=parents,
            epilog=EXIT_CODES,
            formatter_class=formatter,
        )

    consume = command(
        "consume",
        "join the group and print each record as a JSON line",
        [group, aws, kinesis],
        "Join the group as a member and print every record of this member's shards as one JSON "
        "line (stream, shard_id, sequence_number, sub_sequence_number, partition_key, "
        'approximate_arrival_timestamp, and data: UTF-8 text in "data", otherwise base64 in '
        '"data_b64"). Ctrl-C or SIGTERM closes the member gracefully: checkpoints written, '
        "shards handed to the other members.",
    )
    consume.add_argument("streams", nargs="+", metavar="STREAM", help="stream(s) to consume")
    consume.add_argument(
        "--initial-position",
        type=initial_position,
        default="LATEST",
        metavar="POS",
        help="where a shard without checkpoint starts: LATEST (default), TRIM_HORIZON or an ISO "
        "8601 time such as 2024-05-01T12:00:00Z (naive times are UTC)",
    )
    consume.add_argument("--client-id", help="member id (default: <host>-<pid>-<random>)")
    consume.add_argument(
        "--count", type=positive_int, metavar="N", help="stop after N records (default: never)"
    )
    consume.add_argument("--stop-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    consume.set_defaults(handler=cmd_consume)

    status = command(
        "status",
        "show members, leader, shard owners, checkpoints and lag",
        [group, aws],
        "Show the group from its state table: live members (* marks the leader: the lowest live "
        "id), which shards each owns, and per shard its owner, checkpoint and lag "
        "(MillisBehindLatest as its owner reports it).",
    )
    status.add_argument("--stream", action="append", default=[], help="only this stream (repeat)")
    status.add_argument(
        "--client-timeout",
        type=positive_float,
        default=DEFAULT_CLIENT_TIMEOUT,
        metavar="SECONDS",
        help=f"a member is live if it heartbeated within this (default {DEFAULT_CLIENT_TIMEOUT:g}, "
        "Config's default: use the group's value)",
    )
    status.add_argument(
        "--watch",
        type=positive_float,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    status.add_argument("--json", action="store_true", help="one JSON document (per refresh)")
    status.set_defaults(handler=cmd_status)

    checkpoints = command(
        "checkpoints",
        "list, reset or set shard checkpoints",
        [],
        "Inspect and move checkpoints. `reset` removes a shard's position (it restarts at the "
        "group's initial position); `set` makes it resume right after record --sequence. Both "
        "refuse a shard a live member owns unless --force, which also takes the shard from its "
        "owner: at its next checkpoint write the owner finds its lease gone, drops what it "
        "buffered and claims the shard again at the new position (what it delivered meanwhile "
        "is delivered again). Both are conditional on the lease read just before: a racing "
        "claim makes them fail, never clobber.",
    )
    actions = checkpoints.add_subparsers(title="actions", metavar="ACTION", required=True)
    for name, help_text in (
        ("list", "show the checkpoints of a stream (or of every stream)"),
        ("reset", "remove checkpoints: the shard restarts at the initial position"),
        ("set", "resume a shard right after a given sequence number"),
    ):
        action = actions.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[group, aws],
            epilog=EXIT_CODES,
            formatter_class=formatter,
        )
        action.add_argument("--stream", required=name != "list", help="the stream")
        action.add_argument("--shard", required=name == "set", metavar="ID", help="the shard id")
        action.add_argument(
            "--client-timeout",
            type=positive_float,
            default=DEFAULT_CLIENT_TIMEOUT,
            metavar="SECONDS",
            help=f"liveness of owners, as for status (default {DEFAULT_CLIENT_TIMEOUT:g})",
        )
        if name == "list":
            action.add_argument("--json", action="store_true", help="JSON instead of a table")
        else:
            action.add_argument(
                "--force",
                action="store_true",
                help="even if a live member owns the shard, or the table does not know it",
            )
        if name == "reset":
            action.add_argument(
                "--all-shards", action="store_true", help="every shard of the stream"
            )
        if name == "set":
            action.add_argument(
                "--sequence",
                required=True,
                type=sequence_number,
                metavar="N",
                help="the last processed record's sequence number (decimal digits)",
            )
            action.add_argument(
                "--sub-sequence",
                type=non_negative_int,
                default=0,
                metavar="N",
                help="index inside a KPL aggregate record (default 0)",
            )
        action.set_defaults(handler=cmd_checkpoints, action=name)

    create = command(
        "create-table",
        "create the DynamoDB state table (local work; idempotent)",
        [aws],
        "Create the state table (keys pk/sk, on-demand, TTL on expires_at) if it does not "
        "exist. For local work and tests: production provisions it with Terraform from infra/.",
    )
    _env_option(create, "--table", "KINESUMER_TABLE", "the DynamoDB state table")
    create.set_defaults(handler=cmd_create_table)

    demo = command(
        "demo",
        "a consumer group on a local moto server: kill a member, watch the rebalance",
        [],
        "Start a moto server on 127.0.0.1, a stream and the state table, a producer of numbered "
        "records and N member processes (`kinesumer consume`); show live who owns what; SIGKILL "
        "one member, show the takeover, start another, and end with a summary: produced, "
        "consumed, lost (must be 0) and duplicates (only re-deliveries of the killed member's "
        "records that were not checkpointed yet). No AWS account is touched.",
    )
    demo.add_argument("--members", type=positive_int, default=3, help="members (default 3)")
    demo.add_argument("--shards", type=positive_int, default=4, help="shards (default 4)")
    demo.add_argument("--records", type=positive_int, default=8000, help="records (default 8000)")
    demo.add_argument(
        "--rate", type=positive_float, default=200.0, help="records per second (default 200)"
    )
    demo.add_argument("--debug", action="store_true", help="show tracebacks")
    demo.set_defaults(handler=cmd_demo)
    return parser


def _env_option(parser: argparse.ArgumentParser, flag: str, env: str, what: str) -> None:
    default = os.environ.get(env) or None
    parser.add_argument(
        flag, default=default, required=default is None, help=f"{what} (default: ${env})"
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def sequence_number(text: str) -> str:
    """Kinesis sequence numbers are decimal strings of up to ~56 digits (checked as text: they
    do not fit in a float, nor in a DynamoDB number)."""
    if not text.isascii() or not text.isdigit() or len(text) > _MAX_SEQUENCE_DIGITS:
        raise argparse.ArgumentTypeError(
            f"a sequence number is decimal digits only (e.g. 4959033827149025660855969253836157"
            f"1095921575989136588898), got {text!r}"
        )
    return text


def initial_position(text: str) -> InitialPosition:
    if text.upper() in ("LATEST", "TRIM_HORIZON"):
        return "LATEST" if text.upper() == "LATEST" else "TRIM_HORIZON"
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LATEST, TRIM_HORIZON or an ISO 8601 time (2024-05-01T12:00:00Z), "
            f"got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def group_config(args: argparse.Namespace, **extra: Any) -> Config:
    return Config(
        app=args.app,
        dynamodb_table=args.table,
        region=args.region,
        dynamodb_endpoint=args.dynamodb_endpoint,
        kinesis_endpoint=getattr(args, "kinesis_endpoint", None),
        **extra,
    )


# -- consume ----------------------------------------------------------------------------------
def record_json(record: Record) -> dict[str, Any]:
    """One record as ``consume`` prints it: data as text when it is UTF-8, else base64."""
    arrival = record.approximate_arrival_timestamp
    doc: dict[str, Any] = {
        "stream": record.stream,
        "shard_id": record.shard_id,
        "sequence_number": record.sequence_number,
        "sub_sequence_number": record.sub_sequence_number,
        "partition_key": record.partition_key,
        "approximate_arrival_timestamp": arrival.isoformat() if arrival else None,
    }
    try:
        doc["data"] = record.data.decode("utf-8")
    except UnicodeDecodeError:
        doc["data_b64"] = base64.b64encode(record.data).decode("ascii")
    return doc


def cmd_consume(args: argparse.Namespace) -> int:
    """A group member printing JSON lines.

    It polls (at most 0.5 s per poll) rather than iterating the blocking generator so that a
    stop request is seen within half a second even on an idle stream; a stop lets the records of
    the current poll be printed, then closes from this thread, which counts them as processed:
    the checkpoints match exactly what was printed, and the next owner starts right after.
    """
    config = group_config(args, client_id=args.client_id, initial_position=args.initial_position)
    stop = threading.Event()
    previous = _graceful_signals(stop)
    if args.stop_on_stdin_eof:  # the demo's members: stop when the demo goes away
        threading.Thread(target=_stop_at_eof, args=(stop,), daemon=True).start()
    out = sys.stdout.buffer
    consumer = Kinesumer(config)
    printed = 0
    clean = False
    try:
        consumer.subscribe(args.streams)
        while not stop.is_set() and (args.count is None or printed < args.count):
            limit = 500 if args.count is None else min(500, args.count - printed)
            for record in consumer.poll(max_records=limit, timeout=0.5):
                out.write(json.dumps(record_json(record), ensure_ascii=False).encode() + b"\n")
                out.flush()
                printed += 1
        clean = True
    finally:
        # Not clean (an error, a broken pipe, a second Ctrl-C): what this poll delivered is not
        # known to be printed, so it is not checkpointed; the next owner delivers it again.
        if clean:
            consumer.close()
        else:
            consumer.close(discard=True)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return EXIT_OK


def _graceful_signals(stop: threading.Event) -> dict[int, Any]:
    """First SIGINT/SIGTERM: stop after the current poll. A second SIGINT: stop now."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}


def _stop_at_eof(stop: threading.Event) -> None:
    """Raw reads of fd 0: a daemon thread blocked in the buffered ``sys.stdin`` would hold its
    lock and make the interpreter abort at exit."""
    with contextlib.suppress(OSError, ValueError):
        while os.read(sys.stdin.fileno(), 4096):
            pass
    stop.set()


# -- status, checkpoints (in _cli_status: they work on the state table) -----------------------
def cmd_status(args: argparse.Namespace) -> int:
    return view.status_command(args, group_config(args))


def cmd_checkpoints(args: argparse.Namespace) -> int:
    return view.checkpoints_command(args, group_config(args))


# -- create-table, demo -----------------------------------------------------------------------
def cmd_create_table(args: argparse.Namespace) -> int:
    config = Config(
        app="kinesumer-cli",
        dynamodb_table=args.table,
        region=args.region,
        dynamodb_endpoint=args.dynamodb_endpoint,
    )
    if create_state_table(config):
        print(f"created table {args.table!r} (keys pk/sk, on-demand, TTL on expires_at)")
    else:
        print(f"table {args.table!r} already exists with the right keys: nothing to do")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo  # imports moto: only for the demo

    return run_demo(members=args.members, shards=args.shards, records=args.records, rate=args.rate)


if __name__ == "__main__":
    sys.exit(main())
