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

import logging
import math
import re
import threading
import uuid
from collections.abc import Collection
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
    OutboxError,
    OutboxTableNotFoundError,
)
from ..observability.metrics import Metrics, metrics_for
from ..producer import Producer
from ..producer.records import check_record
from ..topics import Topic
from .conninfo import Conninfo
from .relay import Relay
from .schema import CONSTRAINTS, INSERT, LAG, Names, foreign_owners, key_lock, partition
from .stats import OutboxStats, summarize

log = logging.getLogger("kinesumer.outbox")

#: How long create_table() waits for each lock it needs (seconds).
ALTER_LOCK_TIMEOUT = 5.0

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
#: publish() bounds its wait for the key's lock (any role that can connect can take an advisory
#: lock) for its own statement only: the caller's setting is put back after it.
_SET_LOCK_TIMEOUT = "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)"
_RESTORE_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"


class PostgresOutbox:
    """A transactional outbox in PostgreSQL (psycopg 3, ``pip install 'kinesumer[postgres]'``).

    ``conninfo``: how :meth:`create_table`, :meth:`stats` and :meth:`relay` connect (a libpq
    connection string or URL); :meth:`publish` uses the caller's connection. ``table``:
    ``"name"`` or ``"schema.name"``; rows Kinesis refuses for good go to ``<table>_dead``.
    ``lock_timeout``: the longest :meth:`publish` waits for its key's lock (seconds; None:
    no limit), held by another transaction publishing the key, or by any session that can
    connect (advisory locks have no permissions). A connection string libpq cannot parse
    raises :class:`ConfigError` at once, without quoting it (it may hold a password).
    """

    def __init__(
        self, conninfo: str, *, table: str = "kinesumer_outbox", lock_timeout: float | None = 10.0
    ) -> None:
        if not isinstance(table, str) or not _TABLE.match(table):
            raise ConfigError(
                "table", f"a name or schema.name of [a-z0-9_], got {table!r}", "PostgresOutbox"
            )
        if lock_timeout is not None and (
            isinstance(lock_timeout, bool)
            or not isinstance(lock_timeout, (int, float))
            or not 0.001 <= lock_timeout <= 86_400
        ):
            raise ConfigError(
                "lock_timeout",
                f"seconds in [0.001, 86400] or None, not {lock_timeout!r}",
                "PostgresOutbox",
            )
        self._conninfo = Conninfo(conninfo)
        self.redact = self._conninfo.redact
        self.conninfo = conninfo
        self.lock_timeout = lock_timeout
        self.table = table
        self._names = Names(table)
        self._lock = threading.Lock()
        self._relays: list[Relay] = []

    # -- the table ------------------------------------------------------------------------------
    def create_table(self) -> None:
        """Create the outbox table, its index, its dead-letter table and the relays' tables, and
        add the table's checks (idempotent; an upgrade runs it once: see the docs' "Upgrading").
        Raises :class:`OutboxError` when other sessions keep a lock it needs for
        ALTER_LOCK_TIMEOUT, having changed nothing."""
        with psycopg.connect(self.conninfo, autocommit=True) as conn, conn.transaction():
            # Every lock taken here waits after the transactions already holding the table (an
            # open publish(), a session holding the advisory lock below): waiting long would
            # hold every publish() queued behind it meanwhile.
            timeout = f"{max(1, int(ALTER_LOCK_TIMEOUT * 1000))}ms"
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            try:
                # Concurrent CREATE ... IF NOT EXISTS can still collide: one at a time.
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._names.lock_class,))
                for statement in self._names.schema():
                    conn.execute(statement)
                refused = foreign_owners(conn, self._names)
                if refused is not None:
                    raise OutboxError(f"create_table(): {refused}")
                self._add_constraints(conn)
            except errors.LockNotAvailable as exc:
                raise OutboxError(
                    f"create_table(): other sessions held a lock it needs on {self.table!r} "
                    f"for {ALTER_LOCK_TIMEOUT:g} s (open transactions on the table); run it "
                    f"again (nothing was changed)"
                ) from exc

    def _add_constraints(self, conn: psycopg.Connection[Any]) -> None:
        """The table's CHECKs: added NOT VALID where missing (a table created by an earlier
        version: new rows are checked from now on, existing ones not yet), then validated
        where not yet valid. A row already there that breaks one leaves it NOT VALID (the
        relay moves such rows to the dead-letter table; ``create_table()`` again, once they
        are gone, validates it) and is logged."""
        found = dict(
            conn.execute(
                "SELECT conname, convalidated FROM pg_constraint WHERE conrelid = %s::regclass",
                (self.table,),
            ).fetchall()
        )
        for name, condition in CONSTRAINTS:
            if name not in found:
                conn.execute(self._names.add_constraint(name, condition))
            if not found.get(name, False):
                try:
                    with conn.transaction():
                        conn.execute(self._names.validate(name))
                except errors.CheckViolation:
                    log.warning(
                        "outbox table %s: existing rows break CHECK %s; it holds for new rows, "
                        "and is validated by a later create_table() once the relay has moved "
                        "those rows to %s_dead",
                        *(self.table, name, self.table),
                    )

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
        :class:`OutboxConnectionError`, :class:`OutboxTableNotFoundError`, and
        :class:`OutboxError` when the key's lock is not granted within ``lock_timeout`` (the
        transaction is then aborted: roll it back). A row over 1 MiB is checked against its
        stream's maximum record size by the relay (publish() holds no Kinesis client): one over
        it moves to the dead-letter table as ``RecordTooLargeError``.
        """
        _check_connection(conn)
        params = self._params(stream, data, partition_key, explicit_hash_key, record_id)
        try:
            if self.lock_timeout is None:
                conn.execute(self._names.query(_PUBLISH), params)
            else:
                found = conn.execute(_SET_LOCK_TIMEOUT, (self._timeout_setting,)).fetchone()
                conn.execute(self._names.query(_PUBLISH), params)
                conn.execute(_RESTORE_LOCK_TIMEOUT, (found[0] if found else "0",))
        except errors.UndefinedTable as exc:
            raise self._no_table() from exc
        except errors.LockNotAvailable as exc:
            raise self._lock_timed_out() from exc
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
            if self.lock_timeout is None:
                await conn.execute(self._names.query(_PUBLISH), params)
            else:
                cursor = await conn.execute(_SET_LOCK_TIMEOUT, (self._timeout_setting,))
                found = await cursor.fetchone()
                await conn.execute(self._names.query(_PUBLISH), params)
                await conn.execute(_RESTORE_LOCK_TIMEOUT, (found[0] if found else "0",))
        except errors.UndefinedTable as exc:
            raise self._no_table() from exc
        except errors.LockNotAvailable as exc:
            raise self._lock_timed_out() from exc
        return str(params[4])

    @property
    def _timeout_setting(self) -> str:
        assert self.lock_timeout is not None
        return f"{max(1, math.ceil(self.lock_timeout * 1000))}ms"

    def _lock_timed_out(self) -> OutboxError:
        return OutboxError(
            f"publish(): the key's lock was not granted within lock_timeout "
            f"({self.lock_timeout} s): another session holds it (a long transaction publishing "
            f"the same key, or a session that took the advisory lock); the transaction is "
            f"aborted: roll it back"
        )

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
        streams: Collection[str] | None = None,
        max_attempts: int = 100,
        max_age: float = 86_400.0,
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

        ``streams``: the streams rows may name (None: any); a row naming another moves to the
        dead-letter table at once. A key whose put fails in a way that may heal (a missing
        stream, throttling, access denied) waits 0.5 s doubling to a minute, out of the reads;
        its row moves to the dead-letter table, with its last error, after ``max_attempts``
        failed puts or once ``max_age`` seconds old (an outage longer than that moves rows
        aside too: raise them for long outages).
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
        if streams is not None and (
            isinstance(streams, str)
            or not all(isinstance(name, str) and _STREAM.match(name) for name in streams)
        ):
            raise ConfigError("streams", f"a collection of stream names, not {streams!r}", "relay")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError("max_attempts", f"an integer >= 1, not {max_attempts!r}", "relay")
        if not isinstance(max_age, (int, float)) or isinstance(max_age, bool) or max_age <= 0:
            raise ConfigError("max_age", f"seconds > 0, not {max_age!r}", "relay")
        relay = Relay(
            self._names,
            self.conninfo,
            producer,
            batch_size=batch_size,
            poll_interval=float(poll_interval),
            metrics=metrics or metrics_for(producer.config, "outbox-relay"),
            streams=None if streams is None else frozenset(streams),
            max_attempts=max_attempts,
            max_age=float(max_age),
            redact=self.redact,
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
