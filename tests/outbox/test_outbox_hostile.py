"""The outbox against hostile input: rows written by SQL that Kinesis would refuse, rows that
cannot be written (a missing stream), a role that can only connect (advisory locks, NOTIFY),
and row text or connection strings that must not reach labels, logs or errors. A real
PostgreSQL (tests/support/postgres.py) and kinesalite.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from support.group import create_stream
from support.outbox import Relays
from support.postgres import PostgresServer, postgres_server
from support.produced import by_key, read_all
from support.standins import NodeStandIn
from support.wait import wait_until

from kinesumer import ConfigError, InvalidRecordError, cli
from kinesumer.observability.metrics import Metrics
from kinesumer.outbox import OutboxError, PostgresOutbox
from kinesumer.outbox.schema import Names, key_lock, partition
from kinesumer.producer.records import check_record

INTRUDER = "intruder"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server, server.connect() as admin:
        # A role that may connect and nothing else: no grant on any outbox table.
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(INTRUDER)))
        yield server


@pytest.fixture
def outbox(postgres: PostgresServer, unique_name: Callable[[str], str]) -> PostgresOutbox:
    box = PostgresOutbox(postgres.conninfo, table=unique_name("hostile").replace("-", "_"))
    box.create_table()
    return box


def intruder_conninfo(postgres: PostgresServer) -> str:
    return postgres.conninfo.replace("user=kinesumer", f"user={INTRUDER}")


class Recorded(Metrics):
    """The stream labels the relay gives its counters."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: set[str] = set()

    def outbox_relayed(self, stream: str, records: int) -> None:
        self.labels.add(stream)

    def outbox_moved_aside(self, stream: str) -> None:
        self.labels.add(stream)


@pytest.fixture
def relays(outbox: PostgresOutbox, kinesalite: NodeStandIn) -> Iterator[Relays]:
    running = Relays(outbox, kinesalite.url)
    yield running
    running.close()


def insert_unchecked(outbox: PostgresOutbox, rows: list[tuple[str, str, str | None]]) -> None:
    """Rows (stream, key, hash key) written by SQL into a table without the CHECKs (as in a
    deployment created before them): what a writer that skips publish() can leave."""
    names = Names(outbox.table)
    with psycopg.connect(outbox.conninfo) as conn, conn.transaction():
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} DROP CONSTRAINT IF EXISTS outbox_stream_name, "
                "DROP CONSTRAINT IF EXISTS outbox_partition_key_length, "
                "DROP CONSTRAINT IF EXISTS outbox_explicit_hash_key"
            ).format(names.table)
        )
        for stream, key, hash_key in rows:
            conn.execute(
                names.query(
                    "INSERT INTO {table} (stream, partition_key, explicit_hash_key, data, "
                    "record_id, part) VALUES (%s, %s, %s, %s, %s, %s)"
                ),
                (stream, key, hash_key, b"x", "r", partition(stream, key)),
            )


def dead_letters(outbox: PostgresOutbox) -> list[tuple[str, str, str]]:
    with psycopg.connect(outbox.conninfo) as conn:
        query = Names(outbox.table).query("SELECT stream, partition_key, error FROM {dead}")
        return [(str(s), str(k), str(e)) for s, k, e in conn.execute(query)]


def publish(outbox: PostgresOutbox, stream: str, keys: list[str], data: bytes = b"v") -> None:
    with psycopg.connect(outbox.conninfo) as conn, conn.transaction():
        for key in keys:
            outbox.publish(conn, stream, data, partition_key=key)


# -- 1. a row kills every relay ------------------------------------------------------------------
@pytest.mark.parametrize("hash_key", ["²", "٣", "1" * 5000, "01", str(2**128)])
def test_an_explicit_hash_key_kinesis_refuses_is_an_invalid_record(hash_key: str) -> None:
    """'²' and '٣' pass str.isdigit() (int() then fails), 5,000 digits pass it too (past
    Python's int() limit), Kinesis' pattern has no leading zero, and 2**128 is out of range."""
    with pytest.raises(InvalidRecordError, match="explicit_hash_key"):
        check_record(b"x", "k", hash_key)
    assert check_record(b"x", "k", str(2**128 - 1)) == b"x"
    assert check_record(b"x", "k", "0") == b"x"


def test_rows_kinesis_would_refuse_move_aside_and_the_rows_behind_them_flow(
    outbox: PostgresOutbox,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """Hash keys that break put()'s parsing, written by SQL before valid rows of the same key
    and of another: both relays stay up, the bad rows move aside with their errors, the valid
    ones reach Kinesis."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    insert_unchecked(outbox, [(stream, "k", "²"), (stream, "k", "7" * 5000)])
    publish(outbox, stream, ["k", "other"])
    relays.start(2)
    wait_until(lambda: relays.pending() == 0, what="the valid rows relayed, the bad moved aside")
    assert by_key(read_all(kinesalite.url, stream)) == {"k": [b"v"], "other": [b"v"]}
    errors = [error for _, _, error in dead_letters(outbox)]
    assert len(errors) == 2 and all("explicit_hash_key" in error for error in errors)


def test_the_table_refuses_what_kinesis_would_and_an_old_table_gets_the_checks(
    outbox: PostgresOutbox,
) -> None:
    """New tables CHECK the stream name, the key's length and the hash key. On a table created
    without them and holding a row that breaks one, create_table() adds them NOT VALID (new rows
    are checked at once), and validates them once that row is gone."""
    names = Names(outbox.table)
    insert = names.query(
        "INSERT INTO {table} (stream, partition_key, explicit_hash_key, data, record_id, part) "
        "VALUES (%s, %s, %s, 'x', 'r', 0)"
    )
    bad = [("bad name", "k", None), ("s", "", None), ("s", "k" * 257, None)]
    bad += [("s", "k", "²"), ("s", "k", "01"), ("s", "k", str(2**128))]
    with psycopg.connect(outbox.conninfo, autocommit=True) as conn:
        for row in bad:
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(insert, row)
        conn.execute(insert, ("s.ok-1", "k" * 256, str(2**128 - 1)))
    insert_unchecked(outbox, [("old bad", "k", None)])
    outbox.create_table()
    validated = names.query(
        "SELECT conname, convalidated FROM pg_constraint WHERE conrelid = %s::regclass"
    )
    with psycopg.connect(outbox.conninfo, autocommit=True) as conn:
        states = dict(conn.execute(validated, (outbox.table,)).fetchall())
        assert states["outbox_stream_name"] is False  # the old row is still there
        assert states["outbox_explicit_hash_key"] is True
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, ("new bad", "k", None))
        conn.execute(names.query("DELETE FROM {table} WHERE stream = 'old bad'"))
    outbox.create_table()
    with psycopg.connect(outbox.conninfo, autocommit=True) as conn:
        assert all(dict(conn.execute(validated, (outbox.table,)).fetchall()).values())


# -- 2. rows that cannot be written hide every later row -----------------------------------------
def test_rows_for_a_missing_stream_do_not_hold_back_a_valid_row(
    outbox: PostgresOutbox,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batch 10 reads among the oldest 40 rows: 40 rows of a stream that does not exist, older
    than one valid row, kept it out of every read. Their keys back off out of the reads now,
    and no WARNING line names a key."""
    missing, stream = unique_name("missing"), unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    publish(outbox, missing, [f"secret-key-{i}" for i in range(40)])
    publish(outbox, stream, ["valid-key"])
    caplog.set_level(logging.DEBUG, logger="kinesumer.outbox")
    relays.start(batch_size=10)
    wait_until(lambda: bool(read_all(kinesalite.url, stream)), what="the valid row relayed")
    assert by_key(read_all(kinesalite.url, stream)) == {"valid-key": [b"v"]}
    relays.alive()
    assert outbox.stats().pending == 40
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings and not [line for line in warnings if "secret-key" in line]
    assert "secret-key" in caplog.text  # at DEBUG, for whoever asks for it


def test_a_row_that_keeps_failing_moves_aside_with_its_error_after_max_attempts(
    outbox: PostgresOutbox,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    missing = unique_name("missing")
    publish(outbox, missing, ["a", "a", "b"])
    relays.start(max_attempts=2)
    wait_until(lambda: relays.pending() == 0, what="every row moved aside after 2 attempts")
    dead = dead_letters(outbox)
    assert len(dead) == 3
    assert all("not written after 2 attempt(s)" in error for _, _, error in dead)


def test_rows_of_a_stream_outside_the_allow_list_move_aside_at_once(
    outbox: PostgresOutbox,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    allowed, other = unique_name("ob"), unique_name("other")
    for name in (allowed, other):
        create_stream(kinesalite.url, name, 1)
    publish(outbox, other, ["k"])
    publish(outbox, allowed, ["k"])
    relays.start(streams=[allowed])
    wait_until(lambda: relays.pending() == 0, what="the outbox emptied")
    assert by_key(read_all(kinesalite.url, allowed)) == {"k": [b"v"]}
    assert read_all(kinesalite.url, other) == []
    ((stream, _, error),) = dead_letters(outbox)
    assert stream == other and "--streams" in error


# -- 3. any role that can connect can stop the relays --------------------------------------------
def test_a_role_that_can_only_connect_cannot_stop_the_relays(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
) -> None:
    """The intruder (no grant on the outbox) holds every advisory lock the relays used to
    coordinate by (all 64 partitions, from one session) and the presence lock from 63 sessions:
    the relays still deliver every row."""
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 2)
    lock_class = Names(outbox.table).lock_class
    sessions = [psycopg.connect(intruder_conninfo(postgres), autocommit=True) for _ in range(63)]
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            sessions[0].execute(sql.SQL("SELECT 1 FROM {}").format(Names(outbox.table).table))
        sessions[0].execute(
            "SELECT pg_advisory_lock(%s, p) FROM generate_series(0, 63) AS p", (lock_class,)
        )
        for session in sessions:
            session.execute("SELECT pg_advisory_lock_shared(%s, 65535)", (lock_class,))
        keys = [f"k{i}" for i in range(200)]
        publish(outbox, stream, keys)
        relays.start(2)
        wait_until(lambda: relays.pending() == 0, what="the relays to deliver every row")
        assert sorted(by_key(read_all(kinesalite.url, stream))) == sorted(keys)
    finally:
        for session in sessions:
            session.close()


def test_publish_gives_up_on_a_key_lock_another_role_holds(
    outbox: PostgresOutbox, postgres: PostgresServer
) -> None:
    """The intruder holds a key's publish lock (advisory locks need no grant): publish() of that
    key raises after lock_timeout instead of waiting for ever, and leaves the caller's own
    lock_timeout as it was."""
    with psycopg.connect(intruder_conninfo(postgres), autocommit=True) as intruder:
        intruder.execute("SELECT pg_advisory_lock(%s)", (key_lock(outbox.table, "s", "held"),))
        impatient = PostgresOutbox(outbox.conninfo, table=outbox.table, lock_timeout=0.5)
        with (
            psycopg.connect(outbox.conninfo) as conn,
            pytest.raises(OutboxError, match="lock_timeout"),
            conn.transaction(),
        ):
            impatient.publish(conn, "s", b"v", partition_key="held")
        with psycopg.connect(outbox.conninfo) as conn, conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '7s'")
            impatient.publish(conn, "s", b"v", partition_key="free")
            setting = conn.execute("SHOW lock_timeout").fetchone()
            assert setting is not None and setting[0] == "7s"


def test_a_relay_holding_no_partition_while_rows_wait_says_so(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A live session of the relays' own role (not a relay) claims every partition: the relay
    can take none, and says so while rows wait."""
    publish(outbox, unique_name("ob"), ["k"])
    with postgres.connect() as squatter:
        squatter.execute(
            Names(outbox.table).query(
                "UPDATE {parts} SET pid = pg_backend_pid(), role = (SELECT oid FROM pg_roles "
                "WHERE rolname = current_user), started = (SELECT backend_start FROM "
                "pg_stat_activity WHERE pid = pg_backend_pid())"
            )
        )
        relays.start()
        wait_until(
            lambda: "holds no partition while 1 row(s) are pending" in caplog.text,
            what="the relay to report that it holds no partition",
        )
    relays.alive()


# -- 4. NOTIFY flood -----------------------------------------------------------------------------
def table_scans(postgres: PostgresServer, outbox: PostgresOutbox) -> int:
    with postgres.connect() as conn:
        row = conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE relid = %s::regclass",
            (outbox.table,),
        ).fetchone()
    return 0 if row is None else int(row[0])


def test_a_notify_flood_costs_one_read_per_gap_not_one_per_notification(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
) -> None:
    """The intruder NOTIFYs the relays' channel as fast as it can for 3 s; the relay reads the
    table (counted by PostgreSQL's statistics, flushed when the relay's sessions end) at most
    once per MIN_READ_GAP (0.05 s), plus its polls and rebalances, where it used to read once
    per notification (thousands)."""
    channel = Names(outbox.table).channel
    before = table_scans(postgres, outbox)
    relays.start(poll_interval=60.0)
    sent = 0
    with psycopg.connect(intruder_conninfo(postgres), autocommit=True) as flood:
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            flood.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(channel)))
            sent += 1
    relays.close()
    elapsed = time.monotonic() - started
    # Statistics reach the shared view shortly after the sessions end: wait for them to settle.
    seen: list[int] = []

    def settled() -> bool:
        seen.append(table_scans(postgres, outbox))
        return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] and seen[-1] > before

    wait_until(settled, what="the relay's table statistics to settle")
    reads = seen[-1] - before
    assert sent > 500, sent  # a flood, not a trickle
    assert reads <= elapsed / MIN_READ_GAP + 50, (reads, sent)


#: kinesumer.outbox.relay.MIN_READ_GAP, written out so the test also runs against older code.
MIN_READ_GAP = 0.05


# -- 5. row text and connection strings in metrics, logs and errors -----------------------------
def test_invalid_stream_names_are_one_label_and_keys_stay_out_of_warnings(
    outbox: PostgresOutbox,
    kinesalite: NodeStandIn,
    relays: Relays,
    caplog: pytest.LogCaptureFixture,
) -> None:
    insert_unchecked(outbox, [(f"bad stream {i}", f"secret-key-{i}", None) for i in range(30)])
    metrics = Recorded()
    caplog.set_level(logging.DEBUG, logger="kinesumer.outbox")
    relays.start(metrics=metrics)
    wait_until(lambda: relays.pending() == 0, what="the invalid rows moved aside")
    # The relay logs, meters and counts the rows moved aside after their transaction commits:
    # once all 30 are counted, every warning and label is in.
    wait_until(lambda: outbox.stats().moved_aside == 30, what="the 30 rows counted")
    assert metrics.labels == {"(invalid)"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings and not [line for line in warnings if "secret-key" in line]


def test_a_malformed_connection_string_is_refused_without_quoting_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    conninfo = "host=127.0.0.1 password=Tr0ub4dor&3 horse"
    with pytest.raises(ConfigError, match="conninfo") as caught:
        PostgresOutbox(conninfo)
    assert "horse" not in str(caught.value) and "Tr0ub4dor" not in str(caught.value)
    assert cli.main(["outbox", "status", "--conninfo", conninfo]) == 2
    err = capsys.readouterr().err
    assert "conninfo" in err and "horse" not in err and "Tr0ub4dor" not in err


def test_the_cli_redacts_the_password_from_a_refused_connection(
    postgres: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server refuses the database; libpq's message and the CLI's must not show the
    password (here also the database name's neighbour in the string)."""
    conninfo = (
        f"{postgres.conninfo.replace('dbname=postgres', 'dbname=nosuchdb')} password=s3cr3t-pw"
    )
    assert cli.main(["outbox", "status", "--conninfo", conninfo]) == 1
    err = capsys.readouterr().err
    assert "nosuchdb" in err and "s3cr3t-pw" not in err
    assert PostgresOutbox(conninfo).redact(f"x {conninfo} y").count("s3cr3t-pw") == 0


def test_the_documented_grants_are_enough_for_the_application_and_the_relays(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
) -> None:
    """The application's role publishes and the relays' role relays with the grants the docs
    ("The table: Roles") list, and nothing more."""
    names = Names(outbox.table)
    app, relay = unique_name("app").replace("-", "_"), unique_name("relay").replace("-", "_")
    grants = [
        "CREATE ROLE {app} LOGIN",
        "CREATE ROLE {relay} LOGIN",
        "GRANT INSERT, SELECT (id) ON {table} TO {app}",
        "GRANT USAGE ON SEQUENCE {sequence} TO {app}",
        "GRANT SELECT, DELETE ON {table} TO {relay}",
        "GRANT SELECT, INSERT ON {dead} TO {relay}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {parts}, {presence} TO {relay}",
    ]
    with postgres.connect() as admin:
        for grant in grants:
            admin.execute(
                sql.SQL(grant).format(
                    app=sql.Identifier(app),
                    relay=sql.Identifier(relay),
                    table=names.table,
                    sequence=sql.Identifier(outbox.table + "_id_seq"),
                    dead=names.dead,
                    parts=names.parts,
                    presence=names.presence,
                )
            )
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    as_app = PostgresOutbox(
        postgres.conninfo.replace("user=kinesumer", f"user={app}"), table=outbox.table
    )
    publish(as_app, stream, ["a", "b"])
    as_relay = PostgresOutbox(
        postgres.conninfo.replace("user=kinesumer", f"user={relay}"), table=outbox.table
    )
    running = Relays(as_relay, kinesalite.url)
    running.start()
    try:
        wait_until(lambda: running.pending() == 0, what="the relay's role to relay every row")
    finally:
        running.close()
    assert by_key(read_all(kinesalite.url, stream)) == {"a": [b"v"], "b": [b"v"]}


def test_adding_the_checks_to_a_busy_old_table_gives_up_instead_of_queueing_writers(
    outbox: PostgresOutbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open transaction that published holds the table: create_table() on a table without
    the checks waits ALTER_LOCK_TIMEOUT for it (every publish() would queue behind the ALTER
    meanwhile), then raises OutboxError, changing nothing; once the writer commits it works."""
    from kinesumer.outbox import outbox as outbox_module

    monkeypatch.setattr(outbox_module, "ALTER_LOCK_TIMEOUT", 0.2)
    insert_unchecked(outbox, [])  # the table as an older version created it
    with psycopg.connect(outbox.conninfo) as writer:
        with writer.transaction():
            outbox.publish(writer, "s", b"v", partition_key="k")
            with pytest.raises(OutboxError, match="run it again"):
                outbox.create_table()
        outbox.create_table()
    with psycopg.connect(outbox.conninfo) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass "
            "AND conname LIKE 'outbox_%%' AND convalidated",
            (outbox.table,),
        ).fetchone()
    assert found is not None and found[0] == 3


def test_relay_tables_another_role_created_first_are_refused_not_used(
    postgres: PostgresServer, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """PUBLIC may create tables in ``public`` up to PostgreSQL 14: such a role can create the
    relays' partition table before an upgrade's ``create_table()`` (which creates it only if
    missing), open it to everyone and hold every partition. ``create_table()`` and the relay
    refuse tables that are not the outbox owner's, naming the fix."""
    table = unique_name("owned").replace("-", "_")
    parts = sql.Identifier(table + "_parts")
    outbox = PostgresOutbox(postgres.conninfo, table=table)
    outbox.create_table()
    with postgres.connect() as admin:
        admin.execute(sql.SQL("DROP TABLE {}").format(parts))  # as before an upgrade made it
        admin.execute(
            sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(INTRUDER))
        )
    try:
        with psycopg.connect(intruder_conninfo(postgres), autocommit=True) as intruder:
            intruder.execute(
                sql.SQL("CREATE TABLE {} (part int PRIMARY KEY, pid int, started timestamptz)")
                .format(parts)
            )  # fmt: skip
            intruder.execute(sql.SQL("GRANT ALL ON {} TO PUBLIC").format(parts))
        with pytest.raises(OutboxError, match=rf"{table}_parts \(owned by {INTRUDER}\)"):
            outbox.create_table()
        relays = Relays(outbox, kinesalite.url)
        relays.start()
        wait_until(lambda: bool(relays.errors), 30, "the relay to refuse the intruder's table")
        relays.stop.set()
        assert any(f"{table}_parts (owned by {INTRUDER})" in str(e) for e in relays.errors), (
            relays.errors
        )
    finally:
        with postgres.connect() as admin:
            admin.execute(
                sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(sql.Identifier(INTRUDER))
            )
