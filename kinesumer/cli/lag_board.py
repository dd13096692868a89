"""What ``kinesumer lag --serve`` knows between two probes: the last good figure, whether it is
stale, the probes' counts, and a bounded history of the figures for the status page's chart.

The probe loop writes it (:meth:`LagBoard.succeeded`, :meth:`LagBoard.failed`) from its own
thread; the HTTP server's threads read it (:meth:`LagBoard.lag_document`,
:meth:`LagBoard.status_document`, :meth:`LagBoard.reading`) for every request. One lock guards
it, held only to copy or swap references: the documents are built from an immutable
:class:`Reading`, outside the lock.

A failed probe never erases a figure: the last good one is served on, marked ``stale`` (a
scaler that reads it keeps the group where it is rather than scaling a group with a lag to zero
because the table was briefly out of reach). Figures are stale too when the last good probe is
older than :attr:`LagBoard.stale_after` seconds (a probe hanging on a call). No I/O and no
clock of its own: the caller passes the time, so that tests drive it by hand.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.lag import GroupLag
from ..statestore.group_view import iso_time

__all__ = [
    "DEFAULT_HISTORY_SECONDS",
    "MAX_HISTORY_POINTS",
    "LagBoard",
    "MemberRow",
    "Reading",
    "Snapshot",
]

#: Seconds of probes the status page's chart shows (and the server keeps).
DEFAULT_HISTORY_SECONDS = 900.0

#: The most probes the history keeps, whatever the interval: with a very short interval the
#: window holds fewer seconds rather than more memory.
MAX_HISTORY_POINTS = 2_000


@dataclass(frozen=True)
class MemberRow:
    """A registered member as the status page shows it: live and leader as ``kinesumer
    status`` judges them, and the shards the lag probe found it owning."""

    client_id: str
    live: bool
    leader: bool
    host: str = ""
    pid: int = 0
    last_update_ms: int = 0
    shards: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "live": self.live,
            "leader": self.leader,
            "host": self.host,
            "pid": self.pid,
            "last_update": iso_time(self.last_update_ms) if self.last_update_ms else None,
            "shards": list(self.shards),
        }


@dataclass(frozen=True)
class Snapshot:
    """One good probe: the group's lag, its members, when the probe began (epoch ms, this
    host's clock: for the chart's time axis only; the lag itself is on Kinesis's clock) and how
    long it took."""

    figure: GroupLag
    members: tuple[MemberRow, ...] = ()
    probed_at_ms: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Point:
    """One probe in the history: its time and each shard's lag (ms)."""

    at_ms: int
    max_millis_behind: int
    shards: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Reading:
    """The board as one request sees it (a consistent copy)."""

    last: Snapshot | None
    stale: bool
    successes: int
    failures: int
    last_error: str | None
    last_attempt_ms: int | None
    history: tuple[Point, ...]


class LagBoard:
    """The probes' results, shared by the probe loop (writer) and the HTTP server (readers).

    ``interval``: seconds between probes (for the documents, and the default staleness);
    ``history_seconds``: how far back the chart reaches; ``stale_after``: seconds after the last
    good probe at which its figure counts as stale even without a failure (default three
    intervals, at least 30 s).
    """

    def __init__(
        self,
        app: str,
        table: str,
        *,
        interval: float,
        history_seconds: float = DEFAULT_HISTORY_SECONDS,
        stale_after: float | None = None,
    ) -> None:
        self.app = app
        self.table = table
        self.interval = interval
        self.history_seconds = history_seconds
        self.stale_after = stale_after if stale_after is not None else max(3 * interval, 30.0)
        points = math.ceil(history_seconds / interval) + 1 if interval > 0 else MAX_HISTORY_POINTS
        self._history: deque[Point] = deque(maxlen=min(points, MAX_HISTORY_POINTS))
        self._lock = threading.Lock()
        self._last: Snapshot | None = None
        self._failed_last = False
        self._successes = 0
        self._failures = 0
        self._last_error: str | None = None
        self._last_attempt_ms: int | None = None

    # -- the probe loop's calls ---------------------------------------------------------------
    def succeeded(self, snapshot: Snapshot) -> None:
        """Probe loop: a good probe. Its figure is served from now on, and joins the history
        (points older than ``history_seconds`` before it leave)."""
        rows = snapshot.figure.shards
        point = Point(
            snapshot.probed_at_ms,
            snapshot.figure.max_millis_behind,
            {(row.stream, row.shard_id): row.millis_behind for row in rows},
        )
        horizon = snapshot.probed_at_ms - self.history_seconds * 1000
        with self._lock:
            self._last = snapshot
            self._failed_last = False
            self._successes += 1
            self._last_error = None
            self._last_attempt_ms = snapshot.probed_at_ms
            self._history.append(point)
            while self._history and self._history[0].at_ms < horizon:
                self._history.popleft()

    def failed(self, error: str, at_ms: int) -> None:
        """Probe loop: a probe failed (``error``: one line for the page and the documents).
        The last good figure stays, marked stale."""
        with self._lock:
            self._failed_last = True
            self._failures += 1
            self._last_error = error
            self._last_attempt_ms = at_ms

    # -- the server's calls -------------------------------------------------------------------
    def reading(self, now_ms: int) -> Reading:
        """A consistent copy for one request, with staleness judged at ``now_ms``."""
        with self._lock:
            last = self._last
            old = last is not None and now_ms - last.probed_at_ms > self.stale_after * 1000
            return Reading(
                last=last,
                stale=last is None or self._failed_last or old,
                successes=self._successes,
                failures=self._failures,
                last_error=self._last_error,
                last_attempt_ms=self._last_attempt_ms,
                history=tuple(self._history),
            )

    def lag_document(self, now_ms: int) -> dict[str, Any] | None:
        """``/lag.json``: ``kinesumer lag --json``'s document of the last good probe, plus the
        fields a scaler reads at a fixed path (``max_millis_behind``, ``max_seconds_behind``)
        and how fresh they are. None before the first good probe."""
        reading = self.reading(now_ms)
        if reading.last is None:
            return None
        figure = reading.last.figure
        return {
            **figure.to_json(),
            "max_seconds_behind": figure.max_millis_behind / 1000,
            **freshness_json(reading, now_ms),
        }

    def status_document(self, now_ms: int) -> dict[str, Any]:
        """``/status.json``, what the status page draws: the group's figure, members, shards,
        and the history as one time axis with a series per shard (``null`` where a probe did
        not list the shard)."""
        reading = self.reading(now_ms)
        last = reading.last
        shards: list[dict[str, Any]] = []
        if last is not None:
            shards = [{**row.to_json(), "finished": row.finished} for row in last.figure.shards]
        return {
            "app": self.app,
            "table": self.table,
            "interval_seconds": self.interval,
            "history_seconds": self.history_seconds,
            "now": now_ms,
            "max_millis_behind": None if last is None else last.figure.max_millis_behind,
            "streams": {} if last is None else dict(sorted(last.figure.streams.items())),
            **freshness_json(reading, now_ms),
            "members": [] if last is None else [m.to_json() for m in last.members],
            "shards": shards,
            "history": history_json(reading.history),
        }

    def freshness(self, now_ms: int) -> dict[str, Any]:
        """How fresh the figures are (every document carries it): ``stale``, the last good
        probe's time and age, and the probes' counts with the last error."""
        return freshness_json(self.reading(now_ms), now_ms)


def freshness_json(reading: Reading, now_ms: int) -> dict[str, Any]:
    last = reading.last
    return {
        "stale": reading.stale,
        "probed_at": None if last is None else iso_time(last.probed_at_ms),
        "age_seconds": None if last is None else max(now_ms - last.probed_at_ms, 0) / 1000,
        "probes": {
            "succeeded": reading.successes,
            "failed": reading.failures,
            "last_error": reading.last_error,
        },
    }


def history_json(points: Sequence[Point]) -> dict[str, Any]:
    """The history as the chart wants it: ``times`` (epoch ms), the group's maximum at each,
    and per shard one value per time (``null`` where that probe did not list it)."""
    keys = sorted({key for point in points for key in point.shards})
    return {
        "times": [point.at_ms for point in points],
        "max_millis_behind": [point.max_millis_behind for point in points],
        "series": [
            {
                "stream": stream,
                "shard_id": shard_id,
                "millis_behind": [point.shards.get((stream, shard_id)) for point in points],
            }
            for stream, shard_id in keys
        ],
    }
