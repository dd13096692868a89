"""PostgresOutbox: write a record in the caller's transaction; a relay puts it to Kinesis later.

::

    outbox = PostgresOutbox(conninfo)
    outbox.create_table()                       # or: kinesumer outbox create-table
    with psycopg.connect(conninfo) as conn, conn.transaction():
        conn.execute("UPDATE accounts ...")
        outbox.publish(conn, "orders", b"...", partition_key="order-1")

    outbox.relay(producer, stop=event)          # elsewhere: blocks until event.is_set()

The row commits or rolls back with the caller's changes. The relay (:mod:`.relay`) puts
committed rows through a :class:`~kinesumer.Producer` and deletes them only once Kinesis
acknowledged them: every committed record reaches Kinesis at least once, each partition key's
records in commit order (first occurrences), a rolled-back one never.
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

try:
    import psycopg
    from psycopg import errors
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "kinesumer.outbox needs psycopg 3: pip install 'kinesumer[postgres]'"
    ) from exc

from ..errors import (
    ConfigError,
    InvalidRecordError,
    OutboxConnectionError,
    OutboxTableNotFoundError,
)
from ..metrics import Metrics, metrics_for
from ..producer import Producer
from ..producer.records import check_record
from ..topics import Topic
from .relay import Relay
from .schema import INSERT, LAG, Names, key_lock, partition
from .stats import OutboxStats, summarize

_STREAM = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
#: Lower case: the name is quoted in SQL and read back unquoted (``to_regclass``).
_TABLE = re.compile(r"^[a-z_][a-z0-9_]{0,57}(\.[a-z_][a-z0-9_]{0,57})?$")
#: The INSERT draws the row's id only after the key's lock is held (see schema.py's "Why a
#: key lock"), and queues the relays' wake-up, which PostgreSQL delivers at COMMIT only.
_PUBLISH = INSERT.replace(
    "VALUES (%s, %s, %s, %s, %s, %s)",
    "SELECT %s, %s, %s, %s, %s, %s FROM (SELECT pg_advisory_xact_lock(%s), pg_notify(%s, '')) "
    "AS locked",
)


class PostgresOutbox:
    """A transactional outbox in PostgreSQL (psycopg 3, ``pip install 'kinesumer[postgres]'``).

    ``conninfo``: how :meth:`create_table`, :meth:`stats` and :meth:`relay` connect (a libpq
    connection string or URL); :meth:`publish` uses the caller's connection. ``table``:
    ``"name"`` or ``"schema.name"``; rows Kinesis refuses for good go to ``<table>_dead``.
    """

    def __init__(self, conninfo: str, *, table: str = "kinesumer_outbox") -> None:
        if not isinstance(table, str) or not _TABLE.match(table):
            raise ConfigError(
                "table", f"a name or schema.name of [a-z0-9_], got {table!r}", "PostgresOutbox"
            )
        self.conninfo = conninfo
        self.table = table
        self._names = Names(table)
        self._lock = threading.Lock()
        self._relays: list[Relay] = []

    # -- the table ------------------------------------------------------------------------------
    def create_table(self) -> None:
        """Create the outbox table, its index and its dead-letter table (idempotent)."""
        with psycopg.connect(self.conninfo, autocommit=True) as conn, conn.transaction():
            # Concurrent CREATE ... IF NOT EXISTS can still collide: one at a time.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._names.lock_class,))
            for statement in self._names.schema():
                conn.execute(statement)

    # -- writing --------------------------------------------------------------------------------
    def publish(
        self,
        conn: psycopg.Connection[Any],
        stream: str | Topic[Any],
        data: Any,
        *,
        partition_key: str,
        explicit_hash_key: str | None = None,
        record_id: str | None = None,
    ) -> str:
        """Add a record to the outbox inside ``conn``'s transaction; return its record id.

        ``stream``: a stream name (``data`` is bytes) or a :class:`~kinesumer.Topic` (``data``
        a value of its type, encoded now). ``record_id``: the id to deduplicate on (default: a
        new UUID, hex); a resend carries the same bytes, so put the id inside the payload if
        consumers must see it (see the docs' "Outbox"). The row commits with the transaction;
        the call takes the key's advisory lock until then (another transaction publishing the
        same stream and key waits for this one; publish a transaction's keys in a fixed order,
        e.g. sorted, or two transactions taking the same keys in opposite orders deadlock and
        PostgreSQL aborts one with ``psycopg.errors.DeadlockDetected``). Raises
        :class:`InvalidRecordError` (payload the topic cannot encode, bad key, over 10 MiB),
        :class:`OutboxConnectionError`, :class:`OutboxTableNotFoundError`. A row over 1 MiB
        is checked against its stream's maximum record size by the relay (publish() holds no
        Kinesis client): one over it moves to the dead-letter table as ``RecordTooLargeError``.
        """
        _check_connection(conn)
        params = self._params(stream, data, partition_key, explicit_hash_key, record_id)
        try:
            conn.execute(self._names.query(_PUBLISH), params)
        except errors.UndefinedTable as exc:
            raise self._no_table() from exc
        return str(params[4])

    async def publish_async(
        self,
        conn: psycopg.AsyncConnection[Any],
        stream: str | Topic[Any],
        data: Any,
        *,
        partition_key: str,
        explicit_hash_key: str | None = None,
        record_id: str | None = None,
    ) -> str:
        """:meth:`publish` on a ``psycopg.AsyncConnection`` (an async handler's connection)."""
        _check_connection(conn)
        params = self._params(stream, data, partition_key, explicit_hash_key, record_id)
        try:
            await conn.execute(self._names.query(_PUBLISH), params)
        except errors.UndefinedTable as exc:
            raise self._no_table() from exc
        return str(params[4])

    def _params(
        self,
        stream: str | Topic[Any],
        data: Any,
        partition_key: str,
        explicit_hash_key: str | None,
        record_id: str | None,
    ) -> tuple[Any, ...]:
        if isinstance(stream, Topic):
            name, data = stream.stream, stream.encode(data)
        else:
            name = stream
        if not isinstance(name, str) or not _STREAM.match(name):
            raise InvalidRecordError(
                f"publish(stream): a stream name is 1-128 of [A-Za-z0-9_.-], got {name!r}"
            )
        payload = check_record(data, partition_key, explicit_hash_key)
        if record_id is None:
            record_id = uuid.uuid4().hex
        elif not isinstance(record_id, str) or not record_id:
            raise InvalidRecordError(f"publish(record_id): a non-empty string, got {record_id!r}")
        lock = key_lock(self.table, name, partition_key)
        part = partition(name, partition_key)
        return (
            *(name, partition_key, explicit_hash_key, payload, record_id, part),
            *(lock, self._names.channel),
        )

    def _no_table(self) -> OutboxTableNotFoundError:
        return OutboxTableNotFoundError(
            f"the outbox table {self.table!r} does not exist: create it with "
            f"PostgresOutbox.create_table() or `kinesumer outbox create-table`"
        )

    # -- relaying -------------------------------------------------------------------------------
    def relay(
        self,
        producer: Producer | None,
        *,
        stop: threading.Event | None = None,
        batch_size: int = 500,
        poll_interval: float = 1.0,
        metrics: Metrics | None = None,
    ) -> None:
        """Put committed rows to Kinesis through ``producer`` until ``stop`` is set (forever
        without it); blocks the calling thread. See :class:`~.relay.Relay` for the guarantees.

        Several relays (threads, processes, hosts) may run at once: each holds some of the
        table's key partitions (PostgreSQL session advisory locks), so a key has one relay at a
        time; a relay that dies (even by SIGKILL) frees its partitions as PostgreSQL ends its
        session, and the others take them within about a second (so a relay needs a session
        of its own: not a pooler in transaction mode). ``poll_interval``: the longest a relay
        waits without a NOTIFY. Give it a producer without ``topics=`` (rows are bytes
        already): one with topics raises ConfigError.
        The producer's ``close()`` may raise FlushError for puts that failed and that the relay
        put again (their rows stayed): suppress it. Metrics: the producer's config's (``metrics``
        overrides). Errors that retrying will not heal (no table, a closed producer) raise here.
        """
        if not isinstance(producer, Producer):
            raise ConfigError(
                "producer",
                f"a kinesumer.Producer configured for the streams (region or endpoint), not "
                f"{type(producer).__name__}",
                "PostgresOutbox.relay",
            )
        if producer.topics is not None:
            # Rows are bytes for any stream: such a producer would refuse or encode them again,
            # and every row would move to the dead-letter table.
            raise ConfigError(
                "producer",
                f"a Producer without topics= (rows are bytes already, for any stream), not one "
                f"limited to {sorted(producer.topics)}",
                "PostgresOutbox.relay",
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError("batch_size", f"an integer >= 1, not {batch_size!r}", "relay")
        if not isinstance(poll_interval, (int, float)) or not 0.001 <= poll_interval <= 60:
            raise ConfigError("poll_interval", f"seconds in [0.001, 60], not {poll_interval!r}")
        relay = Relay(
            self._names,
            self.conninfo,
            producer,
            batch_size=batch_size,
            poll_interval=float(poll_interval),
            metrics=metrics or metrics_for(producer.config, "outbox-relay"),
        )
        with self._lock:
            self._relays.append(relay)
        try:
            relay.run(stop or threading.Event())
        finally:
            with self._lock:
                self._relays.remove(relay)

    # -- lag ------------------------------------------------------------------------------------
    def stats(self) -> OutboxStats:
        """The table's backlog (rows not yet acknowledged, the oldest one's age, dead letters)
        read now, and the counters of the relays running in this process."""
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                row = conn.execute(self._names.query(LAG)).fetchone()
        except errors.UndefinedTable as exc:
            raise self._no_table() from exc
        assert row is not None
        with self._lock:
            relays = list(self._relays)
        return summarize(row, relays)


def _check_connection(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    status = psycopg.pq.TransactionStatus
    if not isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        raise OutboxConnectionError(
            f"publish(conn): a psycopg 3 connection, got {type(conn).__name__}"
        )
    if conn.closed or conn.broken:
        raise OutboxConnectionError(
            "publish(conn): the connection is closed; publish on the open connection of the "
            "transaction the record belongs to"
        )
    state = conn.info.transaction_status
    if state == status.INERROR:
        raise OutboxConnectionError(
            "publish(conn): the connection's transaction already failed (roll it back)"
        )
    if conn.autocommit and state == status.IDLE:
        raise OutboxConnectionError(
            "publish(conn): the connection is in autocommit outside a transaction: the row "
            "would commit on its own; publish inside `with conn.transaction():`"
        )
