"""The outbox's tables, its SQL, and the hashes that place a row: its key lock and partition.

One row per record waiting for Kinesis, in ``<table>``; a row Kinesis refuses for good moves to
``<table>_dead`` with the error. The schema is public: a writer in another language may insert
rows itself, provided it takes the same per-key lock (:func:`key_lock`) in its transaction and
computes ``part`` as :func:`partition` does. ::

    id                bigserial PRIMARY KEY     the order of a key's rows, and their stable id
    stream            text                      the Kinesis stream (CHECKed: 1-128 [A-Za-z0-9_.-])
    partition_key     text                      (CHECKed: 1-256 characters)
    explicit_hash_key text NULL                 (CHECKed: Kinesis' pattern, at most 2**128-1)
    data              bytea                     the record's bytes, as they will be put
    record_id         text                      the record's id to deduplicate on
    part              smallint                  0 .. PARTITIONS-1: which relay publishes it
                                                (CHECKed: a row outside would wait forever)
    created_at        timestamptz               when publish() ran (clock_timestamp())

**Why a key lock.** A ``bigserial`` id is drawn at INSERT, not at COMMIT: transaction A may draw
id 5, transaction B id 6, and B commit first. Ordering a key's rows by id would then publish
them out of commit order. ``publish()`` therefore takes a transaction-scoped advisory lock on
the (stream, partition key) before drawing the id: a second transaction writing the same key
waits until the first commits or rolls back, so within a key ids grow in commit order, and a
relay reading committed rows sees, per key, a prefix of that order.

**Who holds a partition.** ``<table>_parts`` names the session (pid, role, start time) holding
each of the PARTITIONS partitions, and ``<table>_relay`` lists the relay sessions; a claim
counts while PostgreSQL still runs that session. Advisory locks would let any role that can
connect hold every partition (they have no permissions); these tables are written by the
relays' role only.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import psycopg
from psycopg import sql

#: Relays split the table into this many partitions by key (a relay owns whole partitions;
#: the table CHECKs its range: change both together).
PARTITIONS = 64
#: What a row must hold (Kinesis' limits; rows written by SQL skip ``publish()``'s checks):
#: (constraint name, condition). Added NOT VALID to a table created before them, then validated
#: if its rows allow (see :meth:`Names.constraints`). CASE: the cast runs only on digits.
CONSTRAINTS = (
    ("outbox_stream_name", "stream ~ '^[A-Za-z0-9_.-]{1,128}$'"),
    ("outbox_partition_key_length", "char_length(partition_key) BETWEEN 1 AND 256"),
    (
        "outbox_explicit_hash_key",
        "explicit_hash_key IS NULL OR CASE WHEN explicit_hash_key ~ '^(0|[1-9][0-9]{0,38})$' "
        "THEN explicit_hash_key::numeric <= 340282366920938463463374607431768211455 "
        "ELSE false END",
    ),
)

_TABLE = """CREATE TABLE IF NOT EXISTS {table} (
    id bigserial PRIMARY KEY,
    stream text NOT NULL,
    partition_key text NOT NULL,
    explicit_hash_key text,
    data bytea NOT NULL,
    record_id text NOT NULL,
    part smallint NOT NULL CHECK (part >= 0 AND part < 64),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS {index} ON {table} (part, id)"
_DEAD = """CREATE TABLE IF NOT EXISTS {dead} (
    id bigint PRIMARY KEY,
    stream text NOT NULL,
    partition_key text NOT NULL,
    explicit_hash_key text,
    data bytea NOT NULL,
    record_id text NOT NULL,
    part smallint NOT NULL,
    created_at timestamptz NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    error text NOT NULL
)"""
#: Which relay session holds each partition. Only the relays' role writes it (no grant to
#: anyone else), so a role that can merely connect cannot hold a partition; a claim counts
#: while its session lives (pg_stat_activity: PostgreSQL's view, no clock compared).
_PARTS = """CREATE TABLE IF NOT EXISTS {parts} (
    part smallint PRIMARY KEY CHECK (part >= 0 AND part < 64),
    pid integer,
    role oid,
    started timestamptz
)"""
_PARTS_ROWS = "INSERT INTO {parts} (part) SELECT generate_series(0, 63) ON CONFLICT DO NOTHING"
#: The relays running (one row per relay session): they count each other by it.
_PRESENCE = """CREATE TABLE IF NOT EXISTS {presence} (
    pid integer NOT NULL,
    role oid NOT NULL,
    started timestamptz NOT NULL,
    PRIMARY KEY (pid, started)
)"""
#: Whether the session of a claim (alias c) still runs. backend_start is visible for sessions
#: of roles whose privileges the reader has; for others only the pid and role are compared.
LIVE = """EXISTS (SELECT 1 FROM pg_stat_activity AS a WHERE a.pid = c.pid
    AND a.usesysid = c.role AND (a.backend_start IS NULL OR a.backend_start = c.started))"""
#: This session's identity, as claims record it.
ME = """SELECT pg_backend_pid(), (SELECT oid FROM pg_roles WHERE rolname = current_user),
    (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"""
INSERT = """INSERT INTO {table}
    (stream, partition_key, explicit_hash_key, data, record_id, part)
VALUES (%s, %s, %s, %s, %s, %s) RETURNING id"""
#: A cycle's rows: among the first ``%(head)s`` rows by id of the keys not backing off (a key
#: whose put failed waits out its back-off outside the window, so rows that cannot be written
#: never hide the rows behind them), each key's first ``%(per_key)s``,
#: then the first ``%(batch)s`` of those by id. Each key gets a prefix of its rows (its order),
#: and one key's backlog cannot fill the batch: its rows go one per round trip, and every
#: other key would wait outside the batch meanwhile. The window works on ids and keys only
#: (no payloads); the payloads of the rows picked are read by the join.
READ = """SELECT t.id, t.stream, t.partition_key, t.explicit_hash_key, t.data, t.record_id,
    extract(epoch FROM clock_timestamp() - t.created_at)::float8
FROM {table} AS t JOIN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY stream, partition_key ORDER BY id) AS nth
        FROM (SELECT id, stream, partition_key FROM {table}
              WHERE part = ANY(%(parts)s) AND (stream, partition_key) NOT IN (
                  SELECT * FROM unnest(%(wait_streams)s::text[], %(wait_keys)s::text[]))
              ORDER BY id LIMIT %(head)s) AS head
    ) AS keyed
    WHERE nth <= %(per_key)s ORDER BY id LIMIT %(batch)s
) AS picked USING (id)
ORDER BY t.id"""
DELETE = "DELETE FROM {table} WHERE id = ANY(%s)"
MOVE_ASIDE = """INSERT INTO {dead}
    (id, stream, partition_key, explicit_hash_key, data, record_id, part, created_at, error)
SELECT id, stream, partition_key, explicit_hash_key, data, record_id, part, created_at, %s
FROM {table} WHERE id = %s ON CONFLICT (id) DO NOTHING"""
#: The rows of the partitions nobody live holds (no relay, or only dead ones).
UNHELD = (
    """SELECT count(*) FROM {table} WHERE part IN (
    SELECT part FROM {parts} AS c WHERE c.pid IS NULL OR NOT """
    + LIVE
    + ")"
)
LAG = """SELECT count(*), extract(epoch FROM clock_timestamp() - min(created_at))::float8,
    (SELECT count(*) FROM {dead}) FROM {table}"""


class Names:
    """The SQL names of one outbox: its table, its dead-letter table, its index, the relays'
    tables (partition claims, presence), the NOTIFY channel and the advisory-lock class that
    serializes ``create_table()``, all derived from ``table``."""

    def __init__(self, table: str) -> None:
        parts = table.split(".")
        self.text = table
        self.table = sql.Identifier(*parts)
        self.dead = sql.Identifier(*parts[:-1], parts[-1] + "_dead")
        self.index = sql.Identifier(parts[-1] + "_part_id")
        self.parts = sql.Identifier(*parts[:-1], parts[-1] + "_parts")
        self.parts_text = table + "_parts"
        self.presence = sql.Identifier(*parts[:-1], parts[-1] + "_relay")
        self.presence_text = table + "_relay"
        digest = hashlib.blake2b(table.encode(), digest_size=8).digest()
        #: LISTEN/pg_notify channel (identifiers stop at 63 bytes: a hash, not the name).
        self.channel = "kinesumer_outbox_" + digest.hex()
        #: The advisory lock create_table() takes (0 .. 2**31-1).
        self.lock_class = int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

    def query(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(
            table=self.table,
            dead=self.dead,
            index=self.index,
            parts=self.parts,
            presence=self.presence,
        )

    def schema(self) -> list[sql.Composed]:
        """The statements that create the outbox (each idempotent)."""
        return [
            *(self.query(_TABLE), self.query(_INDEX), self.query(_DEAD)),
            *(self.query(_PARTS), self.query(_PARTS_ROWS), self.query(_PRESENCE)),
        ]

    def add_constraint(self, name: str, condition: str) -> sql.Composed:
        """ALTER TABLE adding a CHECK that existing rows need not meet yet (NOT VALID: new and
        updated rows must; ``validate()`` checks the old ones)."""
        return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({}) NOT VALID").format(
            self.table,
            sql.Identifier(name),
            sql.SQL(condition),
        )

    def validate(self, name: str) -> sql.Composed:
        return sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(
            self.table, sql.Identifier(name)
        )


_OWNERS = """SELECT t.name, pg_get_userbyid(c.relowner)
    FROM unnest(%s::text[]) AS t(name) JOIN pg_class AS c ON c.oid = to_regclass(t.name)"""


def foreign_owners(conn: psycopg.Connection[Any], names: Names) -> str | None:
    """Why the outbox's tables cannot be trusted, or None: the dead-letter and relay tables must
    belong to the outbox table's owner. Each is created ``IF NOT EXISTS``: a role that may
    create tables in the schema (PUBLIC may in ``public`` up to PostgreSQL 14) could create one
    first, grant it to PUBLIC, and then hold the relays' partitions or read the dead letters."""
    tables = [names.text, names.text + "_dead", names.parts_text, names.presence_text]
    owners = dict(conn.execute(_OWNERS, (tables,)).fetchall())
    owner = owners.get(names.text)
    foreign = sorted(f"{t} (owned by {o})" for t, o in owners.items() if o != owner)
    if owner is None or not foreign:
        return None
    return (
        f"the outbox's tables {', '.join(foreign)} do not belong to {owner}, the owner of "
        f"{names.text}: another role created them; drop them (as their owner or a superuser), "
        f"revoke CREATE on the schema from roles other than the outbox's, and run "
        f"`kinesumer outbox create-table` again"
    )


def key_lock(table: str, stream: str, partition_key: str) -> int:
    """The bigint of the transaction-scoped advisory lock ``publish()`` takes per key (a
    64-bit hash: two keys share a lock only by a collision, which costs waiting, never order)."""
    digest = hashlib.blake2b(f"{table}\0{stream}\0{partition_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def partition(stream: str, partition_key: str) -> int:
    """The relay partition of a key: CRC-32 of ``stream NUL key`` (UTF-8) modulo PARTITIONS."""
    return zlib.crc32(f"{stream}\0{partition_key}".encode()) % PARTITIONS
