"""``kinesumer outbox``: the PostgreSQL outbox from the shell (needs the postgres extra).

``create-table`` creates the outbox table (idempotent); ``relay`` runs a relay until Ctrl-C or
SIGTERM (it finishes the rows in flight and deletes the acknowledged ones, then exits 0);
``status`` prints the backlog: rows not yet acknowledged, the oldest one's age, dead letters.
The connection string comes from ``--conninfo`` or ``$KINESUMER_OUTBOX_CONNINFO``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from typing import Any

from ..config import Config
from ..errors import ConfigError, FlushError
from ..signals import stop_on_signals
from .errors import EXIT_CODES, EXIT_OK, CliError
from .options import env_option, positive_float, positive_int

_FORMATTER = argparse.RawDescriptionHelpFormatter


def add_outbox(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    outbox = commands.add_parser(
        "outbox",
        help="the PostgreSQL outbox: create its table, run a relay, show its backlog",
        description="Records written into a PostgreSQL table inside the application's "
        "transactions (kinesumer.outbox.PostgresOutbox.publish) and put to Kinesis by relays.",
        epilog=EXIT_CODES,
        formatter_class=_FORMATTER,
    )
    shared = argparse.ArgumentParser(add_help=False)
    env_option(shared, "--conninfo", "KINESUMER_OUTBOX_CONNINFO", "PostgreSQL connection string")
    shared.add_argument(
        "--table", default="kinesumer_outbox", help="the outbox table (default kinesumer_outbox)"
    )
    shared.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    actions = outbox.add_subparsers(title="actions", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create-table",
        help="create the outbox table and its dead-letter table (idempotent)",
        parents=[shared],
    )
    create.set_defaults(handler=create_table_command)
    status = actions.add_parser(
        "status",
        help="rows not yet in Kinesis, the oldest one's age, dead letters",
        parents=[shared],
    )
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.set_defaults(handler=status_command)
    relay = actions.add_parser(
        "relay",
        help="put committed rows to Kinesis until Ctrl-C or SIGTERM",
        description="Put the outbox's committed rows to Kinesis, each partition key's in commit "
        "order, deleting each once Kinesis acknowledged it. Run several for availability: they "
        "share the table's key partitions. Needs a producer configuration: --region (or "
        "$AWS_REGION, or the AWS profile's) and, for local work, --kinesis-endpoint.",
        parents=[shared],
        epilog=EXIT_CODES,
        formatter_class=_FORMATTER,
    )
    relay.add_argument("--region", help="AWS region (default: boto3's chain, e.g. $AWS_REGION)")
    relay.add_argument("--kinesis-endpoint", metavar="URL", help="Kinesis endpoint (local work)")
    relay.add_argument("--role-arn", help="assume this role to put")
    relay.add_argument(
        "--batch-size", type=positive_int, default=500, help="rows per cycle (default 500)"
    )
    relay.add_argument(
        "--poll-interval",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="the longest wait without a NOTIFY (default 1)",
    )
    relay.add_argument(
        "--linger", type=float, default=0.01, metavar="SECONDS", help="(default 0.01)"
    )
    relay.add_argument("--aggregate", action="store_true", help="pack into KPL aggregates")
    relay.add_argument("--delivery-timeout", type=positive_float, default=120.0, metavar="SECONDS")
    relay.add_argument("--max-in-flight", type=positive_int, default=8, metavar="N")
    relay.add_argument(
        "--metrics-port", type=positive_int, metavar="PORT", help="serve Prometheus metrics"
    )
    relay.add_argument(
        "--streams",
        metavar="NAME[,NAME...]",
        help="the streams rows may name (default: any); a row naming another moves to the "
        "dead-letter table at once",
    )
    relay.add_argument(
        "--max-attempts",
        type=positive_int,
        default=100,
        metavar="N",
        help="failed puts of a row before it moves to the dead-letter table (default 100)",
    )
    relay.add_argument(
        "--max-age",
        type=positive_float,
        default=86_400.0,
        metavar="SECONDS",
        help="age at which a row that fails to be written moves aside instead (default 86400)",
    )
    relay.set_defaults(handler=relay_command)


def _outbox(args: argparse.Namespace) -> Any:
    try:
        from ..outbox import PostgresOutbox
    except ImportError as exc:
        raise CliError(str(exc)) from None
    return PostgresOutbox(args.conninfo, table=args.table)


def _postgres_error(outbox: Any, exc: Exception) -> CliError:
    """A one-line error for a failed PostgreSQL call, the connection string's secrets removed."""
    import psycopg

    message = outbox.redact(str(exc).strip())
    if isinstance(exc, psycopg.OperationalError):
        return CliError(f"PostgreSQL: {message} (is --conninfo right, the server up?)")
    return CliError(f"PostgreSQL refused: {message}")


def create_table_command(args: argparse.Namespace) -> int:
    import psycopg

    outbox = _outbox(args)
    try:
        outbox.create_table()
    except psycopg.Error as exc:
        raise _postgres_error(outbox, exc) from None
    print(f"outbox table {args.table!r} and {args.table}_dead are ready")
    return EXIT_OK


def status_command(args: argparse.Namespace) -> int:
    import psycopg

    outbox = _outbox(args)
    try:
        stats = outbox.stats()
    except psycopg.Error as exc:
        raise _postgres_error(outbox, exc) from None
    if args.json:
        print(
            json.dumps(
                {
                    "table": args.table,
                    "pending": stats.pending,
                    "oldest_pending_seconds": stats.oldest_pending_seconds,
                    "dead_letters": stats.dead_letters,
                }
            )
        )
        return EXIT_OK
    oldest = stats.oldest_pending_seconds
    age = "-" if oldest is None else f"{oldest:.3f}s"
    print(f"outbox {args.table}: {stats.pending} pending, oldest {age}, ", end="")
    print(f"{stats.dead_letters} dead letter(s) in {args.table}_dead")
    return EXIT_OK


def relay_command(args: argparse.Namespace) -> int:
    import psycopg

    from ..aws.clients import default_region
    from ..producer import Producer

    region = args.region or default_region()
    if not region:
        raise ConfigError(
            "region",
            "the relay needs a producer configuration: the AWS region of the streams "
            "(--region, $AWS_REGION, $AWS_DEFAULT_REGION or the profile's), and "
            "--kinesis-endpoint for local work",
            "outbox relay",
        )
    outbox = _outbox(args)
    streams = None
    if args.streams is not None:
        streams = [name.strip() for name in args.streams.split(",") if name.strip()]
    config = Config(
        app="kinesumer-outbox",
        dynamodb_table="kinesumer-outbox-no-table",
        region=region,
        kinesis_endpoint=args.kinesis_endpoint,
        role_arn=args.role_arn,
        metrics_port=args.metrics_port,
    )
    stop = threading.Event()
    producer = Producer.from_config(
        config,
        linger=args.linger,
        aggregate=args.aggregate,
        delivery_timeout=args.delivery_timeout,
        max_in_flight=args.max_in_flight,
    )
    try:
        with stop_on_signals(lambda name: stop.set()):
            print(f"relaying outbox {args.table} until Ctrl-C or SIGTERM", flush=True)
            try:
                outbox.relay(
                    producer,
                    stop=stop,
                    batch_size=args.batch_size,
                    poll_interval=args.poll_interval,
                    streams=streams,
                    max_attempts=args.max_attempts,
                    max_age=args.max_age,
                )
            except psycopg.Error as exc:
                raise _postgres_error(outbox, exc) from None
    finally:
        # Puts that failed were tried again by the relay (their rows stay until written).
        with contextlib.suppress(FlushError):
            producer.close()
    try:
        pending = f"{outbox.stats().pending} row(s) pending"
    except psycopg.Error:  # stopped while PostgreSQL is away: still a clean stop
        pending = "PostgreSQL unreachable, pending rows unknown"
    print(f"relay stopped: {pending}", flush=True)
    return EXIT_OK
