"""The Prometheus series of ``kinesumer lag --serve`` (``/metrics``), built from the
:class:`~.lag_board.LagBoard` at each scrape.

A custom collector on a registry of its own (not prometheus_client's process-wide one): the
series are exactly the last good probe's rows, so a shard that leaves the stream (aged out
past retention) leaves the page with it, and nothing else registered in the process (a member
in the same interpreter, a test) mixes in. Each scrape reads the board, never Kinesis: scrapers
add no reads to the stream, however many and however often.

Series (every one labelled ``app``):

- ``kinesumer_group_lag_seconds``: the group's lag, its furthest-behind shard (what to scale on);
- ``kinesumer_stream_lag_seconds{stream}``: each stream's maximum;
- ``kinesumer_shard_lag_seconds{stream,shard_id}``: each shard's lag (the age of its oldest
  record not yet checkpointed, by Kinesis's clock);
- ``kinesumer_shard_owner_info{stream,shard_id,owner}``: 1, ``owner`` empty when no live
  member owns the shard;
- ``kinesumer_group_live_members``: live members at the last good probe;
- ``kinesumer_lag_probes_total{result}``: probes made, ``ok`` or ``error``;
- ``kinesumer_lag_probe_last_success_timestamp_seconds``: when the last good probe began
  (this host's clock, Unix seconds), and ``kinesumer_lag_probe_duration_seconds`` how long it
  took;
- ``kinesumer_lag_stale``: 1 while the figures are the last good ones after a failed probe (or
  older than the board's ``stale_after``), else 0.

The lag series are absent until the first good probe: a scraper sees "no data", not a 0 that
would read as "caught up".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import MetricsNotInstalledError
from .lag_board import LagBoard

__all__ = ["CONTENT_TYPE", "lag_registry", "render_metrics"]

#: The exposition format's content type (prometheus_client's text format, version 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def lag_registry(board: LagBoard, clock: Callable[[], float] = time.time) -> Any:
    """A new ``prometheus_client.CollectorRegistry`` holding the board's series (``clock``:
    Unix seconds, for staleness). Raises :class:`~kinesumer.errors.MetricsNotInstalledError`
    without prometheus_client (the ``metrics`` extra)."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError as exc:
        raise MetricsNotInstalledError(
            "kinesumer lag --serve needs prometheus_client: pip install 'kinesumer[metrics]'"
        ) from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_BoardCollector(board, clock))
    return registry


def render_metrics(registry: Any) -> bytes:
    """The registry in the text exposition format."""
    from prometheus_client import generate_latest

    text: bytes = generate_latest(registry)
    return text


class _BoardCollector:
    """A prometheus_client collector (anything with ``collect()``) reading the board."""

    def __init__(self, board: LagBoard, clock: Callable[[], float]) -> None:
        self._board = board
        self._clock = clock

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        board = self._board
        app = board.app
        reading = board.reading(int(self._clock() * 1000))
        probes = CounterMetricFamily(
            "kinesumer_lag_probes", "Lag probes made, by result", labels=["app", "result"]
        )
        probes.add_metric([app, "ok"], reading.successes)
        probes.add_metric([app, "error"], reading.failures)
        yield probes
        yield _gauge(
            "kinesumer_lag_stale",
            "1 while the lag figures are the last good ones after a failed (or overdue) probe",
            app,
            1 if reading.stale else 0,
        )
        last = reading.last
        if last is None:
            return
        figure = last.figure
        yield _gauge(
            "kinesumer_lag_probe_last_success_timestamp_seconds",
            "When the last good lag probe began (Unix seconds, this host's clock)",
            app,
            last.probed_at_ms / 1000,
        )
        yield _gauge(
            "kinesumer_lag_probe_duration_seconds",
            "How long the last good lag probe took",
            app,
            last.seconds,
        )
        yield _gauge(
            "kinesumer_group_live_members",
            "Live members of the group at the last good probe",
            app,
            sum(1 for member in last.members if member.live),
        )
        yield _gauge(
            "kinesumer_group_lag_seconds",
            "The group's lag: its furthest-behind shard's (Kinesis's clock)",
            app,
            figure.max_millis_behind / 1000,
        )
        streams = GaugeMetricFamily(
            "kinesumer_stream_lag_seconds",
            "Each stream's lag: its furthest-behind shard's",
            labels=["app", "stream"],
        )
        for stream, millis in sorted(figure.streams.items()):
            streams.add_metric([app, stream], millis / 1000)
        yield streams
        shards = GaugeMetricFamily(
            "kinesumer_shard_lag_seconds",
            "Age of the shard's oldest record not yet checkpointed (Kinesis's clock)",
            labels=["app", "stream", "shard_id"],
        )
        owners = InfoMetricFamily(
            "kinesumer_shard_owner",
            "The shard's live owner (empty: none)",
            labels=["app", "stream", "shard_id"],
        )
        for row in figure.shards:
            shards.add_metric([app, row.stream, row.shard_id], row.millis_behind / 1000)
            owners.add_metric([app, row.stream, row.shard_id], {"owner": row.owner or ""})
        yield shards
        yield owners


def _gauge(name: str, documentation: str, app: str, value: float) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, documentation, labels=["app"])
    family.add_metric([app], value)
    return family
