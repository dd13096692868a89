"""The outbox relay under faults: relays of another database on the
same PostgreSQL server, the LISTEN session dying while the relay waits on it, and a stream's
encryption key disabled for a while (every entry refused with a KMS error).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream
from support.postgres import PostgresServer, postgres_server
from support.produced import by_key, read_all
from support.standins import LOOPBACK, NodeStandIn, find_free_port
from support.wait import wait_until

from kinesumer import ConfigError, FlushError, Producer
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


def test_rows_refused_for_a_disabled_kms_key_wait_for_it_instead_of_moving_aside(
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    fault_proxy: Callable[[str], FaultProxy],
    unique_name: Callable[[str], str],
) -> None:
    """Kinesis refuses every entry with ``KMSDisabledException`` while the stream's key is
    disabled: a stream's configuration, healed by the operator, not a bad row. The rows stay
    in the outbox (counted as failed attempts) and go out, in order, once the key is back; none
    is moved to the dead-letter table."""
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    disabled = proxy.add_rule(
        Fault.refuse_entries(1.0, code="KMSDisabledException"),
        service="kinesis",
        operation="PutRecords",
    )
    publish(outbox, stream, 12, keys=3)
    with relaying(outbox, proxy.url) as errors:
        wait_until(lambda: disabled.fired >= 3, what="puts refused for the disabled key")
        assert not errors, errors
        stats = outbox.stats()
        assert (stats.dead_letters, stats.moved_aside, stats.pending) == (0, 0, 12)
        assert stats.failed_attempts > 0
        disabled.remove()  # the key is enabled again
        wait_until(drained(outbox, errors), what="the rows once the key is back")
    assert outbox.stats().dead_letters == 0
    landed = by_key(read_all(kinesalite.url, stream))
    assert landed == {f"k{k}": [b"%d" % i for i in range(k, 12, 3)] for k in range(3)}


def test_the_delay_of_a_row_queued_behind_its_keys_earlier_rows_counts_its_wait(
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    fault_proxy: Callable[[str], FaultProxy],
    unique_name: Callable[[str], str],
) -> None:
    """Six rows of one key, each PutRecords held 0.4 s by the proxy: the relay puts them one
    after another, so the last one reaches Kinesis at least 6 x 0.4 s after its publish(); the
    delay statistics must say so (not only its own round trip)."""
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    with relaying(outbox, proxy.url) as errors:
        wait_until(lambda: outbox.stats().partitions == 64, what="the relay's partitions")
        proxy.add_rule(Fault.delay(0.4), service="kinesis", operation="PutRecords")
        publish(outbox, stream, 6, keys=1)
        wait_until(drained(outbox, errors), what="the six rows")
        stats = outbox.stats()
    assert stats.published == 6
    assert stats.delay_p99 is not None and stats.delay_p99 >= 6 * 0.4, stats


def test_a_row_written_by_sql_outside_the_partitions_is_refused_not_stranded(
    postgres: PostgresServer, unique_name: Callable[[str], str]
) -> None:
    """The schema is public and writers in other languages compute ``part`` themselves: a
    ``part`` outside 0..63 belongs to no relay, so the row would wait forever, unseen except
    as lag. The table refuses it at INSERT instead."""
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    insert = psycopg.sql.SQL(
        "INSERT INTO {} (stream, partition_key, data, record_id, part) "
        "VALUES ('s', 'k', '', 'r', %s)"
    ).format(psycopg.sql.Identifier(outbox.table))
    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        for part in (64, -1):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(insert, (part,))
        conn.execute(insert, (63,))


def test_a_relay_refuses_a_producer_with_topics_instead_of_moving_rows_aside(
    postgres: PostgresServer, unique_name: Callable[[str], str]
) -> None:
    """Rows hold bytes already, for any stream: a producer limited to ``topics=`` would refuse
    (or encode again) every row outside or inside them, and each would move to the dead-letter
    table. A configuration error, said at once, before any row is touched."""
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    producer = Producer(region="us-east-1", kinesis_endpoint="http://127.0.0.1:9", topics=["a"])
    stopped = threading.Event()
    stopped.set()  # the check comes first: a relay told to stop still refuses
    try:
        with pytest.raises(ConfigError, match="topics"):
            outbox.relay(producer, stop=stopped)
    finally:
        producer.close()


def test_cli_relay_stopped_by_sigterm_while_postgres_is_down_exits_cleanly(
    unique_name: Callable[[str], str],
) -> None:
    """The relay keeps reconnecting while PostgreSQL is down; SIGTERM then stops it with exit 0
    and a line saying so, not a traceback from the pending count it prints on the way out."""
    conninfo = f"host={LOOPBACK} port={find_free_port()} user=nobody dbname=none connect_timeout=2"
    command = [sys.executable, "-m", "kinesumer.cli", "outbox", "relay", "--region", "us-east-1"]
    command += ["--conninfo", conninfo, "--kinesis-endpoint", f"http://{LOOPBACK}:9"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    ) as relay:
        try:
            assert relay.stdout is not None
            assert "relaying outbox" in relay.stdout.readline()
            relay.send_signal(signal.SIGTERM)
            out, err = relay.communicate(timeout=60)
        finally:
            relay.kill()
    assert "Traceback" not in err, err
    assert relay.returncode == 0, err
    assert "relay stopped" in out


def test_a_hot_keys_backlog_does_not_hold_other_keys_out_of_the_batch(
    postgres: PostgresServer, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """A key's rows go one per round trip, so a batch filled with one key's backlog takes a
    round trip per row while every other key waits outside it: after an outage, the outbox
    would crawl at one row per round trip. A key brings at most a tenth of a batch per cycle,
    so a later key's row gets in at once (and the hot key's rows still keep their order)."""
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    with psycopg.connect(outbox.conninfo) as conn, conn.transaction():
        for i in range(60):
            outbox.publish(conn, stream, b"%d" % i, partition_key="hot")
        outbox.publish(conn, stream, b"other", partition_key="cold")
    stop, errors = threading.Event(), list[BaseException]()

    def run() -> None:
        try:
            with Producer(region="us-east-1", kinesis_endpoint=kinesalite.url, linger=0.01) as p:
                outbox.relay(p, stop=stop, batch_size=20, poll_interval=0.5)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_until(drained(outbox, errors), what="the relay to empty the outbox")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    landed = [record.data for record in read_all(kinesalite.url, stream)]
    assert [d for d in landed if d != b"other"] == [b"%d" % i for i in range(60)]
    assert landed.index(b"other") < 20, landed.index(b"other")  # in the first cycle
