"""The ``kinesumer`` argument parser: shared option groups, then one small function per command
that adds its parser and names its handler."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module

from .._version import __version__
from .consumers import add_deregister_consumer
from .errors import EXIT_CODES
from .local_aws import add_local_aws
from .options import (
    DEFAULT_CLIENT_TIMEOUT,
    add_account_options,
    duration,
    env_option,
    initial_position,
    iso_instant,
    non_negative_int,
    positive_float,
    positive_int,
    sequence_number,
)
from .outbox import add_outbox
from .produce import add_produce

_FORMATTER = argparse.RawDescriptionHelpFormatter


def deferred(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """The handler ``function`` of this package's ``module``, imported when its command runs:
    the commands import boto3, the consumer or the state store, which ``--help``, ``--version``
    and a mistyped option do not need (a quarter to half a second of CPU at every start)."""

    def handler(args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int] = getattr(
            import_module(module, __package__), function
        )
        return command(args)

    handler.__qualname__ = handler.__name__ = function
    return handler


class Shared:
    """The option groups several commands share (argparse parents)."""

    def __init__(self) -> None:
        self.aws = argparse.ArgumentParser(add_help=False)
        self.aws.add_argument(
            "--region", help="AWS region (default: boto3's chain, e.g. $AWS_REGION)"
        )
        self.aws.add_argument(
            "--dynamodb-endpoint", metavar="URL", help="DynamoDB endpoint (local work)"
        )
        self.aws.add_argument(
            "--allow-insecure-endpoints",
            action="store_true",
            help="allow http:// endpoints on other machines (default: https://, or http:// on "
            "this machine only)",
        )
        self.aws.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
        self.kinesis = argparse.ArgumentParser(add_help=False)
        self.kinesis.add_argument(
            "--kinesis-endpoint", metavar="URL", help="Kinesis endpoint (local work)"
        )
        #: Streams given by ARN in other accounts and regions: every command taking streams
        #: (with ``kinesis``: else argparse would take --kinesis-endpoint for an abbreviation
        #: of --kinesis-endpoint-for).
        self.accounts = argparse.ArgumentParser(add_help=False)
        add_account_options(self.accounts)
        self.group = argparse.ArgumentParser(add_help=False)
        env_option(self.group, "--app", "KINESUMER_APP", "the consumer group's name")
        env_option(self.group, "--table", "KINESUMER_TABLE", "the DynamoDB state table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinesumer",
        description="Consume Amazon Kinesis streams as a consumer group with checkpoints in "
        "DynamoDB: run a member, inspect a group, move checkpoints, try it all locally.",
        epilog=EXIT_CODES,
        formatter_class=_FORMATTER,
    )
    parser.add_argument("--version", action="version", version=f"kinesumer {__version__}")
    parser.set_defaults(debug=False)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    shared = Shared()
    for add in (add_consume, add_status, add_lag, add_checkpoints, add_create_table, add_demo):
        add(commands, shared)
    add_deregister_consumer(commands, [shared.group, shared.aws, shared.kinesis, shared.accounts])
    add_produce(commands, [shared.accounts])
    add_local_aws(commands)
    add_outbox(commands)
    add_controls(commands, shared)
    return parser


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    parents: list[argparse.ArgumentParser],
    description: str,
) -> argparse.ArgumentParser:
    return commands.add_parser(
        name,
        help=summary,
        description=description,
        parents=parents,
        epilog=EXIT_CODES,
        formatter_class=_FORMATTER,
    )


def _client_timeout(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--client-timeout",
        type=positive_float,
        default=DEFAULT_CLIENT_TIMEOUT,
        metavar="SECONDS",
        help=help_text,
    )


def add_consume(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared
) -> None:
    consume = _command(
        commands,
        "consume",
        "join the group and print each record as a JSON line",
        [shared.group, shared.aws, shared.kinesis, shared.accounts],
        "Join the group as a member and print every record of this member's shards as one JSON "
        "line (stream, shard_id, sequence_number, sub_sequence_number, partition_key, "
        'approximate_arrival_timestamp, and data: UTF-8 text in "data", otherwise base64 in '
        '"data_b64"). Ctrl-C or SIGTERM closes the member gracefully: checkpoints written, '
        "shards handed to the other members.",
    )
    consume.add_argument(
        "streams",
        nargs="+",
        metavar="STREAM",
        help="stream(s) to consume: names (the streams of your account in --region, or of "
        "--role-arn's account in --kinesis-region) and stream ARNs of any account and region "
        "(--account for other accounts)",
    )
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
        "--broadcast",
        action="store_true",
        help="read every shard of the streams, outside the group (no claims, no checkpoints)",
    )
    consume.add_argument(
        "--resume",
        action="store_true",
        help="with --broadcast: save this member's own positions under --client-id (required) "
        "and start after them next time",
    )
    consume.add_argument(
        "--efo",
        action="store_true",
        help="read through enhanced fan-out (SubscribeToShard over HTTP/2; needs the efo extra): "
        "registers the app's stream consumer if missing, never deregisters it",
    )
    consume.add_argument(
        "--consumer-name", help="with --efo: the stream consumer's name (default: the app's)"
    )
    consume.add_argument(
        "--count", type=positive_int, metavar="N", help="stop after N records (default: never)"
    )
    consume.add_argument("--stop-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    consume.set_defaults(handler=deferred(".consume", "consume_command"))


def add_status(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared
) -> None:
    status = _command(
        commands,
        "status",
        "show members, leader, shard owners, checkpoints and lag",
        [shared.group, shared.aws, shared.kinesis, shared.accounts],
        "Show the group from its state table: live members (* marks the leader: the lowest live "
        "id not stepped down), which shards each owns, and per shard its owner, checkpoint and lag "
        "(MillisBehindLatest as its owner reports it).",
    )
    status.add_argument(
        "--stream", action="append", default=[], help="only this stream, a name or ARN (repeat)"
    )
    _client_timeout(
        status,
        f"a member is live if it heartbeated within this (default {DEFAULT_CLIENT_TIMEOUT:g}, "
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
    status.set_defaults(handler=deferred(".status", "status_command"))


def add_lag(commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    lag = _command(
        commands,
        "lag",
        "show how far behind the group is, per shard, read from the streams",
        [shared.group, shared.aws, shared.kinesis, shared.accounts],
        "Show how far behind the group is on each shard: the age of its oldest record not yet "
        "checkpointed, by Kinesis's clock (0 when all are; a finished parent has none), with "
        "the shard's live owner and checkpoint, and per stream and for the group the maximum. "
        "Read from the streams and the state table, so it works with no member running. "
        "Read-only; each run reads per shard 1 GetShardIterator and usually 1 GetRecords, out "
        "of the 5 a second per shard that every reader of the stream shares.",
    )
    lag.add_argument(
        "--stream", action="append", default=[], help="only this stream, a name or ARN (repeat)"
    )
    lag.add_argument("--json", action="store_true", help="one JSON document")
    serve = lag.add_argument_group(
        "serving (--serve)",
        "Probe every --interval seconds and serve /metrics (Prometheus), /lag.json (the --json "
        "document, what KEDA's metrics-api scaler reads), /status.json and a status page at / "
        "until SIGTERM or Ctrl-C. The server has no authentication: it binds 127.0.0.1 unless "
        "--host says otherwise.",
    )
    serve.add_argument("--serve", action="store_true", help="serve the lag over HTTP")
    serve.add_argument(
        "--host", metavar="ADDRESS", help="address to bind (default 127.0.0.1; 0.0.0.0: every one)"
    )
    serve.add_argument(
        "--port",
        type=non_negative_int,
        metavar="PORT",
        help="port to bind (default 8460; 0: any free one)",
    )
    serve.add_argument(
        "--interval",
        type=positive_float,
        metavar="SECONDS",
        help="seconds between probes (default 10: about 6 GetRecords per shard a minute)",
    )
    serve.add_argument(
        "--cloudwatch-namespace",
        metavar="NS",
        help="also publish the group's and each stream's lag (MaxMillisBehind, Milliseconds; "
        "dimensions App, Stream) to CloudWatch after each good probe (cloudwatch:PutMetricData)",
    )
    serve.add_argument(
        "--cloudwatch-endpoint", metavar="URL", help="CloudWatch endpoint (local work)"
    )
    lag.set_defaults(handler=deferred(".lag", "lag_command"))


def add_checkpoints(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared
) -> None:
    checkpoints = _command(
        commands,
        "checkpoints",
        "list, reset, set or rewind shard checkpoints",
        [],
        "Inspect and move checkpoints. `reset` removes a shard's position, and where a LATEST "
        "read of it began (it restarts at the group's initial position); `set` makes it "
        "resume right after record --sequence. Both "
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
            parents=[shared.group, shared.aws, shared.kinesis, shared.accounts],
            epilog=EXIT_CODES,
            formatter_class=_FORMATTER,
        )
        action.add_argument(
            "--stream", required=name != "list", help="the stream: a name or a stream ARN"
        )
        action.add_argument("--shard", required=name == "set", metavar="ID", help="the shard id")
        _client_timeout(
            action,
            "list: the heartbeat age that counts as live; set/reset judge an owner as the "
            "members do, by the client_timeout its group's leader publishes, and by this one "
            f"only where none is published (default {DEFAULT_CLIENT_TIMEOUT:g})",
        )
        _checkpoint_action_options(action, name)
        action.set_defaults(handler=deferred(".checkpoints", "checkpoints_command"), action=name)
    _add_rewind(actions, shared)


def _add_rewind(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared
) -> None:
    """``checkpoints rewind``: every shard of a stream to a time (kinesumer/cli/rewind.py)."""
    rewind = actions.add_parser(
        "rewind",
        help="move every shard of a stream to a time (with its lineage), even while the group runs",
        description="Move every shard of the stream (its whole lineage) so that the group next "
        "reads the first record that arrived at or after a time: a shard open then resumes "
        "there, a closed one with no record since is finished, and children of a later "
        "reshard start at their beginning after their reopened parents. --to trim-horizon: "
        "every shard from its oldest record; --to latest: every open shard after its last "
        "record now (closed ones finished). Times are Kinesis's (its arrival times, its "
        "clock for --by-duration and the future check). Each shard's item is moved by a "
        "write conditional on it as read, parents first; a racing claim or checkpoint makes "
        "it read the item again and retry, then stop (exit 3), never overwrite. A running "
        "member drops what it buffered of a moved shard and reads it from the new place "
        "within commit_interval.",
        parents=[shared.group, shared.aws, shared.kinesis, shared.accounts],
        epilog=EXIT_CODES,
        formatter_class=_FORMATTER,
    )
    rewind.add_argument("--stream", required=True, help="the stream: a name or a stream ARN")
    where = rewind.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--to-time",
        type=iso_instant,
        metavar="ISO",
        help="an ISO 8601 time such as 2024-05-01T12:00:00Z (naive times are UTC)",
    )
    where.add_argument(
        "--by-duration",
        type=duration,
        metavar="DURATION",
        help="this long before now, by Kinesis's clock: 1h, 90m, 1h30m, 2d",
    )
    where.add_argument(
        "--to",
        choices=("trim-horizon", "latest"),
        help="every shard from its oldest record, or every open shard from now",
    )
    rewind.add_argument(
        "--dry-run", action="store_true", help="print each shard's old and new place; write nothing"
    )
    rewind.add_argument("--json", action="store_true", help="one JSON document")
    rewind.set_defaults(handler=deferred(".rewind", "rewind_command"), action="rewind")


def _checkpoint_action_options(action: argparse.ArgumentParser, name: str) -> None:
    """The options only one of list, reset and set has."""
    if name == "list":
        action.add_argument("--json", action="store_true", help="JSON instead of a table")
    else:
        action.add_argument(
            "--force",
            action="store_true",
            help="even if a live member owns the shard, or the table does not know it",
        )
    if name == "reset":
        action.add_argument("--all-shards", action="store_true", help="every shard of the stream")
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


def add_create_table(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared
) -> None:
    create = _command(
        commands,
        "create-table",
        "create the DynamoDB state table (local work; idempotent)",
        [shared.aws],
        "Create the state table (keys pk/sk, on-demand, TTL on expires_at) if it does not "
        "exist. For local work and tests: production provisions it with Terraform from infra/.",
    )
    env_option(create, "--table", "KINESUMER_TABLE", "the DynamoDB state table")
    create.set_defaults(handler=deferred(".create_table", "create_table_command"))


def add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    demo = _command(
        commands,
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
    demo.set_defaults(handler=demo_command)


def add_controls(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared
) -> None:
    """The operator controls: pin, unpin, pins, step-down, rebalance (kinesumer/cli/controls.py).
    Each is a conditional write of the app's controls item; members apply it within about 10 s."""
    parents = [shared.group, shared.aws]
    pin = _command(
        commands,
        "pin",
        "pin a shard to a member",
        [*parents, shared.kinesis, shared.accounts],
        "Pin a shard to a member: it leaves the automatic assignment and that member reads it "
        "while it is live and consumes the stream; otherwise the pin falls back to the "
        "automatic assignment (the members log it) until the member is back.",
    )
    unpin = _command(
        commands,
        "unpin",
        "remove a shard's pin",
        [*parents, shared.kinesis, shared.accounts],
        "Remove a shard's pin.",
    )
    for parser in (pin, unpin):
        parser.add_argument("--stream", required=True, help="the stream: a name or a stream ARN")
        parser.add_argument("--shard", required=True, metavar="ID", help="the shard id")
    pin.add_argument("client_id", metavar="CLIENT_ID", help="the member to pin it to")
    pin.set_defaults(handler=deferred(".controls", "pin_command"))
    unpin.set_defaults(handler=deferred(".controls", "unpin_command"))
    pins = _command(commands, "pins", "list the pins", parents, "List the group's pins.")
    pins.add_argument("--json", action="store_true", help="JSON instead of text")
    pins.set_defaults(handler=deferred(".controls", "pins_command"))
    step = _command(
        commands,
        "step-down",
        "make a member (the leader) step down for a while",
        parents,
        "Make a member step down for SECONDS: it does not lead (the next live id does); with "
        "--drain it also gives up its automatically assigned shards (not pinned ones). It "
        "keeps heartbeating. --seconds 0 cancels.",
    )
    step.add_argument("client_id", metavar="CLIENT_ID", help="the member")
    step.add_argument(
        "--seconds", type=float, default=300.0, help="how long (default 300; 0 cancels)"
    )
    step.add_argument("--drain", action="store_true", help="give up its shards too")
    step.set_defaults(handler=deferred(".controls", "step_down_command"))
    rebalance = _command(
        commands,
        "rebalance",
        "make every member assign afresh",
        parents,
        "Force a rebalance: every member re-reads the members, owners and shard lists and "
        "assigns again; in sticky mode the shards are laid out as if nobody owned any.",
    )
    rebalance.set_defaults(handler=deferred(".controls", "rebalance_command"))


def demo_command(args: argparse.Namespace) -> int:
    from .demo import run_demo  # imports moto: only for the demo

    return run_demo(members=args.members, shards=args.shards, records=args.records, rate=args.rate)
