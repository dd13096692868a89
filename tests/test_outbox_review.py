"""The outbox relay under faults a first review missed: relays of another database on the
same PostgreSQL server, the LISTEN session dying while the relay waits on it, and the delay
statistics of a key whose rows queue behind each other.
"""

from __future__ import annotations

import contextlib
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

from kinesumer import FlushError, Producer
from kinesumer.outbox import PostgresOutbox


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@contextlib.contextmanager
def relaying(outbox: PostgresOutbox, url: str, **producer: Any) -> Iterator[list[BaseException]]:
    """One relay on a thread until the block ends; the list holds its error, if any (checked
    at the end: a relay must not die of a fault it can heal)."""
    stop, errors = threading.Event(), list[BaseException]()

    def run() -> None:
        try:
            settings = {"kinesis_endpoint": url, "linger": 0.01, **producer}
            kinesis = Producer(region="us-east-1", **settings)
            try:
                outbox.relay(kinesis, stop=stop, poll_interval=0.5)
            finally:
                with contextlib.suppress(FlushError):
                    kinesis.close()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors


def drained(outbox: PostgresOutbox, errors: list[BaseException]) -> Callable[[], bool]:
    def check() -> bool:
        assert not errors, errors
        return outbox.stats().pending == 0

    return check


def publish(outbox: PostgresOutbox, stream: str, count: int, keys: int) -> None:
    with psycopg.connect(outbox.conninfo) as conn, conn.transaction():
        for i in range(count):
            outbox.publish(conn, stream, b"%d" % i, partition_key=f"k{i % keys}")


def test_relays_of_another_database_leave_this_ones_partitions_alone(
    postgres: PostgresServer, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """Two services on one PostgreSQL server, each in its own database with the default table
    name: advisory locks are per database but ``pg_locks`` lists the whole server's, so a relay
    must count only its own database's relays, or each takes half the partitions and the other
    half of each outbox is never published."""
    table = unique_name("outbox").replace("-", "_")
    database = unique_name("db").replace("-", "_")
    with psycopg.connect(postgres.conninfo, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(database))
        )
    here = PostgresOutbox(postgres.conninfo, table=table)
    there = PostgresOutbox(
        postgres.conninfo.replace("dbname=postgres", f"dbname={database}"), table=table
    )
    for box in (here, there):
        box.create_table()
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    with relaying(here, kinesalite.url) as here_errors:
        wait_until(lambda: here.stats().partitions == 64, what="the first relay's partitions")
        with relaying(there, kinesalite.url) as there_errors:
            wait_until(lambda: there.stats().partitions == 64, 10, "the other database's relay")
            assert here.stats().partitions == 64
            publish(here, stream, 256, keys=128)  # 128 keys: every partition, surely
            wait_until(drained(here, here_errors), what="every partition of this database")
            assert not there_errors


def test_a_relay_whose_listen_session_dies_while_it_waits_keeps_relaying(
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the LISTEN session is terminated (a pooler or an administrator closing idle
    sessions, a failover): the relay spends most of its time waiting on that session, so its
    failure must mean reconnecting, as for the other session, not the relay dying."""
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    with relaying(outbox, kinesalite.url) as errors:
        wait_until(lambda: outbox.stats().partitions == 64, what="the relay's partitions")
        with psycopg.connect(postgres.conninfo, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert killed == (1,)
        publish(outbox, stream, 20, keys=4)
        wait_until(drained(outbox, errors), what="the relay to go on after reconnecting")
    landed = by_key(read_all(kinesalite.url, stream))
    assert landed == {f"k{k}": [b"%d" % i for i in range(k, 20, 4)] for k in range(4)}
