"""``kinesumer produce STREAM``: put each line of stdin as a record, like kcat's producer mode.

Keys: ``--key KEY`` for every line, ``--key-field FIELD`` to read each line as a JSON object and
key it by that field, otherwise the line number (lines spread over the shards). A summary goes
to stderr at the end; the exit code is 1 when any line was not written (each failure is counted
by error, the first few are printed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import threading
from collections import Counter
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import FlushError, KinesumerError
from .errors import EXIT_CODES, EXIT_ERROR, EXIT_OK
from .options import account_fields, positive_float

if TYPE_CHECKING:
    from ..producer import Producer, PutResult

#: Failures printed one by one before the summary (the rest are only counted).
SHOWN_FAILURES = 5


def add_produce(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: list[argparse.ArgumentParser],
) -> None:
    produce = commands.add_parser(
        "produce",
        help="put each line of stdin as a record",
        description="Put each line of stdin (without its newline) as a record of STREAM, in "
        "batches per shard, retried when Kinesis refuses entries, each key's lines in order. "
        "Prints a summary to stderr; exits 1 if any line was not written.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=parents,
    )
    produce.add_argument(
        "stream", metavar="STREAM", help="the stream to put to: a name or a stream ARN"
    )
    produce.add_argument("--region", help="AWS region (default: boto3's chain, e.g. $AWS_REGION)")
    produce.add_argument("--kinesis-endpoint", metavar="URL", help="Kinesis endpoint (local)")
    produce.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", help="the partition key of every line")
    keys.add_argument(
        "--key-field",
        metavar="FIELD",
        help="read each line as a JSON object and use this field as its partition key",
    )
    produce.add_argument(
        "--aggregate", action="store_true", help="pack lines into KPL aggregates per shard"
    )
    produce.add_argument(
        "--ordering",
        choices=("key", "none"),
        default="key",
        help="key (default): each key's lines land in order; none: fastest",
    )
    produce.add_argument(
        "--delivery-timeout",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="give up on a line not written within this (default 120)",
    )
    produce.set_defaults(handler=produce_command)


def produce_command(args: argparse.Namespace) -> int:
    from ..producer import Producer  # boto3 and the producer: only when the command runs

    tally = Tally()
    producer = Producer(
        region=args.region,
        kinesis_endpoint=args.kinesis_endpoint,
        aggregate=args.aggregate,
        ordering=args.ordering,
        delivery_timeout=args.delivery_timeout,
        **account_fields(args),
    )
    try:
        put_lines(producer, args, sys.stdin.buffer, tally)
    finally:
        with contextlib.suppress(FlushError):  # counted line by line in the tally
            producer.close()
    return tally.report(args.stream)


def put_lines(producer: Producer, args: argparse.Namespace, lines: BinaryIO, tally: Tally) -> None:
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw
        if not line:
            continue
        try:
            key = line_key(line, number, args)
            future = producer.put(args.stream, line, partition_key=key)
        except KinesumerError as exc:
            tally.failed(number, exc)
            continue
        tally.sent()
        future.add_done_callback(functools.partial(tally.done, number))


def line_key(line: bytes, number: int, args: argparse.Namespace) -> str:
    if args.key is not None:
        return str(args.key)
    if args.key_field is None:
        return str(number)
    try:
        doc: Any = json.loads(line)
    except ValueError as exc:
        raise KinesumerError(f"not a JSON line ({exc}); --key-field needs JSON objects") from None
    except RecursionError:  # nested deeper than the parser goes: this line fails, not the run
        raise KinesumerError("a JSON line nested too deeply to parse") from None
    if not isinstance(doc, dict) or doc.get(args.key_field) is None:
        raise KinesumerError(f"no field {args.key_field!r} in this JSON line")
    value = doc[args.key_field]
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except RecursionError:
        raise KinesumerError(f"field {args.key_field!r} is nested too deeply for a key") from None


class Tally:
    """Lines sent, written and failed (callbacks come from the producer's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.put = 0
        self.written = 0
        self.failures: Counter[str] = Counter()

    def sent(self) -> None:
        with self._lock:
            self.put += 1

    def done(self, number: int, future: Future[PutResult]) -> None:
        error = future.exception()
        if error is None:
            with self._lock:
                self.written += 1
        else:
            self.failed(number, error)

    def failed(self, number: int, error: BaseException) -> None:
        with self._lock:
            self.failures[type(error).__name__] += 1
            shown = sum(self.failures.values()) <= SHOWN_FAILURES
        if shown:
            print(f"kinesumer: line {number} not written: {error}", file=sys.stderr)

    def report(self, stream: str) -> int:
        failed = sum(self.failures.values())
        summary = f"kinesumer: {self.written} line(s) written to {stream}"
        if failed:
            detail = ", ".join(f"{name}: {n}" for name, n in sorted(self.failures.items()))
            print(f"{summary}; {failed} NOT written ({detail})", file=sys.stderr)
            return EXIT_ERROR
        print(summary, file=sys.stderr)
        return EXIT_OK
