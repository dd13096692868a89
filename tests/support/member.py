"""One consumer group member as an OS process: a real :class:`kinesumer.Kinesumer`, nothing mocked.

    python tests/support/member.py --app A --table T --kinesis URL --dynamodb URL --client-id ID \\
        --out FILE [--events FILE] [--api poll|generator] [--commit-interval 1 ...] \\
        [--sts-endpoint URL] [--account ACCOUNT=ROLE_ARN ...] STREAM...

Why a process of its own: the fault-tolerance scenarios (``tests/scenarios/test_scenarios.py``) and
the failover benchmark (``benchmarks/bench_failover.py``) must kill members with SIGKILL, stop them
with SIGTERM, and cut one member off from DynamoDB while the others carry on. Only separate
processes die like that: no ``finally`` runs, no handoff, the heartbeat thread dies with them.

What it writes, so that the caller can check every record:

* ``--out``: one JSON line per record *delivered* (handed to this program by the library):
  ``stream``, ``shard_id``, ``sequence_number``, ``sub_sequence_number``, ``partition_key``,
  ``data`` (text when it is UTF-8, else null), ``data_b64`` (only when it is not), ``size``,
  ``client_id``, ``mono`` (``time.monotonic()``: members on one machine share CLOCK_MONOTONIC, so
  deliveries of different members can be ordered) and ``wall``. The file is line-buffered and
  each line is written before the next record is asked for, so a SIGKILL loses at most the
  record being written: what the file shows is what the application had received.
* ``--events`` (default ``<out>.events``): lifecycle events as JSON lines with ``event`` =
  ``starting`` (before joining), ``started`` (joined, first shards claimed), ``owned`` (the set of
  active shards, the live members or the leader flag changed; sampled from ``consumer.stats()``
  every ``--stats-interval`` on a thread), ``stopping`` (why), ``error`` (class and message of
  an exception that stopped the member), ``closed`` (with the final ``stats()``: retries,
  checkpoint writes and conflicts, rebalances).
* stderr: the library's log (INFO and up), so that WARNING lines about retries can be checked.

``KINESUMER_TEST_CLOCK_SKEW=<seconds>`` in the environment shifts this process's wall clock
(``time.time``, not the monotonic clock), as a host whose clock is off would be.

Stopping:

* SIGTERM / SIGINT: graceful close. With ``--api poll`` (default) the consuming thread polls with a
  short timeout and checks a flag between polls, then calls ``close()`` itself, so the records
  of the last poll count as processed and are checkpointed: no duplicate for the next owner.
  With ``--api generator`` the consuming thread may be blocked inside the generator waiting for
  records, so a helper thread calls ``close()`` (the documented way from another thread: the
  handoff waits up to ``handoff_timeout`` for the record in hand) and the generator ends.
* The parent process going away counts as SIGTERM, so a crashed test run leaves no member behind.
* SIGUSR1 dumps the stack of every thread and every task of the engine's event loop to stderr
  (the member keeps running): the scenarios send it before giving up on a wait, so a stall shows
  where it is stuck.

Exit codes: 0 after a graceful stop, 3 when the library raised a ``KinesumerError`` (the class is
in the ``error`` event), 4 for any other exception, 5 when the consuming thread did not come back
after ``close()``, 2 for bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import faulthandler
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import MISSING, fields
from pathlib import Path
from typing import IO, Any

#: Seconds added to this process's wall clock (``time.time`` and ``time.time_ns``; never the
#: monotonic clock): members on one machine then disagree about the time as hosts without a
#: tight time sync do (tests/scenarios/test_clock_skew.py). Patched before the library is imported.
CLOCK_SKEW_ENV = "KINESUMER_TEST_CLOCK_SKEW"


def _shift_wall_clock() -> None:
    skew = float(os.environ.get(CLOCK_SKEW_ENV) or 0)
    if skew:
        real_time, real_time_ns = time.time, time.time_ns
        time.time = lambda: real_time() + skew  # type: ignore[assignment]
        time.time_ns = lambda: real_time_ns() + int(skew * 1e9)  # type: ignore[assignment]


_shift_wall_clock()

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(_ROOT))

from kinesumer import (  # noqa: E402
    AccountAccess,
    Config,
    ConsumerStats,
    Kinesumer,
    KinesumerError,
    Record,
)

EXIT_OK = 0
EXIT_LIBRARY_ERROR = 3
EXIT_OTHER_ERROR = 4
EXIT_HUNG = 5

#: How long the closing helper waits for the consuming thread to leave the generator after
#: ``close()`` returned, before declaring it hung (exit 5) instead of hanging the caller.
GENERATOR_EXIT_GRACE = 15.0

log = logging.getLogger("kinesumer.member")


def numeric_config_fields() -> dict[str, type]:
    """Config fields with a number default (``commit_interval``, ``scan_limit`` ...): each becomes
    a ``--commit-interval``-style option, so new tuning fields need no change here."""
    found: dict[str, type] = {}
    for f in fields(Config):
        default = f.default
        if default is MISSING or isinstance(default, bool):
            continue
        if isinstance(default, (int, float)):
            found[f.name] = type(default)
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--kinesis", required=True, help="Kinesis endpoint URL")
    parser.add_argument("--dynamodb", required=True, help="DynamoDB endpoint URL")
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--out", required=True, type=Path, help="JSON lines, one per record")
    parser.add_argument("--events", type=Path, help="lifecycle events (default <out>.events)")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--initial-position", default="TRIM_HORIZON")
    parser.add_argument("--api", choices=("poll", "generator"), default="poll")
    parser.add_argument("--poll-max", type=int, default=500, help="max_records per poll()")
    parser.add_argument("--poll-timeout", type=float, default=0.1, help="poll() timeout (s)")
    parser.add_argument("--stats-interval", type=float, default=0.1, help="stats() sampling (s)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--efo", action="store_true", help="read through enhanced fan-out")
    parser.add_argument("--sts-endpoint", help="STS endpoint URL (moto's, for assumed roles)")
    parser.add_argument(
        "--account",
        action="append",
        default=[],
        metavar="ACCOUNT=ROLE_ARN",
        help="read the streams of ACCOUNT through ROLE_ARN (Config.accounts); repeatable",
    )
    for name, kind in numeric_config_fields().items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    parser.add_argument("streams", nargs="+")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    """The member's Config: endpoints and identity from the arguments, TRIM_HORIZON so that no
    record written before the group started is missed, library defaults for everything else
    unless overridden."""
    overrides = {
        name: getattr(args, name)
        for name in numeric_config_fields()
        if getattr(args, name) is not None
    }
    return Config(
        app=args.app,
        dynamodb_table=args.table,
        region=args.region,
        kinesis_endpoint=args.kinesis,
        dynamodb_endpoint=args.dynamodb,
        client_id=args.client_id,
        initial_position=args.initial_position,
        enhanced_fan_out=args.efo,
        sts_endpoint=args.sts_endpoint,
        accounts=accounts_of(args.account) or None,
        **overrides,
    )


def accounts_of(pairs: list[str]) -> dict[str, AccountAccess]:
    """``--account ACCOUNT=ROLE_ARN`` options as ``Config.accounts``."""
    found: dict[str, AccountAccess] = {}
    for pair in pairs:
        account, sep, role = pair.partition("=")
        if not sep:
            raise SystemExit(f"--account wants ACCOUNT=ROLE_ARN, got {pair!r}")
        found[account] = AccountAccess(role_arn=role)
    return found


class EventLog:
    """Lifecycle events as JSON lines; written from the consuming thread, the stats sampler and
    the closing helper, hence the lock (one line never interleaves with another)."""

    def __init__(self, path: Path, client_id: str) -> None:
        self._file: IO[str] = path.open("w", encoding="utf-8", buffering=1)
        self._client_id = client_id
        self._lock = threading.Lock()

    def emit(self, event: str, **data: Any) -> None:
        line = {
            "event": event,
            "client_id": self._client_id,
            "pid": os.getpid(),
            "mono": time.monotonic(),
            "wall": time.time(),
            **data,
        }
        text = json.dumps(line, default=str) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(text)
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class RecordLog:
    """One JSON line per delivered record, flushed before the next record is asked for.

    Line buffering makes each line one ``write(2)``: once it returns, the line survives a SIGKILL
    of this process (the kernel has it), which is what "delivered" means to the scenarios.
    """

    def __init__(self, path: Path, client_id: str) -> None:
        self._file: IO[str] = path.open("w", encoding="utf-8", buffering=1)
        self._client_id = client_id
        self.count = 0

    def write(self, record: Record) -> None:
        data = record.data
        try:
            text: str | None = data.decode("utf-8")
            encoded = None
        except UnicodeDecodeError:
            text, encoded = None, base64.b64encode(data).decode("ascii")
        line: dict[str, Any] = {
            "stream": record.stream,
            "shard_id": record.shard_id,
            "sequence_number": record.sequence_number,
            "sub_sequence_number": record.sub_sequence_number,
            "partition_key": record.partition_key,
            "data": text,
            "size": len(data),
            "client_id": self._client_id,
            "mono": time.monotonic(),
            "wall": time.time(),
        }
        if encoded is not None:
            line["data_b64"] = encoded
        self._file.write(json.dumps(line) + "\n")  # line-buffered: flushed by the newline
        self.count += 1

    def close(self) -> None:
        self._file.close()


class StopRequest:
    """Why the member should stop; set from a signal handler or the parent watch.

    A signal handler runs between bytecodes of the main thread, so it only sets a flag and an
    Event: the consuming loop (poll mode) or the closing helper (generator mode) does the work.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()


def stats_dict(stats: ConsumerStats) -> dict[str, Any]:
    return {
        "retries": dict(stats.retries),
        "checkpoint_writes": stats.checkpoint_writes,
        "checkpoint_conflicts": stats.checkpoint_conflicts,
        "rebalances": stats.rebalances,
        "last_error": stats.last_error,
        "live": list(stats.live_members),
        "leader": stats.leader,
    }


def sample_ownership(
    consumer: Kinesumer,
    events: EventLog,
    stop: StopRequest,
    done: threading.Event,
    interval: float,
) -> None:
    """Emit an ``owned`` event whenever this member's active shards, the live members or the
    leader flag change; also turn the parent's death into a graceful stop."""
    parent = os.getppid()
    last: tuple[Any, ...] | None = None
    while not done.wait(interval):
        if os.getppid() != parent:
            stop.set("parent process exited")
        stats = consumer.stats()  # from this thread while the engine's changes the leases
        owned = sorted(f"{s.stream}/{s.shard_id}" for s in stats.shards if s.status == "active")
        key = (tuple(owned), stats.live_members, stats.leader)
        if key != last:
            last = key
            events.emit("owned", shards=owned, live=list(stats.live_members), leader=stats.leader)


def run_poll(
    consumer: Kinesumer,
    args: argparse.Namespace,
    out: RecordLog,
    stop: StopRequest,
    events: EventLog,
) -> None:
    """Poll until asked to stop, then close from this (the consuming) thread: the last poll's
    records count as processed and are checkpointed on the handoff."""
    consumer.subscribe(args.streams)
    events.emit("started")
    while not stop:
        for record in consumer.poll(max_records=args.poll_max, timeout=args.poll_timeout):
            out.write(record)
    events.emit("stopping", reason=stop.reason)
    consumer.close()


def run_generator(
    consumer: Kinesumer,
    args: argparse.Namespace,
    out: RecordLog,
    stop: StopRequest,
    events: EventLog,
) -> int:
    """Iterate the generator; a helper thread closes the consumer when asked to stop.

    The generator blocks while no record arrives, so the flag cannot be checked from the loop;
    ``close()`` from another thread hands every shard off (waiting for the record in hand) and
    ends the generator. Returns an exit code.
    """
    records: Iterator[Record] = consumer.consume(args.streams)  # named errors are raised here
    events.emit("started")
    left = threading.Event()  # the consuming thread is out of the generator
    outcome: dict[str, Any] = {}

    def close_on_stop() -> None:
        while not stop.event.wait(0.1):
            if left.is_set():
                return  # the generator ended by itself (engine error): main closes
        if left.is_set():
            return
        events.emit("stopping", reason=stop.reason)
        try:
            consumer.close()
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc
        if not left.wait(GENERATOR_EXIT_GRACE):
            events.emit(
                "error",
                error="ConsumingThreadHung",
                message=f"the generator did not end within {GENERATOR_EXIT_GRACE}s of close() "
                "returning on another thread",
                where="close",
            )
            os._exit(EXIT_HUNG)

    closer = threading.Thread(target=close_on_stop, name="member-closer", daemon=True)
    closer.start()
    try:
        for record in records:
            out.write(record)
    finally:
        left.set()
    closer.join()
    if "error" in outcome:
        raise outcome["error"]
    if not stop:
        # The generator ended without a stop request: the consumer was closed under us.
        events.emit("stopping", reason="generator ended by itself")
    return EXIT_OK


def dump_stacks(consumer: Kinesumer | None) -> None:
    """Every thread's stack now, then (from the loop itself) every asyncio task's stack."""
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    if consumer is None:
        return
    # The consumer's loop runs on its own thread; found through the garbage collector (the only
    # running loop in this process), so no private attribute of the consumer is read.
    running = [
        o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()
    ]
    if not running:
        return
    loop = running[0]

    def print_tasks() -> None:
        tasks = asyncio.all_tasks(loop)
        print(f"--- {len(tasks)} asyncio tasks", file=sys.stderr)
        for task in tasks:
            task.print_stack(limit=12, file=sys.stderr)
        sys.stderr.flush()

    loop.call_soon_threadsafe(print_tasks)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s",
    )
    for noisy in ("botocore", "aiobotocore", "boto3", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    events = EventLog(args.events or args.out.with_name(args.out.name + ".events"), args.client_id)
    out = RecordLog(args.out, args.client_id)
    stop = StopRequest()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set(signal.Signals(signum).name)

    consumer: Kinesumer | None = None
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: dump_stacks(consumer))
    events.emit("starting", api=args.api, argv=sys.argv[1:])
    code = EXIT_OK
    sampler_done = threading.Event()
    sampler: threading.Thread | None = None
    where = "config"
    try:
        config = build_config(args)
        consumer = Kinesumer(config)
        sampler = threading.Thread(
            target=sample_ownership,
            args=(consumer, events, stop, sampler_done, args.stats_interval),
            name="member-stats",
            daemon=True,
        )
        sampler.start()
        where = "consume"
        if args.api == "poll":
            run_poll(consumer, args, out, stop, events)
        else:
            code = run_generator(consumer, args, out, stop, events)
    except KinesumerError as exc:
        code = EXIT_LIBRARY_ERROR
        log.error("member %s stopped by %s", args.client_id, type(exc).__name__, exc_info=exc)
        events.emit("error", error=type(exc).__name__, message=str(exc), where=where)
    except Exception as exc:
        code = EXIT_OTHER_ERROR
        log.error("member %s crashed", args.client_id, exc_info=exc)
        events.emit("error", error=type(exc).__name__, message=str(exc), where=where)
    finally:
        sampler_done.set()
        if sampler is not None:
            sampler.join(timeout=5)
        if consumer is not None and code != EXIT_OK:
            # After an error: hand back what can be handed back; never hide the first error.
            try:
                consumer.close()
            except Exception as exc:
                log.warning("close after %s failed: %r", "error", exc)
        final = consumer.stats() if consumer is not None else None
        events.emit(
            "closed",
            code=code,
            delivered=out.count,
            stats=stats_dict(final) if final is not None else None,
        )
        out.close()
        events.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
