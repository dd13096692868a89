"""``run(max_record_age=...)``: records older than this go to the failure policy, not the handler.

How old a record is, is measured on Kinesis's clock, never by comparing its
``ApproximateArrivalTimestamp`` (stamped by Kinesis) with this host's wall clock, which may be
off by any amount. What the engine knows of Kinesis's clock is a lower bound, :class:`KinesisClock`:

- every record's arrival timestamp is an instant of Kinesis's clock that has passed;
- after each GetRecords the lease holds ``millis_behind`` (``MillisBehindLatest``): the tip of
  the shard arrived that much after the last record read, so ``last arrival + millis_behind``
  has passed too (a later read's figure with an earlier record's arrival gives less: still a
  bound);
- since the moment such an instant was seen, at least the time this host's *monotonic* clock
  measured has passed on Kinesis's (durations agree across hosts; instants need not).

A record's age is then at least ``KinesisClock.now_ms() - arrival``, and that is what is compared
with ``max_record_age``. The bound errs one way only: a record is never sent to the failure
policy for being old unless Kinesis's own timestamps prove it is. It is exact while records keep
arriving at the shards read; on a stream nobody writes to, the tip is old too and old records
count as younger than they are (they reach the handler). A record read back from a RetryLater
stream is aged from when it became due, its arrival there plus the policy's ``delay`` (a delay
of ``max_record_age`` or more would otherwise send every round to ``then`` unhandled), not by
its original's arrival.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from ..models import Record


class RecordTooOldError(Exception):
    """A record was older than ``run(max_record_age=...)``: the failure policy disposes of it
    (never retried, never sent to a RetryLater stream) and the handler never sees it."""

    def __init__(self, record: Record, age: float, limit: float) -> None:
        super().__init__(
            f"{record.stream}/{record.shard_id} record {record.sequence_number} is {age:.1f}s "
            f"old by Kinesis's clock, past max_record_age={limit:g}s"
        )
        self.record = record
        self.age = age
        self.limit = limit


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class KinesisClock:
    """A lower bound of Kinesis's clock (epoch ms), from what reads showed (module docstring).
    Thread-safe: worker threads observe and read it. ``monotonic``: tests pass their own."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: The latest passed instant seen (epoch ms), and this host's monotonic time then.
        self._seen_ms: int | None = None
        self._seen_at = 0.0

    def observe(
        self,
        records: Sequence[Record],
        millis_behind: int | None,
        shard: tuple[str, str] | None = None,
    ) -> None:
        """Records just read (in order) and the shard's latest ``MillisBehindLatest``.
        ``shard`` (stream, shard id): only that shard's records count. A handler call without
        a sink may hold several shards' records; another shard's lag added to their arrivals
        would put the clock in the future (records at the tip counted too old)."""
        if shard is not None:
            records = [r for r in records if (r.stream, r.shard_id) == shard]
        arrivals = [r.approximate_arrival_timestamp for r in records]
        known = [a for a in arrivals if a is not None]
        if not known:
            return
        instant = _ms(max(known)) + max(0, millis_behind or 0)
        now = self._monotonic()
        with self._lock:
            known_now = self.now_locked(now)
            if known_now is None or instant > known_now:
                self._seen_ms, self._seen_at = instant, now

    def now_ms(self) -> int | None:
        """Kinesis's clock is at least this now (None: nothing seen yet)."""
        with self._lock:
            return self.now_locked(self._monotonic())

    def now_locked(self, monotonic_now: float) -> int | None:
        if self._seen_ms is None:
            return None
        return self._seen_ms + int((monotonic_now - self._seen_at) * 1000)

    def age(self, record: Record) -> float | None:
        """Seconds ``record`` is at least old (None: no arrival timestamp, or nothing seen)."""
        arrival = record.approximate_arrival_timestamp
        now = self.now_ms()
        if arrival is None or now is None:
            return None
        return max(0.0, (now - _ms(arrival)) / 1000)

    def too_old(
        self, record: Record, limit: float, waited: float = 0.0
    ) -> RecordTooOldError | None:
        """The error that sends ``record`` to the failure policy, if it is past ``limit``.
        ``waited``: seconds it was meant to wait after it arrived (a RetryLater round's delay),
        which do not count: its age runs from when it became due."""
        age = self.age(record)
        if age is None:
            return None
        age = max(0.0, age - waited)
        if age <= limit:
            return None
        return RecordTooOldError(record, age, limit)
