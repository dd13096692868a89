"""PostgresOutbox and its relay against a real PostgreSQL (tests/support/postgres.py) and
kinesalite: rows commit and roll back with the caller's transaction, relays put them in per-key
commit order and delete them once acknowledged, two relays share the table, refused rows move aside,
bad input raises named errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream
from support.outbox import Relays
from support.postgres import PostgresServer
from support.produced import by_key, read_all
from support.standins import NodeStandIn
from support.wait import wait_until

from kinesumer import ConfigError, InvalidRecordError, Producer, Topic, cli
from kinesumer.outbox import (
    OutboxConnectionError,
    OutboxTableNotFoundError,
    PostgresOutbox,
)
from kinesumer.outbox.schema import Names


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


def waiting_on_lock(postgres: PostgresServer, pid: int) -> bool:
    with postgres.connect() as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


def test_a_key_reaches_kinesis_in_commit_order_not_id_order(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """Transaction A publishes first (drawing the smaller id without the key lock) and commits
    last if it can: B's record must then come first. With the key lock B waits for A instead,
    and A's record comes first; either way Kinesis holds the key's records in commit order."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    committed: list[bytes] = []
    b_conn = psycopg.connect(postgres.conninfo)

    def writer_b() -> None:
        with b_conn.transaction():
            outbox.publish(b_conn, stream, b"B", partition_key="k")
        committed.append(b"B")

    with psycopg.connect(postgres.conninfo) as a_conn, a_conn.transaction():
        outbox.publish(a_conn, stream, b"A", partition_key="k")
        thread = threading.Thread(target=writer_b)
        thread.start()
        wait_until(
            lambda: bool(committed) or waiting_on_lock(postgres, b_conn.info.backend_pid),
            what="B to commit or to wait for A's key lock",
        )
        # B is committed or blocked until A's COMMIT: A's place in the order is now.
        committed.append(b"A")
    thread.join(timeout=30)
    b_conn.close()
    relays.start()
    wait_until(relays.drained, what="the relay to empty the outbox")
    assert by_key(read_all(kinesalite.url, stream))["k"] == committed


def partition_holders(postgres: PostgresServer, outbox: PostgresOutbox) -> int:
    """How many live sessions hold some of the outbox's partitions (their claims)."""
    with postgres.connect() as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(DISTINCT c.pid) FROM {} AS c JOIN pg_stat_activity AS a "
                "ON a.pid = c.pid AND a.backend_start = c.started"
            ).format(Names(outbox.table).parts)
        ).fetchone()
    return 0 if row is None else int(row[0])


def test_concurrent_writers_and_two_relays_keep_each_keys_commit_order(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """Four writers commit or roll back small transactions over shared keys while two relays
    run: every committed record reaches Kinesis exactly once (two live relays never put the same
    row), no rolled-back one does, and each key's records follow commit order."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 2)
    relays.start(2, batch_size=50)
    wait_until(
        lambda: partition_holders(postgres, outbox) == 2, what="both relays holding partitions"
    )
    order: dict[str, list[bytes]] = {}
    order_lock = threading.Lock()
    rolled_back: set[bytes] = set()

    def writer(number: int) -> None:
        rng = random.Random(number)
        with psycopg.connect(postgres.conninfo) as conn:
            for txn in range(40):
                keys = rng.sample([f"k{i}" for i in range(8)], 2)
                datas = [f"w{number}-t{txn}-{key}".encode() for key in keys]
                commit = rng.random() < 0.75
                try:
                    with conn.transaction():
                        for key, data in zip(keys, datas, strict=True):
                            outbox.publish(conn, stream, data, partition_key=key)
                        if not commit:
                            raise psycopg.Rollback
                        # The order of commits per key: recorded under the key locks.
                        with order_lock:
                            for key, data in zip(keys, datas, strict=True):
                                order.setdefault(key, []).append(data)
                except psycopg.errors.DeadlockDetected:
                    commit = False  # two keys locked in opposite orders: PostgreSQL chose us
                if not commit:
                    rolled_back.update(datas)

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=120)
    wait_until(relays.drained, timeout=60, what="the relays to empty the outbox")
    landed = by_key(read_all(kinesalite.url, stream))
    assert landed == order
    assert not rolled_back & {d for datas in landed.values() for d in datas}
    stats = outbox.stats()
    assert stats.relays == 2 and stats.dead_letters == 0
    assert partition_holders(postgres, outbox) == 2


def test_a_row_kinesis_refuses_moves_aside_and_blocks_no_key(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """A row over its stream's 1 MiB (written by SQL; publish() refuses only what no stream
    takes, over 10 MiB) sits first in the table; the relay moves it to the dead-letter table
    and puts the rest, its own key's later row too."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        with pytest.raises(InvalidRecordError, match="10 MiB"):
            outbox.publish(conn, stream, b"x" * (10 * 1024 * 1024), partition_key="big")
        conn.execute(
            f"INSERT INTO {outbox.table} (stream, partition_key, data, record_id, part) "
            "VALUES (%s, 'big', %s, 'r-big', 0)",
            (stream, b"x" * (1024 * 1024 + 1)),
        )
        outbox.publish(conn, stream, b"after", partition_key="big")
        outbox.publish(conn, stream, b"other", partition_key="other")
    relays.start()
    wait_until(relays.drained, what="the relay to empty the outbox")
    assert by_key(read_all(kinesalite.url, stream)) == {"big": [b"after"], "other": [b"other"]}
    # The relay counts the row moved aside after its transaction commits: wait for the count.
    wait_until(lambda: outbox.stats().moved_aside == 1, what="the moved-aside counter at 1")
    assert outbox.stats().dead_letters == 1
    with postgres.connect() as conn:
        row = conn.execute(f"SELECT record_id, error FROM {outbox.table}_dead").fetchone()
    assert row is not None and row[0] == "r-big" and "RecordTooLargeError" in row[1]


def test_bad_input_raises_named_errors(
    postgres: PostgresServer, unique_name: Callable[[str], str]
) -> None:
    missing = PostgresOutbox(postgres.conninfo, table=unique_name("none").replace("-", "_"))
    conn = psycopg.connect(postgres.conninfo)
    with pytest.raises(OutboxTableNotFoundError, match="create-table"), conn.transaction():
        missing.publish(conn, "s", b"x", partition_key="k")
    conn.close()
    with pytest.raises(OutboxTableNotFoundError):
        missing.stats()
    closed = psycopg.connect(postgres.conninfo)
    closed.close()
    with pytest.raises(OutboxConnectionError, match="closed"):
        missing.publish(closed, "s", b"x", partition_key="k")
    with postgres.connect() as autocommit, pytest.raises(OutboxConnectionError, match="autocommit"):
        missing.publish(autocommit, "s", b"x", partition_key="k")
    with psycopg.connect(postgres.conninfo) as conn:
        with pytest.raises(InvalidRecordError, match="bytes"):
            missing.publish(conn, "s", "text", partition_key="k")
        with pytest.raises(InvalidRecordError, match="partition_key"):
            missing.publish(conn, "s", b"x", partition_key="")
    with pytest.raises(ConfigError, match="Producer"):
        missing.relay(None)
    with pytest.raises(ConfigError, match="table"):
        PostgresOutbox(postgres.conninfo, table="bad name; drop")


def test_a_relay_without_the_table_says_so(
    postgres: PostgresServer, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    missing = PostgresOutbox(postgres.conninfo, table=unique_name("none").replace("-", "_"))
    producer = Producer(kinesis_endpoint=kinesalite.url, region="us-east-1")
    with producer, pytest.raises(OutboxTableNotFoundError, match="create_table"):
        missing.relay(producer, stop=threading.Event())


def test_a_notify_wakes_the_relay_long_before_its_poll(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """With a 60 s poll interval, a commit is relayed within the wait below only because its
    NOTIFY woke the relay (the first row is read at start; the second finds the relay waiting)."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    relays.start(poll_interval=60.0)
    for data in (b"first", b"second"):
        with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
            outbox.publish(conn, stream, data, partition_key="k")
        wait_until(relays.drained, timeout=20, what=f"{data!r} relayed")
    assert by_key(read_all(kinesalite.url, stream)) == {"k": [b"first", b"second"]}


def test_async_publish_and_prometheus_series(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    from prometheus_client import CollectorRegistry

    from kinesumer.observability.metrics import PrometheusMetrics

    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)

    async def write() -> None:
        conn = await psycopg.AsyncConnection.connect(postgres.conninfo)
        async with conn, conn.transaction():
            await outbox.publish_async(conn, stream, b"a1", partition_key="a")
            await outbox.publish_async(conn, stream, b"a2", partition_key="a")

    asyncio.run(write())
    registry = CollectorRegistry()
    relays.start(metrics=PrometheusMetrics("app", "relay", registry=registry))
    wait_until(relays.drained, what="the relay to empty the outbox")
    labels = {"app": "app", "client_id": "relay", "stream": stream}
    # The rows are deleted before the relay counts them: wait for the count, do not race it.
    wait_until(
        lambda: registry.get_sample_value("kinesumer_outbox_relayed_total", labels) == 2,
        what="the relayed counter at 2",
        diagnose=lambda: str(registry.get_sample_value("kinesumer_outbox_relayed_total", labels)),
    )
    wait_until(
        lambda: (
            registry.get_sample_value(
                "kinesumer_outbox_pending", {"app": "app", "client_id": "relay"}
            )
            == 0
        ),
        what="the pending gauge at 0",
    )
    assert by_key(read_all(kinesalite.url, stream)) == {"a": [b"a1", b"a2"]}


def test_cli_create_table_status_and_a_relay_without_a_region(
    postgres: PostgresServer,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = unique_name("cli").replace("-", "_")
    where = ["--conninfo", postgres.conninfo, "--table", table]
    assert cli.main(["outbox", "create-table", *where]) == 0
    box = PostgresOutbox(postgres.conninfo, table=table)
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        box.publish(conn, "s", b"x", partition_key="k")
    capsys.readouterr()
    assert cli.main(["outbox", "status", *where, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["pending"] == 1 and status["dead_letters"] == 0
    assert status["oldest_pending_seconds"] >= 0
    assert cli.main(["outbox", "status", *where]) == 0
    assert "1 pending" in capsys.readouterr().out
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    assert cli.main(["outbox", "relay", *where]) == 2
    assert "--region" in capsys.readouterr().err


def test_rows_wait_for_a_stream_created_later_and_keep_their_order(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """Puts that fail and may heal (here the stream does not exist yet) leave their rows; they
    go, in order, once the stream exists."""
    stream = unique_name("ob")
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        for data in (b"a1", b"a2", b"a3"):
            outbox.publish(conn, stream, data, partition_key="a")
    relays.start()
    wait_until(lambda: outbox.stats().failed_attempts >= 2, what="puts failing, tried again")
    assert outbox.stats().pending == 3
    create_stream(kinesalite.url, stream, 1)
    wait_until(relays.drained, what="the relay to empty the outbox")
    assert by_key(read_all(kinesalite.url, stream)) == {"a": [b"a1", b"a2", b"a3"]}
    assert outbox.stats().dead_letters == 0


def test_a_relay_whose_sessions_are_killed_reconnects_and_loses_nothing(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    relays.start()
    wait_until(lambda: partition_holders(postgres, outbox) == 1, what="the relay's partitions")
    with psycopg.connect(postgres.conninfo) as conn:
        for i in range(40):
            with conn.transaction():
                outbox.publish(conn, stream, b"%d" % i, partition_key=f"k{i % 4}")
            if i == 20:  # the relay's sessions (locks and LISTEN) die under it
                with postgres.connect() as admin:
                    admin.execute(
                        sql.SQL(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE pid IN (SELECT pid FROM {}) OR query LIKE 'LISTEN%%'"
                        ).format(Names(outbox.table).parts)
                    )
    wait_until(relays.drained, what="the relay to empty the outbox after reconnecting")
    landed = by_key(read_all(kinesalite.url, stream))
    for k in range(4):
        expected = [b"%d" % i for i in range(k, 40, 4)]
        assert first_occurrences(landed[f"k{k}"]) == expected
    assert partition_holders(postgres, outbox) == 1
    assert "reconnecting" in caplog.text


def first_occurrences(datas: list[bytes]) -> list[bytes]:
    seen: set[bytes] = set()
    return [d for d in datas if not (d in seen or seen.add(d))]


def test_key_order_holds_through_refused_entries_even_with_an_unordered_producer(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    fault_proxy: Callable[[str], FaultProxy],
    unique_name: Callable[[str], str],
) -> None:
    """A third of every PutRecords call's entries refused, through a Producer with
    ``ordering="none"`` (which resends refused entries behind later ones): the relay puts a
    key's next row only after the previous one was acknowledged, so each key stays in order."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 2)
    proxy = fault_proxy(kinesalite.url)
    proxy.add_rule(Fault.refuse_entries(0.34), service="kinesis", operation="PutRecords", seed=3)
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        for i in range(120):
            outbox.publish(conn, stream, b"%d" % i, partition_key=f"k{i % 3}")
    relays.start(producer={"kinesis_endpoint": proxy.url, "ordering": "none"})
    wait_until(relays.drained, what="the relay to empty the outbox")
    landed = by_key(read_all(kinesalite.url, stream))
    assert landed == {f"k{k}": [b"%d" % i for i in range(k, 120, 3)] for k in range(3)}
