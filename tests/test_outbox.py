"""PostgresOutbox and its relay against a real PostgreSQL (tests/_postgres.py) and kinesalite:
rows commit and roll back with the caller's transaction, relays put them in per-key commit
order and delete them once acknowledged, two relays share the table, refused rows move aside,
bad input raises named errors.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from _group import create_stream
from _postgres import PostgresServer, postgres_server
from _produced import by_key, read_all
from _standins import NodeStandIn
from _wait import wait_until

from kinesumer import ConfigError, InvalidRecordError, Producer, Topic
from kinesumer.outbox import (
    OutboxConnectionError,
    OutboxTableNotFoundError,
    PostgresOutbox,
)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def outbox(postgres: PostgresServer, unique_name: Callable[[str], str]) -> PostgresOutbox:
    box = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    box.create_table()
    return box


class Relays:
    """Relays on threads, each with its own producer; stopped (and their errors raised) at the
    end of the test."""

    def __init__(self, outbox: PostgresOutbox, url: str) -> None:
        self.outbox, self.url = outbox, url
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, count: int = 1, **options: Any) -> None:
        for _ in range(count):
            thread = threading.Thread(target=self._run, kwargs=options, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _run(self, **options: Any) -> None:
        try:
            with Producer(kinesis_endpoint=self.url, region="us-east-1", linger=0.01) as producer:
                self.outbox.relay(producer, stop=self.stop, poll_interval=0.5, **options)
        except BaseException as exc:
            self.errors.append(exc)

    def drained(self) -> bool:
        """Whether the outbox is empty (a relay's error fails the test at once)."""
        assert not self.errors, self.errors
        return self.outbox.stats().pending == 0

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not self.errors, self.errors


@pytest.fixture
def relays(outbox: PostgresOutbox, kinesalite: NodeStandIn) -> Iterator[Relays]:
    running = Relays(outbox, kinesalite.url)
    yield running
    running.close()


def test_committed_rows_reach_kinesis_rolled_back_never(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 2)
    with psycopg.connect(postgres.conninfo) as conn:
        with conn.transaction():
            ids = [
                outbox.publish(conn, stream, f"c{i}".encode(), partition_key=f"k{i % 3}")
                for i in range(6)
            ]
        with pytest.raises(ZeroDivisionError), conn.transaction():
            outbox.publish(conn, stream, b"rolled-back", partition_key="k0")
            raise ZeroDivisionError
    assert len(set(ids)) == 6
    before = outbox.stats()
    assert before.pending == 6 and before.oldest_pending_seconds is not None
    relays.start()
    wait_until(relays.drained, what="the relay to empty the outbox")
    datas = by_key(read_all(kinesalite.url, stream))
    assert datas == {f"k{k}": [f"c{i}".encode() for i in range(k, 6, 3)] for k in range(3)}
    after = outbox.stats()
    assert after.oldest_pending_seconds is None and after.published == 6
    assert after.relays == 1 and after.partitions == 64 and after.delay_p99 is not None


@dataclasses.dataclass
class Order:
    id: int
    item: str


def test_typed_topic_is_encoded_at_publish(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    orders = Topic(unique_name("ob"), Order)
    create_stream(kinesalite.url, orders.stream, 1)
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        outbox.publish(conn, orders, Order(1, "pen"), partition_key="o1")
        with pytest.raises(InvalidRecordError, match="does not encode"):
            outbox.publish(conn, orders, {"not": "an order"}, partition_key="o1")
    relays.start()
    wait_until(relays.drained, what="the relay to empty the outbox")
    (record,) = read_all(kinesalite.url, orders.stream)
    assert orders.decode(record.data) == Order(1, "pen")
