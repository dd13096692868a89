"""How far behind a consumer group is, figured without I/O or clocks: the rules of the lag probe
(:func:`kinesumer.admin.group_lag`), apart from its reads so that they can be tested alone.

A shard's lag is the age of its oldest record not yet checkpointed, on Kinesis's clock: what
Kinesis calls a consumer's iterator age, measured from the stream itself, so it needs no member
running. The probe reads each shard where its next reader would start (:func:`probe_start`),
reads a page or a few (:func:`judge_page`), and figures the age of the first unread record it
finds (:func:`record_lag`). The rows are then combined (:class:`GroupLag`): per stream and per
group the maximum, not the sum, since members read shards in parallel and the furthest-behind
shard is what a group must catch up on.

Lineage: a closed parent that is ``finished`` (read to its end and checkpointed so) has no lag
(:func:`settled_lag`), whatever its figure; one that is not finished counts like any shard, as
its children wait for it and their records are only read after its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..models import Position


class StartKind(Enum):
    """Where a probe opens a shard (the same place its next reader would)."""

    #: After the checkpointed position: AT its sequence number, skipping through it, as the
    #: readers resume (a KPL aggregate read only in part still holds unread sub-records).
    AFTER_CHECKPOINT = "after checkpoint"
    #: At the recorded LATEST start (the first record that arrived at or after it).
    SINCE = "since LATEST start"
    #: The oldest record the shard keeps.
    TRIM_HORIZON = "TRIM_HORIZON"


@dataclass(frozen=True)
class ProbeStart:
    """Where a probe opens a shard: ``position`` for :attr:`StartKind.AFTER_CHECKPOINT`,
    ``since_ms`` (epoch ms, Kinesis's clock) for :attr:`StartKind.SINCE`."""

    kind: StartKind
    position: Position | None = None
    since_ms: int | None = None


def probe_start(
    position: Position | None, started_at_ms: int | None, spark_pin_ms: int | None = None
) -> ProbeStart:
    """Where the next reader of a shard starts, which is where its unread records begin:

    - after the checkpointed ``position``;
    - without one, at the recorded ``LATEST`` start (``started_at_ms``: every later reader of
      the group starts there, whatever its initial position), or at the app's Spark queries'
      LATEST pin;
    - with neither, at ``TRIM_HORIZON``. The group's initial position is the members'
      configuration and is not in the table: a child shard always starts at TRIM_HORIZON, and a
      shard no member of a ``LATEST`` group opened yet records its start the moment one does.
      TRIM_HORIZON is the figure that never hides a lag: for such a shard it may overstate it
      (by the age of the oldest record kept) until a member opens it.
    """
    if position is not None:
        return ProbeStart(StartKind.AFTER_CHECKPOINT, position=position)
    since = started_at_ms if started_at_ms is not None else spark_pin_ms
    if since is not None:
        return ProbeStart(StartKind.SINCE, since_ms=since)
    return ProbeStart(StartKind.TRIM_HORIZON)


#: Milliseconds added to a ``Date`` header's time: the header counts whole seconds (the
#: fraction dropped), so the end of its second is the latest instant it may stand for. A lag
#: figured from it is never below the record's true age at that instant, and above it by less
#: than a second.
DATE_RESOLUTION_MS = 999


def server_now_ms(date_ms: int | None) -> int | None:
    """Kinesis's "now" for a probe, from the ``Date`` (epoch ms, whole seconds) of the answer
    that opened its iterator: the end of that second (:data:`DATE_RESOLUTION_MS`)."""
    return None if date_ms is None else date_ms + DATE_RESOLUTION_MS


def record_lag(now_ms: int | None, arrival_ms: int, millis_behind_latest: int | None) -> int:
    """The lag of a shard whose oldest unread record arrived at ``arrival_ms`` (its
    ApproximateArrivalTimestamp): Kinesis's ``now_ms`` minus the arrival, and at least the
    page's MillisBehindLatest.

    MillisBehindLatest measures the position at or after the page's records, which is never
    older than the first unread record: it is a lower bound of the lag, exact to the
    millisecond on AWS (kinesalite always says 0). The ``Date``-based figure covers kinesalite
    and an AWS shard at the tip. Never negative (a record may arrive after the ``Date``).
    ``now_ms`` None (no ``Date``): MillisBehindLatest alone.
    """
    by_date = 0 if now_ms is None else now_ms - arrival_ms
    return max(by_date, millis_behind_latest or 0, 0)


class PageVerdict(Enum):
    """What one GetRecords page of a probe says (:func:`judge_page`)."""

    #: An unread record is on the page: its age is the lag.
    FOUND = "found"
    #: No unread record, and the shard has nothing after the page: lag 0.
    CAUGHT_UP = "caught up"
    #: No unread record on the page, but more may follow: read the next page.
    READ_ON = "read on"


def judge_page(
    *,
    unread: int,
    raw_count: int,
    limit: int,
    has_next: bool,
    millis_behind_latest: int | None,
) -> PageVerdict:
    """Judge a probe's page: ``unread`` records on it not yet checkpointed (after the skipped
    checkpointed record, or those before a LATEST start), of ``raw_count`` Kinesis records
    asked with ``limit``.

    - an unread record: :attr:`PageVerdict.FOUND`;
    - no next iterator: the closed shard is read to its end: caught up;
    - MillisBehindLatest 0 and a page not full: at the tip, caught up (kinesalite always says
      0, but fills a page while records remain, so a full page reads on);
    - otherwise read on: records were skipped, or an empty page with MillisBehindLatest > 0
      (trimmed or sparse data, which AWS answers with empty pages that move the iterator on).
    """
    if unread:
        return PageVerdict.FOUND
    if not has_next:
        return PageVerdict.CAUGHT_UP
    if not millis_behind_latest and raw_count < limit:
        return PageVerdict.CAUGHT_UP
    return PageVerdict.READ_ON


def settled_lag(finished: bool, probed_ms: int) -> int:
    """A shard's lag as the group sees it: 0 for a ``finished`` shard (a closed parent read to
    its end: nothing of it is left, its children go on), else what the probe found."""
    return 0 if finished else max(probed_ms, 0)


@dataclass(frozen=True)
class ShardLag:
    """One shard's row: its live ``owner`` (None when free or its owner is not live), its
    ``checkpoint`` (``sequence[/sub-sequence]``, or a description of where its readers start),
    and how far behind the group is on it."""

    stream: str
    shard_id: str
    owner: str | None
    checkpoint: str | None
    millis_behind: int
    finished: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "shard_id": self.shard_id,
            "owner": self.owner,
            "checkpoint": self.checkpoint,
            "millis_behind": self.millis_behind,
        }


@dataclass(frozen=True)
class GroupLag:
    """The lag of one app's group: a row per shard, sorted by stream and shard id, and the
    streams asked about (a stream without a shard the table or Kinesis knows counts 0)."""

    app: str
    table: str
    shards: tuple[ShardLag, ...]
    stream_names: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, app: str, table: str, rows: Iterable[ShardLag], streams: Iterable[str] = ()
    ) -> GroupLag:
        """The group's figure from its rows, in a stable order (one row per shard: a later
        row of the same shard replaces an earlier one)."""
        unique = {(row.stream, row.shard_id): row for row in rows}
        names = sorted({*streams, *(stream for stream, _ in unique)})
        return cls(app, table, tuple(unique[key] for key in sorted(unique)), tuple(names))

    @property
    def streams(self) -> Mapping[str, int]:
        """Each stream's maximum lag (ms)."""
        maxima = dict.fromkeys(self.stream_names, 0)
        for row in self.shards:
            maxima[row.stream] = max(maxima.get(row.stream, 0), row.millis_behind)
        return maxima

    @property
    def max_millis_behind(self) -> int:
        """The group's lag: its furthest-behind shard's (0 with no shard)."""
        return max((row.millis_behind for row in self.shards), default=0)

    def to_json(self) -> dict[str, Any]:
        """The document ``kinesumer lag --json`` prints: stable keys, for scripts and scalers."""
        return {
            "app": self.app,
            "table": self.table,
            "max_millis_behind": self.max_millis_behind,
            "streams": {
                name: {"max_millis_behind": value} for name, value in sorted(self.streams.items())
            },
            "shards": [row.to_json() for row in self.shards],
        }
