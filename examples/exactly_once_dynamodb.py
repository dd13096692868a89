"""Exactly-once into DynamoDB: running totals per customer that a crash never counts twice.

``ADD total :amount`` is not idempotent: delivered twice (after a crash, or by a member that lost
its shard and did not know yet), an order would be counted twice. With
``sink=DynamoDBTransactions()`` the handler does not write: it adds its updates to ``tx``, and
kinesumer commits them in one TransactWriteItems with the shard's checkpoint, conditional on this
member still owning the shard. Either the totals and the position move together, or neither does;
a member that lost the shard has its transaction refused, and the new owner resumes exactly after
the last committed order.

Batches make it cheap (one transaction per 25 orders of a shard here). One transaction may touch
an item only once, so the handler sums a batch per customer first. DynamoDB takes at most 100
writes per transaction, one of them the checkpoint.

    export KINESUMER_APP=orders-totals KINESUMER_TABLE=kinesumer-state KINESUMER_STREAMS=orders
    export KINESUMER_TOTALS=order-totals     # a table with a string partition key "pk"
    python examples/exactly_once_dynamodb.py       # until Ctrl-C or SIGTERM
    python examples/exactly_once_dynamodb.py 100   # stop once 100 orders are counted

Orders are JSON: ``{"id": 1, "customer": "c-17", "amount": 250}``. The totals table must be in
the state table's account and region (the transaction spans both).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass

from kinesumer import Config, Kinesumer
from kinesumer.handlers import Batch, Message
from kinesumer.signals import stop_on_signals
from kinesumer.sinks import DynamoDBTransaction, DynamoDBTransactions

TOTALS = os.environ.get("KINESUMER_TOTALS", "order-totals")


@dataclass
class Order:
    id: int
    customer: str
    amount: int


def count(messages: list[Message[Order]], tx: DynamoDBTransaction) -> None:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for message in messages:
        order = message.value
        totals[order.customer][0] += order.amount
        totals[order.customer][1] += 1
    for customer, (amount, orders) in sorted(totals.items()):
        tx.update(
            TOTALS,
            {"pk": customer},
            "ADD #total :amount, orders :orders",
            names={"#total": "total"},  # a reserved word in DynamoDB expressions
            values={":amount": amount, ":orders": orders},
        )


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    stopping = threading.Event()

    with stop_on_signals(lambda name: stopping.set()), Kinesumer(config) as consumer:

        def counted() -> int:
            return consumer.stats().handled.get("totals", {}).get("ok", 0)

        def close_when_asked() -> None:
            # run() blocks this program's main thread; close() comes from another thread.
            while not stopping.wait(0.1):
                if limit is not None and counted() >= limit:
                    break
            consumer.close()

        closer = threading.Thread(target=close_when_asked, daemon=True)
        closer.start()
        print(f"counting {', '.join(streams)} into {TOTALS}", flush=True)
        consumer.run(
            streams,
            count,
            concurrency=4,  # shards run in parallel; a shard's batches one after the other
            batch=Batch(max_size=25, max_wait=0.2),
            decode=Order,
            sink=DynamoDBTransactions(),
            name="totals",
        )
        closer.join()  # run() returns as the close begins: let it end before leaving `with`
        total = counted()
    print(f"done: {total} orders counted", flush=True)


if __name__ == "__main__":
    main()
