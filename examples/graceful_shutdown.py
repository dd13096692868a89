"""Stop on SIGTERM or Ctrl-C without losing or repeating a record: the shape of a service.

Containers, systemd and Kubernetes stop a process with SIGTERM, and then SIGKILL a few seconds
later. On SIGTERM this program finishes the records it holds, then closes the consumer: the
checkpoints of everything it processed are written and its shards are released in the same
conditional write, so the other members (or the next run) start right after the last record it
handled, at once instead of after ``client_timeout``, and deliver nothing twice.

The first signal only sets a flag (:func:`kinesumer.signals.stop_on_signals`): closing from
inside a handler, or raising from one, could cut a record in half. A second signal stops at once
(``KeyboardInterrupt``), and the handlers that were there before come back on exit. ``poll()``
waits at most a second, so the flag is seen within a second even when the stream is quiet. Keep
``handoff_timeout`` plus that second well inside the orchestrator's grace period (Kubernetes:
terminationGracePeriodSeconds, 30 s by default).

    python examples/graceful_shutdown.py        # then: kill -TERM <pid>, or Ctrl-C

Configuration: the environment variables of examples/basic.py.
"""

from __future__ import annotations

import os
import threading

from kinesumer import Config, Kinesumer
from kinesumer.signals import stop_on_signals


def main() -> None:
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    handled = 0
    stopping = threading.Event()
    with stop_on_signals(lambda name: stopping.set()), Kinesumer(config) as consumer:
        consumer.subscribe(streams)
        print(
            f"consuming {', '.join(streams)} as {consumer.client_id} (pid {os.getpid()})",
            flush=True,
        )
        while not stopping.is_set():
            for record in consumer.poll(max_records=500, timeout=1.0):
                print(f"{record.stream}/{record.shard_id} data={record.data!r}", flush=True)
                handled += 1
        print(
            f"stopping after {handled} records: writing checkpoints, releasing shards", flush=True
        )
    # Leaving the block closed the consumer from this thread: every polled record counts as
    # processed, its checkpoint is written and the shards are handed off.
    print("stopped cleanly", flush=True)


if __name__ == "__main__":
    main()
