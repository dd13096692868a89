"""One group member running a handler (``Kinesumer.run``) as an OS process, for kill -9 tests.

    python tests/support/handler_member.py --app A --table T --kinesis URL --dynamodb URL \\
        --client-id ID --out FILE [--concurrency 16] [--ordering key] [--delay 0.005] STREAM...

Modelled on ``tests/support/member.py`` (which runs the iterator): only a process of its own dies
like a crash, with no ``finally``, no handoff and its heartbeat thread gone at once.

``--out`` gets JSON lines, line-buffered (each one a single write: it survives a SIGKILL once
written): ``{"ev": "start", ...}`` when the handler begins a record and ``{"ev": "done", ...}``
when it finished it (after ``--delay`` seconds of "work"), each with ``stream``, ``shard_id``,
``sequence_number``, ``partition_key``, ``data`` and ``client_id``. A record with a start and
no done line was in flight when the process died.

SIGTERM / SIGINT close the consumer gracefully from a helper thread (a signal handler must not
block): ``run()`` returns once the in-flight records finished and were checkpointed. Exit 0
then; 3 when ``run()`` raised.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(_ROOT))

from kinesumer import Config, Kinesumer, Record  # noqa: E402
from kinesumer.signals import stop_on_signals  # noqa: E402

# The group tests' short timings (tests/support/group.py FAST), so a killed member's shards move on
# within seconds.
TIMINGS = {
    "heartbeat_interval": 0.25,
    "client_timeout": 2.0,
    "commit_interval": 0.5,
    "shard_sync_interval": 2.0,
    "handoff_timeout": 2.0,
    "scan_interval": 0.2,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--app", "--table", "--kinesis", "--dynamodb", "--client-id"):
        parser.add_argument(name, required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--ordering", default="key")
    parser.add_argument("--initial-position", default="TRIM_HORIZON")
    parser.add_argument("--delay", type=float, default=0.005, help="seconds of work per record")
    parser.add_argument(
        "--jitter", action="store_true", help="work 0..2x --delay seconds, drawn per record"
    )
    parser.add_argument(
        "--slow-share", type=float, default=0.0, help="share of records taking 50x --delay"
    )
    parser.add_argument("streams", nargs="+")
    return parser.parse_args(argv)


class Lines:
    """JSON lines from several worker threads; one write each, under a lock."""

    def __init__(self, path: Path, client_id: str) -> None:
        self._file: IO[str] = path.open("w", encoding="utf-8", buffering=1)
        self._client_id = client_id
        self._lock = threading.Lock()

    def write(self, event: str, record: Record) -> None:
        line: dict[str, Any] = {
            "ev": event,
            "stream": record.stream,
            "shard_id": record.shard_id,
            "sequence_number": record.sequence_number,
            "partition_key": record.partition_key,
            "data": record.data.decode(),
            "client_id": self._client_id,
        }
        text = json.dumps(line) + "\n"
        with self._lock:
            self._file.write(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    config = Config(
        app=args.app,
        dynamodb_table=args.table,
        region="us-east-1",
        kinesis_endpoint=args.kinesis,
        dynamodb_endpoint=args.dynamodb,
        client_id=args.client_id,
        initial_position=args.initial_position,
        **TIMINGS,
    )
    out = Lines(args.out, args.client_id)

    def handle(record: Record) -> None:
        out.write("start", record)
        work = args.delay * (2 * random.random() if args.jitter else 1.0)
        if args.slow_share and random.random() < args.slow_share:
            work = args.delay * 50
        time.sleep(work)
        out.write("done", record)

    consumer = Kinesumer(config)

    def stop(name: str) -> None:
        threading.Thread(target=consumer.close, name="closer", daemon=True).start()

    try:
        with stop_on_signals(stop):
            consumer.run(args.streams, handle, concurrency=args.concurrency, ordering=args.ordering)
    except Exception:
        logging.exception("run() raised")
        return 3
    finally:
        consumer.close()
    print(f"member {args.client_id} (pid {os.getpid()}) stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
