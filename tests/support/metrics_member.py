"""One group member with its Prometheus endpoint on, as an OS process, for the dashboard test:
it produces into its stream and consumes it, so records flow and every series a running member
exports is served.

    python tests/support/metrics_member.py --app A --table T --kinesis URL --dynamodb URL \\
        --client-id ID --metrics-port P [--no-produce] STREAM

* a ``Producer.from_config`` puts a record every 0.1 s (``kinesumer_produced_*``,
  ``kinesumer_produce_*``), unless ``--no-produce``;
* ``run()`` hands them to the handler ``dashboard``, which raises for every record whose data
  begins with ``fail``: retried once, then discarded (outcomes ``ok``, ``retried``,
  ``discarded``);
* a line ``serving metrics`` on stdout once the endpoint listens.

SIGTERM / SIGINT close both gracefully (exit 0); 3 when ``run()`` raised.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(_ROOT))

from kinesumer import Config, Kinesumer, Producer, Record  # noqa: E402
from kinesumer.handlers import Discard, Retry  # noqa: E402
from kinesumer.signals import stop_on_signals  # noqa: E402

# The group tests' short timings (tests/support/group.py FAST).
TIMINGS = {
    "heartbeat_interval": 0.25,
    "client_timeout": 2.0,
    "commit_interval": 0.5,
    "shard_sync_interval": 2.0,
    "handoff_timeout": 2.0,
    "scan_interval": 0.2,
}
#: Every how many records one is a ``fail`` record.
FAIL_EVERY = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--app", "--table", "--kinesis", "--dynamodb", "--client-id"):
        parser.add_argument(name, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--no-produce", action="store_true", help="consume only")
    parser.add_argument("stream")
    return parser.parse_args(argv)


def produce(producer: Producer, stream: str, stopped: threading.Event) -> None:
    n = 0
    while not stopped.wait(0.1):
        data = f"fail-{n}" if n % FAIL_EVERY == FAIL_EVERY - 1 else f"ok-{n}"
        producer.put(stream, data.encode(), partition_key=str(n))
        n += 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    config = Config(
        app=args.app,
        dynamodb_table=args.table,
        region="us-east-1",
        kinesis_endpoint=args.kinesis,
        dynamodb_endpoint=args.dynamodb,
        client_id=args.client_id,
        initial_position="TRIM_HORIZON",
        metrics_port=args.metrics_port,
        **TIMINGS,
    )

    def handle(record: Record) -> None:
        if record.data.startswith(b"fail"):
            raise ValueError(f"refused {record.data!r}")

    consumer = Kinesumer(config)
    print("serving metrics", flush=True)
    producer = Producer.from_config(config)
    stopped = threading.Event()
    producing = threading.Thread(target=produce, args=(producer, args.stream, stopped))
    if not args.no_produce:
        producing.start()

    def stop(name: str) -> None:
        stopped.set()
        threading.Thread(target=consumer.close, name="closer", daemon=True).start()

    try:
        with stop_on_signals(stop):
            consumer.run(
                [args.stream],
                handle,
                name="dashboard",
                on_failure=Discard(retry=Retry(attempts=2, backoff=0.01, jitter=False)),
            )
    except Exception:
        logging.exception("run() raised")
        return 3
    finally:
        stopped.set()
        if producing.is_alive():
            producing.join(10)
        producer.close()
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
