"""A slow handler, 32 at a time, each customer's records in order: ``consumer.run``.

A handler that waits on an I/O call (here 10 ms) caps a shard read one record at a time at 100
records/s. ``run(..., concurrency=32, ordering="key")`` calls it on 32 worker threads: records
with the same partition key (a customer) are still handled one at a time in the order they were
written, different keys run in parallel. A shard's checkpoint only moves past records that are
all done, so a crash loses nothing and repeats only records that were in flight.

Stopping: the first SIGTERM or Ctrl-C closes the consumer gracefully. A signal handler must not
block, so it starts a thread that calls ``close()``: the records in flight finish and are
checkpointed, the shards are handed off, and ``run()`` returns. With a number as argument the
program stops the same way after handling that many records.

    python examples/handler_concurrency.py [COUNT]

Configuration: the environment variables of examples/basic.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from kinesumer import Config, Kinesumer, Record
from kinesumer.signals import stop_on_signals


def main() -> None:
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    handled = 0
    lock = threading.Lock()

    with Kinesumer(config) as consumer:

        def stop(why: str) -> None:
            print(f"stopping ({why}): finishing the records in flight", flush=True)
            threading.Thread(target=consumer.close, daemon=True).start()

        def handle(record: Record) -> None:
            nonlocal handled
            time.sleep(0.01)  # the I/O call: an HTTP request, a database write...
            with lock:
                handled += 1
                print(f"{record.partition_key} data={record.data!r}", flush=True)
                if handled == limit:
                    stop(f"{limit} records")

        with stop_on_signals(stop):
            consumer.run(streams, handle, concurrency=32, ordering="key")
        print(f"stopped cleanly after {handled} records", flush=True)


if __name__ == "__main__":
    main()
