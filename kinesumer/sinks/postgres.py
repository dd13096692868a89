"""Exactly-once into PostgreSQL: the shard's position lives in a table of the sink's database.

One row per (app, stream, shard): ``sequence_number``, ``sub_sequence``, and ``lease``, the
number of the DynamoDB claim that owns it. Two statements keep a zombie out:

- on claim (the engine's claim hook, before the shard is read) the new owner fences the row and
  reads it back in one statement::

      INSERT ... ON CONFLICT DO UPDATE SET lease = <new> WHERE row.lease < <new>
      RETURNING sequence_number, sub_sequence

  It waits for a zombie's transaction holding the row, so it returns what that one committed;
  the same claim asking again (its first answer was lost) gets the row too, not a refusal;
  reading resumes after it (the DynamoDB checkpoint is only a hint for ``kinesumer status``).
  No row returned means a newer claim fenced it already: this lease is lost.
- every handler call runs in one transaction that starts with
  ``UPDATE ... SET position = <end> WHERE ... AND lease = <mine>``: no row means the shard was
  claimed by someone else; the transaction rolls back before the handler runs
  (:class:`~.base.LeaseLostError`). The row stays locked until the commit, so a claim cannot
  slip between the fence and the commit.

PostgreSQL failing outside the handler (the connection dropped at the fence or at COMMIT, a
deadlock) is tried again on a new connection, up to :data:`COMMIT_ATTEMPTS` transactions; after
a failed COMMIT the row says whether it landed (it holds this call's position under this lease),
and then nothing runs twice. An error inside the handler is the handler's: its failure policy
decides. Resetting a shard: delete its row here as well as its DynamoDB checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from ..models import Position
from .base import EngineLink

try:
    import psycopg
    from psycopg import errors, sql
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "kinesumer.sinks.PostgresPositions needs psycopg 3: pip install 'kinesumer[postgres]'"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from ..read.engine import Engine
    from ..read.progress import ShardLease

log = logging.getLogger("kinesumer.sinks")

#: Connections the claim hooks may hold at once (claims come in bursts at start-up).
CLAIM_CONNECTIONS = 4
#: Tries of a claim's fence while the database is unreachable, before the engine stops.
CLAIM_ATTEMPTS = 6

_SCHEMA = """CREATE TABLE IF NOT EXISTS {table} (
    app text NOT NULL,
    stream text NOT NULL,
    shard_id text NOT NULL,
    sequence_number text,
    sub_sequence bigint NOT NULL DEFAULT 0,
    lease bigint NOT NULL,
    owner text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app, stream, shard_id)
)"""
_FENCE = """INSERT INTO {table} AS row (app, stream, shard_id, lease, owner)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (app, stream, shard_id) DO UPDATE
    SET lease = EXCLUDED.lease, owner = EXCLUDED.owner, updated_at = now()
    WHERE row.lease < EXCLUDED.lease
        OR (row.lease = EXCLUDED.lease AND row.owner = EXCLUDED.owner)
RETURNING sequence_number, sub_sequence"""
_ADVANCE = """UPDATE {table} SET sequence_number = %s, sub_sequence = %s, updated_at = now()
WHERE app = %s AND stream = %s AND shard_id = %s AND lease = %s"""
_READ = """SELECT sequence_number, sub_sequence, lease FROM {table}
WHERE app = %s AND stream = %s AND shard_id = %s FOR UPDATE"""
#: Tries of one call's transaction when PostgreSQL fails outside the handler (the connection
#: dropped at the fence or at COMMIT, a deadlock, a serialization failure).
COMMIT_ATTEMPTS = 3
#: Errors worth trying the transaction again for, when they happen outside the handler.
_RETRYABLE = (psycopg.OperationalError, errors.TransactionRollback)


class _Stage:
    """Where a transaction failed: inside the handler (its failure: not retried here) or not."""

    body = False


def _backoff(attempt: int) -> float:
    return min(0.1 * 2.0**attempt, 2.0)


class PostgresPositions:
    """Exactly-once sink into PostgreSQL (psycopg 3): ``run(streams, handler,
    sink=PostgresPositions("postgresql://..."))`` with ``handler(record_or_batch, conn)``.

    ``connect``: a conninfo string, or a callable returning a new ``psycopg.Connection``
    (claims use it in both faces; sync handlers too). Async handlers get a
    ``psycopg.AsyncConnection`` from the conninfo string, or from ``async_connect()``. The
    handler gets a connection inside an open transaction (``conn.execute(...)``) and must not
    commit or roll back itself. Connections are pooled (one per worker thread or task at most)
    and set to autocommit, so each call is exactly one ``BEGIN ... COMMIT``. ``table``
    (``"schema.name"`` allowed) is created if missing.
    """

    def __init__(
        self,
        connect: str | Callable[[], psycopg.Connection[Any]],
        *,
        table: str = "kinesumer_positions",
        async_connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = None,
    ) -> None:
        self._connect = connect
        self._async_connect = async_connect
        self._table = sql.Identifier(*table.split("."))
        self._link = EngineLink()
        self._idle: list[psycopg.Connection[Any]] = []
        self._idle_async: list[psycopg.AsyncConnection[Any]] = []
        self._lock = threading.Lock()
        #: Closed: a connection coming back from a call still running (a worker the run did
        #: not wait for, a claim's thread) is closed instead of pooled, so none is left open.
        self._closed = False
        self._claims = asyncio.Semaphore(CLAIM_CONNECTIONS)
        self._schema_ready = False
        self._app = ""
        #: Transactions committed, and refused by the fence (for tests and benchmarks).
        self.commits = 0
        self.refused = 0

    def _sql(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(table=self._table)

    # -- the engine's side --------------------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        self._link.attach(engine, self)
        self._app = engine.config.app
        engine.claim_hook = self._on_claim

    async def _on_claim(self, lease: ShardLease) -> Position | None:
        """Fence the shard's row with this claim's lease, and read the position back (on a
        worker thread, over the sync pool: claims are rare, and this works for both faces)."""
        self._link.on_loop()
        engine = self._link.require()
        stream, shard_id = lease.key
        params = (self._app, stream, shard_id, lease.claim.checkpoint.lease, engine.client_id)
        delay = 0.2
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                async with self._claims:
                    row = await asyncio.to_thread(self._fence, params)
                break
            except psycopg.OperationalError as exc:
                if attempt == CLAIM_ATTEMPTS:
                    raise
                log.warning("fencing %s/%s in PostgreSQL failed, retrying: %s", *lease.key, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        if row is None:
            self.refused += 1
            held = await asyncio.to_thread(self._holder, params[:3])
            why = (
                f"PostgreSQL's row holds lease {held}, newer than this claim's "
                f"{lease.claim.checkpoint.lease}: another member claimed the shard since, or the "
                f"DynamoDB checkpoint was deleted while this row was kept (lease numbers start "
                f"again; delete the row too, the position lives there)"
            )
            engine.checkpointer.lose(lease, why)
            return None
        sequence, sub_sequence = row
        return None if sequence is None else Position(sequence, int(sub_sequence))

    def _fence(self, params: tuple[object, ...]) -> tuple[Any, ...] | None:
        with self._connection() as conn:
            if not self._schema_ready:
                with conn.transaction():
                    # Concurrent CREATE TABLE IF NOT EXISTS can still collide: one at a time.
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext('kinesumer_positions'))")
                    conn.execute(self._sql(_SCHEMA))
                self._schema_ready = True
            row: tuple[Any, ...] | None = conn.execute(self._sql(_FENCE), params).fetchone()
            return row

    def _holder(self, key: tuple[object, ...]) -> str:
        """Who holds the row now, for the refusal's message."""
        try:
            with self._connection() as conn:
                row = conn.execute(
                    self._sql(
                        "SELECT lease, owner FROM {table} WHERE app = %s AND stream = %s "
                        "AND shard_id = %s"
                    ),
                    key,
                ).fetchone()
        except psycopg.Error:
            row = None
        return "?" if row is None else f"{row[0]} (owner {row[1]})"

    # -- transactions -------------------------------------------------------------------------
    def transact_sync(self, lease: ShardLease, end: Position, body: Callable[[Any], None]) -> None:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            stage = _Stage()
            try:
                with self._connection() as conn, conn.transaction():
                    # After a COMMIT that failed, whether it landed is unknown: look first.
                    row = conn.execute(*self._read(lease)).fetchone() if attempt > 1 else None
                    if not self._landed(row, lease, end):
                        self._fenced(conn.execute(*self._advance(lease, end)).rowcount, lease)
                        stage.body = True
                        body(conn)
                        stage.body = False
            except _RETRYABLE as exc:
                if stage.body or attempt == COMMIT_ATTEMPTS:
                    raise
                self._retrying(lease, exc, attempt)
                time.sleep(_backoff(attempt))
                continue
            self.commits += 1
            return

    async def transact_async(
        self, lease: ShardLease, end: Position, body: Callable[[Any], Awaitable[None]]
    ) -> None:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            stage = _Stage()
            try:
                async with self._async_connection() as conn, conn.transaction():
                    # After a COMMIT that failed, whether it landed is unknown: look first.
                    row = None
                    if attempt > 1:
                        row = await (await conn.execute(*self._read(lease))).fetchone()
                    if not self._landed(row, lease, end):
                        cursor = await conn.execute(*self._advance(lease, end))
                        self._fenced(cursor.rowcount, lease)
                        stage.body = True
                        await body(conn)
                        stage.body = False
            except _RETRYABLE as exc:
                if stage.body or attempt == COMMIT_ATTEMPTS:
                    raise
                self._retrying(lease, exc, attempt)
                await asyncio.sleep(_backoff(attempt))
                continue
            self.commits += 1
            return

    def _advance(self, lease: ShardLease, end: Position) -> tuple[sql.Composed, tuple[object, ...]]:
        stream, shard_id = lease.key
        params = (end.sequence_number, end.sub_sequence_number, self._app, stream, shard_id)
        return self._sql(_ADVANCE), (*params, lease.claim.checkpoint.lease)

    def _read(self, lease: ShardLease) -> tuple[sql.Composed, tuple[object, ...]]:
        return self._sql(_READ), (self._app, *lease.key)

    def _fenced(self, rowcount: int, lease: ShardLease) -> None:
        """The fence's UPDATE matched no row: another claim owns the shard now."""
        if rowcount != 1:
            self.refused += 1
            raise self._link.lost(lease, "PostgreSQL's fence refused it (claimed again)")

    @staticmethod
    def _landed(row: tuple[Any, ...] | None, lease: ShardLease, end: Position) -> bool:
        """After a commit whose outcome is unknown: whether it landed (the row holds this
        call's ``end`` under this lease; ends only grow, one call per shard at a time)."""
        if row is None or row[2] != lease.claim.checkpoint.lease or row[0] is None:
            return False
        return Position(row[0], int(row[1])) == end

    @staticmethod
    def _retrying(lease: ShardLease, exc: BaseException, attempt: int) -> None:
        log.warning(
            "PostgreSQL failed outside the handler on %s/%s (%s); trying the transaction "
            "again (%d/%d)",
            *lease.key,
            exc,
            attempt + 1,
            COMMIT_ATTEMPTS,
        )

    # -- connections --------------------------------------------------------------------------
    def _new_connection(self) -> psycopg.Connection[Any]:
        connect = self._connect
        conn = psycopg.connect(connect) if isinstance(connect, str) else connect()
        conn.autocommit = True  # each call is exactly its own BEGIN ... COMMIT
        return conn

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """An idle connection (or a new one), back to the pool afterwards if still sound."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        conn = conn or self._new_connection()
        try:
            yield conn
        finally:
            with self._lock:
                pooled = _reusable(conn) and not self._closed
                if pooled:
                    self._idle.append(conn)
            if not pooled:
                conn.close()

    @asynccontextmanager
    async def _async_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = self._idle_async.pop() if self._idle_async else None
        if conn is None:
            if self._async_connect is not None:
                conn = await self._async_connect()
            elif isinstance(self._connect, str):
                conn = await psycopg.AsyncConnection.connect(self._connect)
            else:
                raise TypeError(
                    "async runs need PostgresPositions(conninfo_string) or async_connect="
                )
            await conn.set_autocommit(True)
        try:
            yield conn
        finally:
            if _reusable(conn) and not self._closed:
                self._idle_async.append(conn)
            else:  # closed, or cancelled/failed mid-statement: the session is in doubt
                await conn.close()

    def close_sync(self) -> None:
        """Close the pooled connections (after the run)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def close_async(self) -> None:
        self._closed = True
        idle, self._idle_async = self._idle_async, []
        for conn in idle:
            await conn.close()
        await asyncio.to_thread(self.close_sync)


def _reusable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Open, sound, and idle outside any transaction (a handler's error was rolled back)."""
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return not conn.closed and not conn.broken and idle
