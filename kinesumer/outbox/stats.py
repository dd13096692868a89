"""What an outbox reports: its backlog in PostgreSQL and its relays' counters
(:meth:`PostgresOutbox.stats() <kinesumer.outbox.PostgresOutbox.stats>`, ``kinesumer outbox
status``)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

#: Delays kept per relay for the percentiles (the most recent ones).
DELAY_SAMPLES = 10_000


@dataclass(frozen=True)
class OutboxStats:
    """``pending``: rows not yet acknowledged by Kinesis (committed ones; rows of open
    transactions are invisible); ``oldest_pending_seconds``: the age of the oldest of them since
    its ``publish()`` (None when none is pending): the outbox's lag; ``dead_letters``: rows
    moved aside to ``<table>_dead``. The relays running in this process: ``relays``,
    ``partitions`` (of 64, held by them), ``published`` (acknowledged by Kinesis, duplicates
    of a resend included), ``moved_aside``, ``failed_attempts`` (puts that failed and will be
    tried again), ``reads`` (reads of the table: one per cycle, whatever woke it), and
    ``delay_p50`` / ``delay_p99``: seconds from ``publish()`` to Kinesis' acknowledgement (None
    before any)."""

    pending: int
    oldest_pending_seconds: float | None
    dead_letters: int
    relays: int = 0
    partitions: int = 0
    published: int = 0
    moved_aside: int = 0
    failed_attempts: int = 0
    reads: int = 0
    delay_p50: float | None = None
    delay_p99: float | None = None


class RelayCounters:
    """A relay's counters, written by its thread and read by ``stats()`` from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partitions = 0
        self.published = 0
        self.moved_aside = 0
        self.failed_attempts = 0
        #: Reads of the table (one per cycle).
        self.reads = 0
        self.delays: deque[float] = deque(maxlen=DELAY_SAMPLES)

    def acknowledged(self, delays: list[float]) -> None:
        with self.lock:
            self.delays.extend(delays)
            self.published += len(delays)


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summarize(row: tuple[Any, ...], relays: list[Any]) -> OutboxStats:
    """OutboxStats from the LAG query's row and this process's relays."""
    pending, oldest, dead = row
    delays: list[float] = []
    totals = {"partitions": 0, "published": 0, "moved_aside": 0, "failed_attempts": 0, "reads": 0}
    for relay in relays:
        counters: RelayCounters = relay.counters
        with counters.lock:
            delays.extend(counters.delays)
            for name in totals:
                totals[name] += getattr(counters, name)
    return OutboxStats(
        pending=int(pending),
        oldest_pending_seconds=None if oldest is None else max(0.0, float(oldest)),
        dead_letters=int(dead),
        relays=len(relays),
        delay_p50=percentile(delays, 0.5),
        delay_p99=percentile(delays, 0.99),
        **totals,
    )
