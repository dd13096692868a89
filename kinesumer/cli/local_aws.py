"""``kinesumer local-aws``: a local AWS to run your own consumer, handler or producer against.

It serves moto on 127.0.0.1 (:mod:`kinesumer.aws.local_server`: only requests signed with its own
random keys are answered), creates the streams and state table asked for, prints the shell
``export`` lines that point boto3 and kinesumer at it (and writes them to ``--env-file``), and
serves until Ctrl-C or SIGTERM. Nothing reaches a real account: the exports carry the server's
keys and endpoints, and the server forgets everything when it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
import tempfile
import threading
from pathlib import Path

from ..config import check_streams
from ..errors import ConfigError
from .errors import EXIT_OK, CliError

#: Seconds a stream may take to become active on the local server.
STREAM_READY_SECONDS = 60


def stream_spec(text: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:SHARDS`` (one shard unless said)."""
    name, _, shards = text.partition(":")
    try:
        check_streams([name])
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{name!r} is not a Kinesis stream name") from None
    try:
        count = int(shards) if shards else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shards!r} is not a number of shards") from None
    if not 1 <= count <= 64:
        raise argparse.ArgumentTypeError("a local stream has 1 to 64 shards")
    return name, count


def add_local_aws(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = commands.add_parser(
        "local-aws",
        help="a local AWS (moto on 127.0.0.1) to run your own code against",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    local.add_argument(
        "--stream",
        action="append",
        default=[],
        type=stream_spec,
        metavar="NAME[:SHARDS]",
        help="create this stream (repeatable; 1 shard unless said)",
    )
    local.add_argument("--table", metavar="NAME", help="create this kinesumer state table")
    local.add_argument("--region", default="us-east-1", help="its region (default us-east-1)")
    local.add_argument(
        "--env-file",
        type=Path,
        metavar="PATH",
        help="also write the export lines here (mode 0600), once everything is ready: "
        "`. PATH` in another shell",
    )
    local.add_argument("--debug", action="store_true", help="show tracebacks")
    local.set_defaults(handler=local_aws_command)


def local_aws_command(args: argparse.Namespace) -> int:
    from ..aws.local_server import LocalAWS, LocalAWSError
    from ..signals import stop_on_signals

    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    server = LocalAWS(region=args.region)
    try:
        server.start()
    except LocalAWSError as exc:
        raise CliError(f"{exc} (pip install 'kinesumer[testing]')") from None
    stop = threading.Event()
    try:
        _create(server, args.stream, args.table)
        exports = "".join(
            f"export {name}={shlex.quote(value)}\n" for name, value in server.environment().items()
        )
        print(f"# kinesumer local-aws on {server.url}: paste these in another shell")
        print(exports, end="", flush=True)
        if args.env_file is not None:
            _write_private(args.env_file, exports)
            print(f"# or: . {shlex.quote(str(args.env_file))}", flush=True)
        print("# Ctrl-C stops it (and forgets every stream and table)", flush=True)
        with stop_on_signals(lambda _name: stop.set()):
            while not stop.wait(1.0):
                pass
    finally:
        server.stop()
        if args.env_file is not None:
            with contextlib.suppress(OSError):
                args.env_file.unlink()
    return EXIT_OK


def _create(server: object, streams: list[tuple[str, int]], table: str | None) -> None:
    from ..admin import create_state_table
    from ..aws.local_server import LocalAWS
    from ..config import Config

    assert isinstance(server, LocalAWS)
    kinesis = server.client("kinesis")
    for name, shards in streams:
        kinesis.create_stream(StreamName=name, ShardCount=shards)
    for name, _ in streams:
        kinesis.get_waiter("stream_exists").wait(
            StreamName=name,
            WaiterConfig={"Delay": 0.1, "MaxAttempts": STREAM_READY_SECONDS * 10},
        )
    if table:
        for name, value in server.environment().items():
            os.environ[name] = value  # the table is created with the server's own keys
        create_state_table(
            Config(app="kinesumer-local", dynamodb_table=table, region=server.region)
        )


def _write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by this user only (it holds the server's keys), whole or
    not at all: a shell waiting for the file never reads half of it."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    print(f"# wrote {path}", file=sys.stderr)
