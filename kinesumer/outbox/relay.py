"""The relay: committed outbox rows to Kinesis through a Producer, deleted once acknowledged.

One cycle: read up to ``batch_size`` rows of the partitions this relay holds, in id order, at
most a tenth of them from one key (a prefix of each key's rows; see schema.READ); put them;
delete the acknowledged ones (and move the refused-for-good ones aside) in one transaction;
again at once if rows remain, else wait for a NOTIFY (``publish()`` sends one at commit) or
``poll_interval``.

**Per-key order.** Within a key, ids grow in commit order (schema.py's key lock), and a relay
puts a key's rows one at a time: the next only after Kinesis acknowledged the previous one. A
put that fails (a delivery timeout) stops the key for this cycle; its later rows wait for the
next cycle, which starts again from the failed row. So every relay puts a key's rows in commit
order, each after all earlier ones were acknowledged at least once (by it or, before they were
deleted, by another): the first occurrences of a key's records in Kinesis follow commit order,
even with two relays briefly holding one partition (a session PostgreSQL ended while its relay
still ran) and across kills, which only add duplicates. The price: a key moves one row per
PutRecords round trip (the producer's own ``ordering="key"`` lets a key's next record go once
the previous one failed for good, and ``aggregate=True`` cannot pack a key's rows here).

**Several relays.** The table's keys fall into PARTITIONS partitions; a relay holds partitions
by PostgreSQL session advisory locks (``pg_try_advisory_lock``), so one relay publishes a key
at a time. Each relay also holds a shared "presence" lock; about once a second it counts the
holders, takes free partitions up to its fair share ``ceil(PARTITIONS / relays)`` and gives
back any above it (between cycles, when nothing of it is in flight). A relay that dies, even by
SIGKILL, loses its session: PostgreSQL releases its locks and the others take its partitions.
No host's clock is compared with another's: only PostgreSQL's locks decide.

**Crashes.** A row is deleted only after Kinesis acknowledged it; a relay killed between the
acknowledgement and the DELETE leaves the row, and it is put again (at-least-once: consumers
deduplicate on the record's id). A rolled-back transaction's row was never visible.

**Refused for good.** A row the producer refuses at ``put()`` (over 1 MiB, a bad key: rows
written by SQL skip ``publish()``'s checks) or Kinesis refuses with a permanent error
(:class:`~kinesumer.errors.RecordRejectedError`) moves to ``<table>_dead`` with the error, is
counted, and the key's next row follows; other keys never wait for it. A refusal for the
stream's KMS key (``KMSDisabledException`` ...) is the stream's, not the row's: rows wait.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from ..errors import (
    BufferFullError,
    InvalidRecordError,
    OutboxTableNotFoundError,
    ProducerClosedError,
    RecordRejectedError,
)
from ..metrics import Metrics
from ..producer import Producer, PutResult
from .schema import DELETE, LAG, MOVE_ASIDE, PARTITIONS, PRESENCE, READ, Names
from .stats import RelayCounters

log = logging.getLogger("kinesumer.outbox")

#: How often a relay counts the others and takes or gives back partitions (seconds).
REBALANCE_INTERVAL = 1.0
#: A key brings at most batch_size // KEY_SHARE rows to a cycle (its rows go one per round
#: trip: a cycle lasts as many round trips as its busiest key has rows) ...
KEY_SHARE = 10
#: ... chosen among the first batch_size * HEAD_WINDOW rows by id (bounded work per read).
HEAD_WINDOW = 4
#: The wait after PostgreSQL failed, doubling up to the maximum (seconds).
RECONNECT_BACKOFF = (0.2, 5.0)

#: Advisory locks are per database, but pg_locks lists the whole server's: count this
#: database's relays only (another database's outbox of the same table name shares the class).
_LIVE = """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 2"""
_TAKE = """SELECT p FROM generate_series(0, %s) AS p
    WHERE NOT (p = ANY(%s)) AND pg_try_advisory_lock(%s, p) LIMIT %s"""


Answers = queue.SimpleQueue[tuple[tuple[str, str], "Future[PutResult]"]]


def _answered(answers: Answers, key: tuple[str, str], future: Future[PutResult]) -> None:
    """The producer's callback (on its thread): hand the answer to the relay's thread."""
    answers.put((key, future))


def refused_for_good(error: BaseException) -> bool:
    """Whether Kinesis refused the row itself, so that putting it again cannot succeed.

    A ``KMS*`` refusal (the stream's key disabled, deleted, pending import, or the account not
    opted in) is the stream's configuration, which an operator heals: every row of the stream
    gets it, so moving rows aside would empty the outbox into the dead-letter table; the rows
    wait instead, as for a stream not created yet."""
    return isinstance(error, RecordRejectedError) and not error.code.startswith("KMS")


class Row(NamedTuple):
    id: int
    stream: str
    partition_key: str
    explicit_hash_key: str | None
    data: bytes
    record_id: str
    age: float  # seconds since publish() when read


class Relay:
    """One relay's loop over its own two connections (queries and locks; LISTEN)."""

    def __init__(
        self,
        names: Names,
        conninfo: str,
        producer: Producer,
        *,
        batch_size: int,
        poll_interval: float,
        metrics: Metrics,
    ) -> None:
        self.names = names
        self.conninfo = conninfo
        self.producer = producer
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.metrics = metrics
        self.counters = RelayCounters()
        self.held: set[int] = set()
        self._conn: psycopg.Connection[Any] | None = None
        self._listen: psycopg.Connection[Any] | None = None
        self._rebalanced = -math.inf
        #: Acknowledged rows whose DELETE failed: deleted first after reconnecting.
        self._unremoved: list[int] = []

    # -- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        backoff = RECONNECT_BACKOFF[0]
        read = True  # read rows now: at start, after a NOTIFY, a full batch, new partitions
        next_poll = 0.0
        try:
            while not stop.is_set():
                try:
                    self._connect()
                    if time.monotonic() - self._rebalanced >= REBALANCE_INTERVAL:
                        read = self._rebalance() or read
                    if read or time.monotonic() >= next_poll:
                        read = self._cycle()
                        next_poll = time.monotonic() + self.poll_interval
                    backoff = RECONNECT_BACKOFF[0]
                    if not read:
                        # Until a NOTIFY, the next poll or the next rebalance, whichever is
                        # first. Inside the try: the LISTEN session failing while the relay
                        # waits on it (where it spends most of its time) means reconnecting.
                        wake = min(next_poll, self._rebalanced + REBALANCE_INTERVAL)
                        read = self._wait(stop, wake)
                except psycopg.OperationalError as exc:
                    log.warning("outbox relay: PostgreSQL failed (%s); reconnecting", exc)
                    self._disconnect()
                    stop.wait(backoff)
                    backoff = min(backoff * 2, RECONNECT_BACKOFF[1])
                    read = True
        finally:
            self._disconnect()

    def _connect(self) -> None:
        if self._conn is not None and not self._conn.closed:
            return
        conn = psycopg.connect(self.conninfo, autocommit=True)
        try:
            found = conn.execute("SELECT to_regclass(%s)", (self.names.text,)).fetchone()
            if found is None or found[0] is None:
                raise OutboxTableNotFoundError(
                    f"the outbox table {self.names.text!r} does not exist: create it with "
                    f"PostgresOutbox.create_table() or `kinesumer outbox create-table`"
                )
            conn.execute(
                "SELECT pg_advisory_lock_shared(%s, %s)", (self.names.lock_class, PRESENCE)
            )
            listen = psycopg.connect(self.conninfo, autocommit=True)
        except BaseException:
            conn.close()
            raise
        try:
            listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.names.channel)))
        except BaseException:
            conn.close()
            listen.close()
            raise
        self._conn, self._listen = conn, listen
        self._rebalanced = -math.inf
        if self._unremoved:
            self._settle(self._unremoved, [])

    def _disconnect(self) -> None:
        """Close both sessions: PostgreSQL releases every lock this relay held."""
        for conn in (self._conn, self._listen):
            if conn is not None:
                conn.close()
        self._conn = self._listen = None
        self.held = set()
        with self.counters.lock:
            self.counters.partitions = 0

    def _wait(self, stop: threading.Event, until: float) -> bool:
        """Wait for a NOTIFY (True) until the monotonic time ``until`` or a stop (False)."""
        assert self._listen is not None
        while not stop.is_set() and (left := until - time.monotonic()) > 0:
            # Short slices: a stop is noticed within 0.2 s.
            for _ in self._listen.notifies(timeout=min(left, 0.2), stop_after=1):
                return True
        return False

    # -- partitions -----------------------------------------------------------------------------
    def _rebalance(self) -> bool:
        """Count the relays, take or give back partitions; whether this relay took any."""
        assert self._conn is not None
        taken: list[tuple[int]] = []
        cls = self.names.lock_class
        row = self._conn.execute(_LIVE, (cls, PRESENCE)).fetchone()
        share = math.ceil(PARTITIONS / max(1, int(row[0]) if row else 1))
        if len(self.held) > share:
            extra = sorted(self.held)[share:]
            self._conn.execute(
                "SELECT pg_advisory_unlock(%s, p) FROM unnest(%s::int[]) AS p", (cls, extra)
            )
            self.held -= set(extra)
            log.info("outbox relay: gave back %d partition(s) (fair share %d)", len(extra), share)
        elif len(self.held) < share:
            taken = self._conn.execute(
                _TAKE, (PARTITIONS - 1, sorted(self.held), cls, share - len(self.held))
            ).fetchall()
            self.held |= {int(p) for (p,) in taken}
            if taken:
                log.info("outbox relay: took %d partition(s), holds %d", len(taken), len(self.held))
        if type(self.metrics) is not Metrics:  # metrics on: the backlog's gauges (a count)
            lag = self._conn.execute(self.names.query(LAG)).fetchone()
            if lag is not None:
                self.metrics.outbox_lag(int(lag[0]), None if lag[1] is None else float(lag[1]))
        with self.counters.lock:
            self.counters.partitions = len(self.held)
        self._rebalanced = time.monotonic()
        return bool(taken)

    # -- one cycle ------------------------------------------------------------------------------
    def _cycle(self) -> bool:
        """One batch; whether to go again at once (a full batch, or a key that brought all
        it may, that made progress)."""
        if not self.held:
            return False
        assert self._conn is not None
        query = self.names.query(READ)
        per_key = max(1, self.batch_size // KEY_SHARE)
        params = {
            "parts": sorted(self.held),
            "head": self.batch_size * HEAD_WINDOW,
            "per_key": per_key,
            "batch": self.batch_size,
        }
        read_at = time.monotonic()  # the rows' ages are PostgreSQL's at this query
        rows = [Row(*r) for r in self._conn.execute(query, params)]
        if not rows:
            return False
        counts = Counter((row.stream, row.partition_key) for row in rows)
        capped = max(counts.values()) >= per_key  # a key may have more rows than it brought
        acked, dead = self._put(rows, read_at)
        self._settle([row.id for row in acked], dead)
        by_stream: dict[str, int] = {}
        for row in acked:
            by_stream[row.stream] = by_stream.get(row.stream, 0) + 1
        for stream, count in by_stream.items():
            self.metrics.outbox_relayed(stream, count)
        return (len(rows) == self.batch_size or capped) and bool(acked or dead)

    def _put(self, rows: list[Row], read_at: float) -> tuple[list[Row], list[tuple[Row, str]]]:
        """Put the rows, each key's one at a time in id order; the acknowledged rows and the
        rows refused for good (with the error)."""
        keys: OrderedDict[tuple[str, str], deque[Row]] = OrderedDict()
        for row in rows:
            keys.setdefault((row.stream, row.partition_key), deque()).append(row)
        answers: Answers = queue.SimpleQueue()
        acked: list[Row] = []
        dead: list[tuple[Row, str]] = []
        in_flight = 0

        def put_next(key: tuple[str, str]) -> None:
            nonlocal in_flight
            waiting = keys[key]
            while waiting:
                row = waiting[0]
                try:
                    future = self.producer.put(
                        row.stream,
                        row.data,
                        partition_key=row.partition_key,
                        explicit_hash_key=row.explicit_hash_key,
                    )
                except ProducerClosedError:
                    raise
                except BufferFullError:  # a producer with block=False, full: next cycle
                    with self.counters.lock:
                        self.counters.failed_attempts += 1
                    waiting.clear()
                    return
                except InvalidRecordError as exc:  # Kinesis would refuse it: never retried
                    dead.append((waiting.popleft(), f"{type(exc).__name__}: {exc}"))
                    continue
                future.add_done_callback(functools.partial(_answered, answers, key))
                in_flight += 1
                return

        for key in list(keys):
            put_next(key)
        while in_flight:
            key, future = answers.get()
            in_flight -= 1
            row = keys[key].popleft()
            error = future.exception()
            if error is None:
                # Its age when read plus the time since: a row that waited for its key's
                # earlier rows counts that wait (the delay is publish() to acknowledgement).
                acked.append(row._replace(age=row.age + time.monotonic() - read_at))
                put_next(key)
            elif refused_for_good(error):
                dead.append((row, f"{type(error).__name__}: {error}"))
                put_next(key)
            else:  # may heal (timeout, throttling, a missing stream): this key waits
                with self.counters.lock:
                    self.counters.failed_attempts += 1
                log.warning(
                    "outbox relay: row %d (%s/%s) not written (%s); retried next cycle",
                    *(row.id, row.stream, row.partition_key, error),
                )
                keys[key].clear()
        self.counters.acknowledged([row.age for row in acked])
        return acked, dead

    def _settle(self, acked: list[int], dead: list[tuple[Row, str]]) -> None:
        """Delete the acknowledged rows and move the refused ones aside, in one transaction."""
        assert self._conn is not None
        pending = self._unremoved = sorted(set(self._unremoved) | set(acked))
        try:
            with self._conn.transaction():
                for row, error in dead:
                    self._conn.execute(self.names.query(MOVE_ASIDE), (error, row.id))
                ids = pending + [row.id for row, _ in dead]
                self._conn.execute(self.names.query(DELETE), (ids,))
        except psycopg.OperationalError:
            raise  # the acknowledged ids stay in _unremoved; the refused are found again
        self._unremoved = []
        for row, error in dead:
            log.error("outbox relay: row %d moved to %s_dead: %s", row.id, self.names.text, error)
            self.metrics.outbox_moved_aside(row.stream)
        with self.counters.lock:
            self.counters.moved_aside += len(dead)
