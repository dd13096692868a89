"""A handler with typed payloads, retries, then a dead-letter stream: the shape of most services.

``Kinesumer.run`` calls ``handle`` for every order (decoded from JSON into the ``Order``
dataclass) until the consumer is closed. A call that raises is tried again (3 calls in all, with
a growing wait between them); a record that still fails, or whose payload is not an ``Order`` at
all, is written to the dead-letter stream with its error, and the run goes on. The checkpoint
never passes a record before that write landed, so a crash loses nothing.

Each dead letter is one JSON envelope (see ``kinesumer.handlers.deadletter`` for every field):
the original stream, shard, sequence number, partition key and data (base64), the handler, the
error and the number of attempts. Read them back with::

    from kinesumer.handlers.deadletter import read_envelope
    envelope = read_envelope(record.data)
    envelope.error_message, envelope.original_record()

    export KINESUMER_APP=orders-etl KINESUMER_TABLE=kinesumer-state KINESUMER_STREAMS=orders
    export KINESUMER_DEAD_LETTERS=orders-dlq     # the dead-letter stream (it must exist)
    python examples/handler_dead_letter.py       # until Ctrl-C or SIGTERM
    python examples/handler_dead_letter.py 100   # stop once 100 records are done

Configuration: the environment variables of examples/basic.py, and KINESUMER_DEAD_LETTERS
(default: the first stream's name with "-dlq").
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

from kinesumer import Config, Kinesumer
from kinesumer.handlers import DeadLetter, Message, Retry
from kinesumer.signals import stop_on_signals


@dataclass
class Order:
    id: int
    amount: int


def handle(message: Message[Order]) -> None:
    order = message.value
    if order.amount < 0:
        raise ValueError(f"order {order.id} has a negative amount")  # a bug, or a bad record
    print(f"order {order.id}: {order.amount} (key={message.record.partition_key})", flush=True)


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    dead_letters = os.environ.get("KINESUMER_DEAD_LETTERS", f"{streams[0]}-dlq")
    stopping = threading.Event()

    with stop_on_signals(lambda name: stopping.set()), Kinesumer(config) as consumer:

        def done() -> int:
            counts = consumer.stats().handled.get("orders", {})
            return counts.get("ok", 0) + counts.get("dead_lettered", 0)

        def close_when_asked() -> None:
            # run() blocks this program's main thread; close() comes from another thread.
            while not stopping.wait(0.1):
                if limit is not None and done() >= limit:
                    break
            consumer.close()

        closer = threading.Thread(target=close_when_asked, daemon=True)
        closer.start()
        print(f"handling {', '.join(streams)}, dead letters to {dead_letters}", flush=True)
        consumer.run(
            streams,
            handle,
            decode=Order,
            on_failure=DeadLetter(dead_letters, retry=Retry(attempts=3, backoff=0.05)),
            name="orders",
        )
        closer.join()  # run() returns as the close begins: let it end before leaving `with`
        counts = consumer.stats().handled.get("orders", {})
    print(
        f"done: {counts.get('ok', 0)} handled, {counts.get('dead_lettered', 0)} dead-lettered, "
        f"{counts.get('retried', 0)} retries",
        flush=True,
    )


if __name__ == "__main__":
    main()
