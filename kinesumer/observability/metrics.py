"""Prometheus metrics, with the ``metrics`` extra (``pip install kinesumer[metrics]``).

The engine reports what happens to a :class:`Metrics` object; the base class records nothing
(metrics off, the default), :class:`PrometheusMetrics` records into a ``prometheus_client``
registry (the process-wide default one, so the application's own metrics and ours share one
endpoint). Every series carries ``app`` and ``client_id``; per-shard series are removed when the
shard leaves this member, so a long-running process does not accumulate dead series.

Calls come once per batch, per AWS request or per membership change, never per record; the
exceptions are ``run()``'s handler outcomes and durations, once per handler call (a record, for
a handler without ``batch=``). :mod:`.otel_metrics` records the same series through
OpenTelemetry instead (``Config.meter_provider``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from ..config import Config
from ..errors import ConfigError, MetricsNotInstalledError
from .metric_events import Metrics as Metrics  # re-exported: the engine imports it from here
from .metric_families import Families

log = logging.getLogger("kinesumer.metrics")


_families: dict[int, Families] = {}
_servers: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def _families_for(registry: Any) -> Families:
    with _lock:
        families = _families.get(id(registry))
        if families is None:
            families = _families[id(registry)] = Families(registry)
        return families


class PrometheusMetrics(Metrics):
    times_handlers = True

    def __init__(self, app: str, client_id: str, registry: Any = None) -> None:
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        self._f = _families_for(registry)
        self._member = (app, client_id)
        self._shards: set[tuple[str, str]] = set()

    def delivered(self, stream: str, shard_id: str, records: int, nbytes: int) -> None:
        self._shards.add((stream, shard_id))
        labels = (*self._member, stream, shard_id)
        self._f.records.labels(*labels).inc(records)
        self._f.bytes.labels(*labels).inc(nbytes)

    def behind(self, stream: str, shard_id: str, millis: int | None) -> None:
        if millis is not None:
            self._shards.add((stream, shard_id))
            self._f.behind.labels(*self._member, stream, shard_id).set(millis)

    def shard_dropped(self, stream: str, shard_id: str) -> None:
        labels = (*self._member, stream, shard_id)
        per_shard = (self._f.behind, self._f.records, self._f.bytes, self._f.efo_subscriptions)
        for family in (*per_shard, self._f.efo_stalls):
            with contextlib.suppress(KeyError):  # never reported, or already removed
                family.remove(*labels)
        self._shards.discard((stream, shard_id))

    def aws_call(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        labels = (*self._member, service, operation)
        self._f.calls.labels(*labels, error or "ok").inc()
        self._f.latency.labels(*labels).observe(seconds)
        if capacity:
            self._f.capacity.labels(*self._member, operation).inc(capacity)

    def throttled(self, service: str, operation: str) -> None:
        self._f.throttles.labels(*self._member, service, operation).inc()

    def checkpoint(self, stream: str, conflict: bool) -> None:
        family = self._f.conflicts if conflict else self._f.checkpoints
        family.labels(*self._member, stream).inc()

    def membership(self, owned: int, leader: bool) -> None:
        self._f.owned.labels(*self._member).set(owned)
        self._f.leader.labels(*self._member).set(1 if leader else 0)

    def rebalanced(self) -> None:
        self._f.rebalances.labels(*self._member).inc()

    def handoff(self, seconds: float) -> None:
        self._f.handoff.labels(*self._member).observe(seconds)

    def handled(self, handler: str, outcome: str, records: int) -> None:
        self._f.handled.labels(*self._member, handler, outcome).inc(records)

    def handler_call(self, handler: str, seconds: float) -> None:
        self._f.handler_seconds.labels(*self._member, handler).observe(seconds)

    def efo_subscribed(self, stream: str, shard_id: str) -> None:
        # Every per-shard series adds its shard (not only the lag): a subscription that stalls
        # before its first event reported no lag, and close() must still forget it.
        self._shards.add((stream, shard_id))
        self._f.efo_subscriptions.labels(*self._member, stream, shard_id).inc()

    def efo_subscribe_failed(self, stream: str, error: str) -> None:
        self._f.efo_failures.labels(*self._member, stream, error).inc()

    def efo_stalled(self, stream: str, shard_id: str) -> None:
        self._shards.add((stream, shard_id))
        self._f.efo_stalls.labels(*self._member, stream, shard_id).inc()

    def unaggregated(self, stream: str, shard_id: str) -> None:
        self._f.unaggregated.labels(*self._member, stream).inc()

    def corrupt_state_item(self, kind: str) -> None:
        self._f.corrupt.labels(*self._member, kind).inc()

    def produced(self, stream: str, records: int, nbytes: int, seconds: float) -> None:
        labels = (*self._member, stream)
        self._f.produced.labels(*labels).inc(records)
        self._f.produced_bytes.labels(*labels).inc(nbytes)
        self._f.produce_latency.labels(*labels).observe(seconds)

    def produce_failed(self, stream: str, error: str) -> None:
        self._f.produce_failures.labels(*self._member, stream, error).inc()

    def produce_retried(self, stream: str, entries: int, throttled: int) -> None:
        self._f.produce_retries.labels(*self._member, stream).inc(entries)
        if throttled:
            self._f.produce_throttled.labels(*self._member, stream).inc(throttled)

    def produce_buffer_changed(self, records: int, nbytes: int) -> None:
        self._f.produce_buffered.labels(*self._member).inc(records)
        self._f.produce_buffered_bytes.labels(*self._member).inc(nbytes)

    def outbox_relayed(self, stream: str, records: int) -> None:
        self._f.outbox_relayed.labels(*self._member, stream).inc(records)

    def outbox_moved_aside(self, stream: str) -> None:
        self._f.outbox_moved_aside.labels(*self._member, stream).inc()

    def outbox_lag(self, pending: int, oldest_seconds: float | None) -> None:
        self._f.outbox_pending.labels(*self._member).set(pending)
        self._f.outbox_oldest.labels(*self._member).set(oldest_seconds or 0.0)

    def close(self) -> None:
        """The member left: its gauges would otherwise report stale values forever."""
        for stream, shard_id in list(self._shards):
            self.shard_dropped(stream, shard_id)
        for family in (self._f.owned, self._f.leader):
            with contextlib.suppress(KeyError):
                family.remove(*self._member)


def metrics_for(config: Config, client_id: str) -> Metrics:
    """The metrics an engine reports to: nothing unless ``config.metrics`` (or a port) is set;
    starts the HTTP endpoint on ``metrics_port`` once per process. With
    ``config.meter_provider``, through OpenTelemetry instead (:mod:`.otel_metrics`)."""
    if config.meter_provider is not None:
        from .otel_metrics import OpenTelemetryMetrics

        return OpenTelemetryMetrics(config.meter_provider, config.app, client_id)
    if not (config.metrics or config.metrics_port is not None):
        return Metrics()
    try:
        import prometheus_client
    except ImportError as exc:
        raise MetricsNotInstalledError(
            "Config.metrics needs prometheus_client: pip install 'kinesumer[metrics]'"
        ) from exc
    if config.metrics_port is not None:
        key = (config.metrics_address, config.metrics_port)
        with _lock:
            if key not in _servers:
                try:
                    _servers[key] = prometheus_client.start_http_server(
                        config.metrics_port, addr=config.metrics_address
                    )
                except OSError as exc:
                    raise ConfigError(
                        "metrics_port",
                        f"cannot serve metrics on {config.metrics_address}:{config.metrics_port} "
                        f"({exc.strerror or exc}); choose a free port",
                    ) from exc
                log.info("serving Prometheus metrics on %s:%d/metrics", *key)
    return PrometheusMetrics(config.app, client_id)
