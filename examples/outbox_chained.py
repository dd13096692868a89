"""Exactly-once in, at-least-once in order out: payments change balances and emit events.

Reads payments (JSON ``{"id": 7, "account": "a-3", "amount": 250}``) from ``KINESUMER_STREAMS``
with ``sink=PostgresPositions``: each batch's handler adds the amounts to the accounts'
balances, records each payment as applied, and publishes a ``BalanceChanged`` event per payment
to the outbox, on the sink's connection. The effects, the events and the shard's position
commit in one PostgreSQL transaction: a crash at any point leaves all of them or none, so each
payment changes its balance once. A relay on a thread of this process puts the events to
``KINESUMER_OUTPUT`` (keyed by account: each account's events in commit order; at least once,
``record_id`` = the payment id to deduplicate on).

    export KINESUMER_APP=balances KINESUMER_TABLE=kinesumer-state KINESUMER_STREAMS=payments
    export KINESUMER_OUTPUT=balance-events KINESUMER_PG=postgresql://localhost/bank
    python examples/outbox_chained.py        # until Ctrl-C or SIGTERM
    python examples/outbox_chained.py 100    # stop once 100 payments are applied by this run

The tables (``balances``, ``applied``, the outbox's and the positions') are created if missing.
In production run the relay as its own service (``kinesumer outbox relay``) instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import psycopg

from kinesumer import Config, FlushError, Kinesumer, Producer, Topic
from kinesumer.handlers import Batch, Message
from kinesumer.outbox import PostgresOutbox
from kinesumer.signals import stop_on_signals
from kinesumer.sinks import PostgresPositions

CONNINFO = os.environ.get("KINESUMER_PG", "postgresql://localhost/postgres")
OUTBOX = PostgresOutbox(CONNINFO, table="balance_outbox")


@dataclass
class Payment:
    id: int
    account: str
    amount: int


@dataclass
class BalanceChanged:
    payment: int
    account: str
    balance: int


EVENTS = Topic(os.environ.get("KINESUMER_OUTPUT", "balance-events"), BalanceChanged)


def apply(messages: list[Message[Payment]], conn: psycopg.Connection[Any]) -> None:
    """One shard's batch, inside the sink's transaction (do not commit here)."""
    for message in messages:
        payment = message.value
        row = conn.execute(
            "INSERT INTO balances (account, balance) VALUES (%s, %s) ON CONFLICT (account) "
            "DO UPDATE SET balance = balances.balance + EXCLUDED.balance RETURNING balance",
            (payment.account, payment.amount),
        ).fetchone()
        assert row is not None
        conn.execute(
            "INSERT INTO applied (payment, account) VALUES (%s, %s)", (payment.id, payment.account)
        )
        OUTBOX.publish(
            conn,
            EVENTS,
            BalanceChanged(payment.id, payment.account, row[0]),
            partition_key=payment.account,
            record_id=str(payment.id),
        )


def create_tables() -> None:
    OUTBOX.create_table()
    with psycopg.connect(CONNINFO, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, balance bigint)"
        )
        # No unique key on purpose: a payment applied twice would show as two rows.
        conn.execute("CREATE TABLE IF NOT EXISTS applied (payment bigint, account text)")


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "payments").split(",")
    create_tables()
    stopping = threading.Event()
    producer = Producer.from_config(config, linger=0.01)
    failures: list[BaseException] = []

    def relay_until_stopped() -> None:
        try:
            OUTBOX.relay(producer, stop=stopping)
        except BaseException as exc:  # raised by main below: a relay's failure stops the run
            failures.append(exc)
            stopping.set()

    relay = threading.Thread(target=relay_until_stopped, name="outbox-relay")
    relay.start()

    with stop_on_signals(lambda name: stopping.set()), Kinesumer(config) as consumer:

        def applied() -> int:
            return consumer.stats().handled.get("balances", {}).get("ok", 0)

        def close_when_asked() -> None:
            while not stopping.wait(0.1):
                if limit is not None and applied() >= limit:
                    break
            consumer.close()

        closer = threading.Thread(target=close_when_asked, daemon=True)
        closer.start()
        print(f"applying {', '.join(streams)}, events to {EVENTS.stream}", flush=True)
        consumer.run(
            streams,
            apply,
            concurrency=4,
            batch=Batch(max_size=25, max_wait=0.1),
            decode=Payment,
            sink=PostgresPositions(CONNINFO, table="balance_positions"),
            name="balances",
        )
        closer.join()
        total = applied()
    stopping.set()
    relay.join()
    with contextlib.suppress(FlushError):  # failed puts: the relay tried their rows again
        producer.close()
    if failures:
        raise failures[0]
    print(f"done: {total} payments applied", flush=True)


if __name__ == "__main__":
    main()
