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
by claims in ``<table>_parts`` naming its session (schema.py's "Who holds a partition"), so one
relay publishes a key at a time. Each relay also lists its session in ``<table>_relay``; about
once a second it counts the live ones, takes partitions whose claimant's session ended (or
none) up to its fair share ``ceil(PARTITIONS / relays)`` and gives back any above it (between
cycles, when nothing of it is in flight). A relay that dies, even by SIGKILL, loses its
session, and the others take its partitions. No host's clock is compared with another's: only
PostgreSQL's view of its sessions decides. Only the relays' role writes those tables: a role
that can merely connect holds no partition (advisory locks, which anyone can take, would let it
hold them all).

**Rows that cannot be written yet.** A key whose put failed in a way that may heal (a missing
stream, throttling past the delivery timeout, access denied) backs off on its own (0.5 s
doubling to a minute) and stays out of the reads meanwhile, so its rows never hide other keys'
rows; after ``max_attempts`` failed puts, or once older than ``max_age``, its row moves to the
dead-letter table with its last error and the key goes on. Rows of streams outside the relay's
``streams`` move there at once.

**Wake-ups.** Notifications on the channel (anyone may send them) are taken all at once, and
reads they cause are at least MIN_READ_GAP apart.

**Crashes.** A row is deleted only after Kinesis acknowledged it; a relay killed between the
acknowledgement and the DELETE leaves the row, and it is put again (at-least-once: consumers
deduplicate on the record's id). A rolled-back transaction's row was never visible.

**Refused for good.** A row the producer refuses at ``put()`` (any error but its closing: over
1 MiB, a bad key: rows written by SQL skip ``publish()``'s checks) or Kinesis refuses with a
permanent error (:class:`~kinesumer.errors.RecordRejectedError`) moves to ``<table>_dead``
with the error, is counted, and the key's next row follows; other keys never wait for it. A
refusal for the stream's KMS key (``KMSDisabledException`` ...) is the stream's, not the
row's: rows wait (and back off, as above).
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import re
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from ..errors import (
    BufferFullError,
    InvalidRecordError,
    OutboxError,
    OutboxTableNotFoundError,
    ProducerClosedError,
    RecordRejectedError,
)
from ..observability.metrics import Metrics
from ..producer import Producer, PutResult
from .schema import (
    DELETE,
    LAG,
    LIVE,
    ME,
    MOVE_ASIDE,
    PARTITIONS,
    READ,
    UNHELD,
    Names,
    foreign_owners,
    partition,
)
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
#: A key's wait after a failed put, doubling up to the maximum (seconds).
KEY_BACKOFF = (0.5, 60.0)
#: The shortest time between two reads a NOTIFY causes (seconds): a flood of notifications
#: (any role that can connect may send them) costs at most one read per gap.
MIN_READ_GAP = 0.05
#: How often "holds no partition while rows are pending" may be logged (seconds).
STARVED_LOG_INTERVAL = 60.0
#: A valid stream name (what the table's CHECK allows): anything else is labelled as invalid.
STREAM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
#: The metric label of a row's stream that is not a valid name, and of one outside ``streams``:
#: row text never becomes a label (one series per hostile row).
INVALID_STREAM = "(invalid)"
OTHER_STREAM = "(not allowed)"
#: The longest error text a log line quotes.
_BRIEF = 200

_TAKE = (
    "UPDATE {parts} SET pid = %(pid)s, role = %(role)s, started = %(started)s WHERE part IN ("
    "SELECT part FROM {parts} AS c WHERE (c.pid IS NULL OR NOT " + LIVE + ") "
    "ORDER BY part LIMIT %(count)s FOR UPDATE SKIP LOCKED) RETURNING part"
)
_GIVE_BACK = (
    "UPDATE {parts} SET pid = NULL, role = NULL, started = NULL "
    "WHERE part = ANY(%(parts)s) AND pid = %(pid)s AND started = %(started)s"
)
_LIVE_RELAYS = "SELECT count(*) FROM {presence} AS c WHERE " + LIVE
_MINE = "SELECT part FROM {parts} WHERE pid = %(pid)s AND started = %(started)s"
_JOIN = "INSERT INTO {presence} (pid, role, started) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
_FORGET_DEAD = "DELETE FROM {presence} AS c WHERE NOT " + LIVE


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
    if isinstance(error, InvalidRecordError):  # the record itself (e.g. over the stream's size)
        return True
    return isinstance(error, RecordRejectedError) and not error.code.startswith("KMS")


def brief(error: BaseException) -> str:
    """An error for a log line: its type and message, escaped and cut short."""
    text = f"{type(error).__name__}: {error}"
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= _BRIEF else shown[: _BRIEF - 3] + "..."


class Row(NamedTuple):
    id: int
    stream: str
    partition_key: str
    explicit_hash_key: str | None
    data: bytes
    record_id: str
    age: float  # seconds since publish() when read


@dataclass
class KeyBackoff:
    """A key whose head row failed to be written: how often, and until when it waits."""

    attempts: int
    not_before: float


class Relay:
    """One relay's loop over its own two connections (queries and claims; LISTEN)."""

    def __init__(
        self,
        names: Names,
        conninfo: str,
        producer: Producer,
        *,
        batch_size: int,
        poll_interval: float,
        metrics: Metrics,
        streams: Collection[str] | None = None,
        max_attempts: int = 100,
        max_age: float = 86_400.0,
        redact: Callable[[str], str] = str,
    ) -> None:
        self.names = names
        self.conninfo = conninfo
        self.producer = producer
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.metrics = metrics
        self.streams = None if streams is None else frozenset(streams)
        self.max_attempts = max_attempts
        self.max_age = max_age
        self.redact = redact
        self.counters = RelayCounters()
        self.held: set[int] = set()
        self._conn: psycopg.Connection[Any] | None = None
        self._listen: psycopg.Connection[Any] | None = None
        #: This relay's claim identity: the query session's (pid, role oid, start time).
        self._me: tuple[int, int, Any] | None = None
        self._rebalanced = -math.inf
        self._last_read = -math.inf
        self._starved_logged = -math.inf
        self._backoff: dict[tuple[str, str], KeyBackoff] = {}
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
                        self._last_read = time.monotonic()
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
                    log.warning(
                        "outbox relay: PostgreSQL failed (%s); reconnecting",
                        self.redact(brief(exc)),
                    )
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
            for table in (self.names.text, self.names.parts_text, self.names.presence_text):
                found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
                if found is None or found[0] is None:
                    raise OutboxTableNotFoundError(
                        f"the outbox table {table!r} does not exist: create it (an upgrade "
                        f"adds it too) with PostgresOutbox.create_table() or `kinesumer "
                        f"outbox create-table`"
                    )
            refused = foreign_owners(conn, self.names)
            if refused is not None:
                raise OutboxError(f"the relay will not run: {refused}")
            me = conn.execute(ME).fetchone()
            assert me is not None
            conn.execute(self.names.query(_FORGET_DEAD))
            conn.execute(self.names.query(_JOIN), me)
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
        self._conn, self._listen, self._me = conn, listen, (int(me[0]), int(me[1]), me[2])
        self._rebalanced = -math.inf
        if self._unremoved:
            self._settle(self._unremoved, [])

    def _disconnect(self) -> None:
        """Close both sessions: the claims of the ended session no longer count."""
        for conn in (self._conn, self._listen):
            if conn is not None:
                conn.close()
        self._conn = self._listen = None
        self.held = set()
        with self.counters.lock:
            self.counters.partitions = 0

    def _wait(self, stop: threading.Event, until: float) -> bool:
        """Wait for a NOTIFY (True) until the monotonic time ``until`` or a stop (False).

        Every notification pending is taken at once, and a read follows the previous one by
        MIN_READ_GAP at least: a flood of NOTIFYs costs one read per gap, not one each."""
        assert self._listen is not None
        while not stop.is_set() and (left := until - time.monotonic()) > 0:
            # Short slices: a stop is noticed within 0.2 s.
            # The generator holds the connection's lock until it is closed: close it first.
            received = self._listen.notifies(timeout=min(left, 0.2), stop_after=1)
            try:
                notified = next(received, None) is not None
            finally:
                received.close()
            if notified:
                gap = self._last_read + MIN_READ_GAP - time.monotonic()
                if gap > 0:
                    stop.wait(gap)
                self._drain_notifies()
                return True
        return False

    def _drain_notifies(self) -> None:
        assert self._listen is not None
        for _ in self._listen.notifies(timeout=0.0, stop_after=100_000):
            pass

    # -- partitions -----------------------------------------------------------------------------
    def _rebalance(self) -> bool:
        """Count the relays, take or give back partitions; whether this relay took any."""
        assert self._conn is not None and self._me is not None
        pid, role, started = self._me
        taken: list[tuple[int]] = []
        row = self._conn.execute(self.names.query(_LIVE_RELAYS)).fetchone()
        share = math.ceil(PARTITIONS / max(1, int(row[0]) if row else 1))
        mine = {"pid": pid, "role": role, "started": started}
        # What the table says this session holds: a claim written over by another session of
        # the relays' role (an administrator, say) is no longer read here, between cycles.
        claimed = {int(p) for (p,) in self._conn.execute(self.names.query(_MINE), mine)}
        if self.held - claimed:
            log.warning(
                "outbox relay: %d partition(s) of this relay were claimed by another session",
                len(self.held - claimed),
            )
        self.held = claimed
        if len(self.held) > share:
            extra = sorted(self.held)[share:]
            self._conn.execute(self.names.query(_GIVE_BACK), {**mine, "parts": extra})
            self.held -= set(extra)
            log.info("outbox relay: gave back %d partition(s) (fair share %d)", len(extra), share)
        elif len(self.held) < share:
            wanted = {**mine, "count": share - len(self.held)}
            taken = self._conn.execute(self.names.query(_TAKE), wanted).fetchall()
            self.held |= {int(p) for (p,) in taken}
            if taken:
                log.info("outbox relay: took %d partition(s), holds %d", len(taken), len(self.held))
        if not self.held:
            self._report_starved()
        if type(self.metrics) is not Metrics:  # metrics on: the backlog's gauges (a count)
            lag = self._conn.execute(self.names.query(LAG)).fetchone()
            if lag is not None:
                self.metrics.outbox_lag(int(lag[0]), None if lag[1] is None else float(lag[1]))
        # Back-offs of keys in partitions given away are the new holder's business now.
        for key in [k for k in self._backoff if partition(*k) not in self.held]:
            del self._backoff[key]
        with self.counters.lock:
            self.counters.partitions = len(self.held)
        self._rebalanced = time.monotonic()
        return bool(taken)

    def _report_starved(self) -> None:
        """Say so when this relay holds no partition while rows wait in partitions no live
        relay holds (no claim to take: a session of the relays' role holding them all, say)."""
        assert self._conn is not None
        if time.monotonic() - self._starved_logged < STARVED_LOG_INTERVAL:
            return
        pending = self._conn.execute(self.names.query(LAG)).fetchone()
        if pending is None or not int(pending[0]):
            return
        unheld = self._conn.execute(self.names.query(UNHELD)).fetchone()
        log.warning(
            "outbox relay: holds no partition while %d row(s) are pending (%d in partitions no "
            "live relay holds); see which sessions hold %s",
            *(int(pending[0]), 0 if unheld is None else int(unheld[0]), self.names.parts_text),
        )
        self._starved_logged = time.monotonic()

    # -- one cycle ------------------------------------------------------------------------------
    def _cycle(self) -> bool:
        """One batch; whether to go again at once (a full batch, or a key that brought all
        it may, that made progress)."""
        if not self.held:
            return False
        assert self._conn is not None
        query = self.names.query(READ)
        per_key = max(1, self.batch_size // KEY_SHARE)
        now = time.monotonic()
        waiting = [key for key, state in self._backoff.items() if state.not_before > now]
        params = {
            "parts": sorted(self.held),
            "head": self.batch_size * HEAD_WINDOW,
            "per_key": per_key,
            "batch": self.batch_size,
            "wait_streams": [stream for stream, _ in waiting],
            "wait_keys": [key for _, key in waiting],
        }
        read_at = time.monotonic()  # the rows' ages are PostgreSQL's at this query
        rows = [Row(*r) for r in self._conn.execute(query, params)]
        with self.counters.lock:
            self.counters.reads += 1
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
            self.metrics.outbox_relayed(self.label(stream), count)
        return (len(rows) == self.batch_size or capped) and bool(acked or dead)

    def label(self, stream: str) -> str:
        """A row's stream as a metric label: the name only if it is a valid one (allowed)."""
        if not STREAM_NAME.fullmatch(stream):
            return INVALID_STREAM
        if self.streams is not None and stream not in self.streams:
            return OTHER_STREAM
        return stream

    def _put(self, rows: list[Row], read_at: float) -> tuple[list[Row], list[tuple[Row, str]]]:
        """Put the rows, each key's one at a time in id order; the acknowledged rows and the
        rows refused for good (with the error)."""
        keys: OrderedDict[tuple[str, str], deque[Row]] = OrderedDict()
        for row in rows:
            keys.setdefault((row.stream, row.partition_key), deque()).append(row)
        answers: Answers = queue.SimpleQueue()
        acked: list[Row] = []
        dead: list[tuple[Row, str]] = []
        failed: list[BaseException] = []
        in_flight = 0

        def put_next(key: tuple[str, str]) -> None:
            nonlocal in_flight
            waiting = keys[key]
            while waiting:
                row = waiting[0]
                if self.streams is not None and row.stream not in self.streams:
                    reason = "the stream is not one of the relay's streams (--streams)"
                    dead.append((waiting.popleft(), reason))
                    continue
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
                except Exception as exc:
                    # Any refusal of put() but its closing is the row's (a row written by SQL
                    # can hold what publish() refuses): it moves aside, the others flow.
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
                self._backoff.pop(key, None)
                put_next(key)
            elif refused_for_good(error):
                dead.append((row, f"{type(error).__name__}: {error}"))
                self._backoff.pop(key, None)
                put_next(key)
            else:  # may heal (timeout, throttling, a missing stream): this key backs off
                with self.counters.lock:
                    self.counters.failed_attempts += 1
                failed.append(error)
                if log.isEnabledFor(logging.DEBUG):  # keys are row text: at DEBUG only
                    log.debug(
                        "outbox relay: row %d (%r/%r) not written: %s",
                        *(row.id, row.stream, row.partition_key, brief(error)),
                    )
                if self._give_up(key, row, read_at):
                    dead.append((row, self._given_up(key, row, error, read_at)))
                    self._backoff.pop(key, None)
                    put_next(key)
                else:
                    keys[key].clear()
        if failed:
            # One line per cycle (not per row), without the keys: keys are row text.
            log.warning(
                "outbox relay: %d put(s) failed, their keys wait before trying again (%s)",
                len(failed),
                brief(failed[0]),
            )
        self.counters.acknowledged([row.age for row in acked])
        return acked, dead

    def _give_up(self, key: tuple[str, str], row: Row, read_at: float) -> bool:
        """Count a failed put of the key's head row; whether the row has had its chances."""
        state = self._backoff.get(key)
        if state is None:
            state = self._backoff[key] = KeyBackoff(attempts=0, not_before=0.0)
        state.attempts += 1
        delay = min(KEY_BACKOFF[1], KEY_BACKOFF[0] * 2 ** min(state.attempts - 1, 16))
        state.not_before = time.monotonic() + delay
        age = row.age + time.monotonic() - read_at
        return state.attempts >= self.max_attempts or age >= self.max_age

    def _given_up(
        self, key: tuple[str, str], row: Row, error: BaseException, read_at: float
    ) -> str:
        attempts = self._backoff[key].attempts
        age = row.age + time.monotonic() - read_at
        return (
            f"{type(error).__name__}: {error} (not written after {attempts} attempt(s), "
            f"{age:.0f} s after publish(); limits: {self.max_attempts} attempts, "
            f"{self.max_age:.0f} s)"
        )

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
            shown = error.encode("unicode_escape").decode("ascii")
            if len(shown) > _BRIEF:
                shown = shown[: _BRIEF - 3] + "..."
            log.error("outbox relay: row %d moved to %s_dead: %s", row.id, self.names.text, shown)
            self.metrics.outbox_moved_aside(self.label(row.stream))
        with self.counters.lock:
            self.counters.moved_aside += len(dead)
