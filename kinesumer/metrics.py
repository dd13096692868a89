"""Prometheus metrics, with the ``metrics`` extra (``pip install kinesumer[metrics]``).

The engine reports what happens to a :class:`Metrics` object; the base class records nothing
(metrics off, the default), :class:`PrometheusMetrics` records into a ``prometheus_client``
registry (the process-wide default one, so the application's own metrics and ours share one
endpoint). Every series carries ``app`` and ``client_id``; per-shard series are removed when the
shard leaves this member, so a long-running process does not accumulate dead series.

Calls come once per batch, per AWS request or per membership change, never per record; the
exceptions are ``run()``'s handler outcomes and durations, once per handler call (a record, for
a handler without ``batch=``). :mod:`kinesumer.otel_metrics` records the same series through
OpenTelemetry instead (``Config.meter_provider``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from .config import Config
from .errors import ConfigError, MetricsNotInstalledError

log = logging.getLogger("kinesumer.metrics")

# Seconds; GetRecords usually answers in tens of milliseconds, DynamoDB in single digits.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_HANDOFF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """What the engine reports. This base records nothing."""

    #: Whether :meth:`handler_call` records anything: handlers are only timed when it does.
    times_handlers = False

    def delivered(self, stream: str, shard_id: str, records: int, nbytes: int) -> None:
        """A batch of ``records`` (``nbytes`` of data) handed to the application."""

    def behind(self, stream: str, shard_id: str, millis: int | None) -> None:
        """MillisBehindLatest of the last GetRecords on a shard."""

    def shard_dropped(self, stream: str, shard_id: str) -> None:
        """The shard left this member: forget its series."""

    def aws_call(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        """One AWS request (every attempt, retries included), its error code if it failed and
        the DynamoDB capacity it consumed."""

    def throttled(self, service: str, operation: str) -> None:
        """One AWS request refused for throughput."""

    def checkpoint(self, stream: str, conflict: bool) -> None:
        """A checkpoint write landed, or was refused because another member owns the shard."""

    def membership(self, owned: int, leader: bool) -> None:
        """Shards this member reads now, and whether it leads."""

    def rebalanced(self) -> None:
        """This member's assignment changed."""

    def handoff(self, seconds: float) -> None:
        """A shard was handed off: from revoke to the release write."""

    def handled(self, handler: str, outcome: str, records: int) -> None:
        """``records`` records given to ``run()``'s ``handler`` had ``outcome`` (ok,
        retried, discarded, dead_lettered, retry_later, failed, decode_error)."""

    def handler_call(self, handler: str, seconds: float) -> None:
        """One call of ``run()``'s ``handler`` (an attempt: a retry is a call of its own) took
        ``seconds``, whatever its outcome."""

    def efo_subscribed(self, stream: str, shard_id: str) -> None:
        """Enhanced fan-out: a SubscribeToShard subscription of a shard began (one per shard
        every 5 minutes while all is well)."""

    def efo_subscribe_failed(self, stream: str, error: str) -> None:
        """Enhanced fan-out: a subscription failed with ``error`` (subscribed again later)."""

    def efo_stalled(self, stream: str, shard_id: str) -> None:
        """Enhanced fan-out: a subscription of the shard stalled (no event for 10 s)."""

    def unaggregated(self, stream: str, shard_id: str) -> None:
        """A record had the KPL magic and digest but was not a valid aggregate: delivered as
        is."""

    def corrupt_state_item(self, kind: str) -> None:
        """A state item of ``kind`` could not be read back and was skipped."""

    def produced(self, stream: str, records: int, nbytes: int, seconds: float) -> None:
        """Producer, once per PutRecords answer: ``records`` written to ``stream``; ``seconds``
        from the put of the oldest of them to the answer."""

    def produce_failed(self, stream: str, error: str) -> None:
        """Producer: a record failed for good (its future holds ``error``; rare)."""

    def produce_retried(self, stream: str, entries: int, throttled: int) -> None:
        """Producer, once per answer with refusals: entries to send again, ``throttled`` of
        them refused for throughput."""

    def outbox_relayed(self, stream: str, records: int) -> None:
        """Outbox relay, once per cycle and stream: rows acknowledged by Kinesis."""

    def outbox_moved_aside(self, stream: str) -> None:
        """Outbox relay: a row Kinesis refuses for good moved to the dead-letter table."""

    def outbox_lag(self, pending: int, oldest_seconds: float | None) -> None:
        """Outbox relay, about once a second: rows not yet acknowledged, the oldest's age."""

    def close(self) -> None:
        """The member left."""


class _Families:
    """The metric families, created once per registry (a registry refuses duplicates)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        member = ["app", "client_id"]
        shard = [*member, "stream", "shard_id"]
        call = [*member, "service", "operation"]
        kw = {"registry": registry}
        self.records = Counter(
            "kinesumer_records", "Records handed to the application.", shard, **kw
        )
        self.bytes = Counter(
            "kinesumer_bytes", "Bytes of record data handed to the application.", shard, **kw
        )
        self.behind = Gauge(
            "kinesumer_millis_behind_latest",
            "MillisBehindLatest of the last GetRecords on each shard this member reads.",
            shard,
            **kw,
        )
        self.calls = Counter(
            "kinesumer_aws_requests",
            "AWS requests, every attempt, by outcome ('ok' or the error code).",
            [*call, "outcome"],
            **kw,
        )
        self.latency = Histogram(
            "kinesumer_aws_request_seconds",
            "Latency of AWS requests (GetRecords, DynamoDB, ...).",
            call,
            buckets=_LATENCY_BUCKETS,
            **kw,
        )
        self.efo_stalls = Counter(
            "kinesumer_efo_stalls",
            "Enhanced fan-out subscriptions that gave no event for 10 s (read by polling after "
            "Config.efo_stall_limit in a row).",
            shard,
            **kw,
        )
        self.throttles = Counter(
            "kinesumer_throttles", "AWS requests refused for throughput.", call, **kw
        )
        self.capacity = Counter(
            "kinesumer_dynamodb_consumed_capacity",
            "DynamoDB capacity units consumed (ReturnConsumedCapacity=TOTAL).",
            [*member, "operation"],
            **kw,
        )
        self.checkpoints = Counter(
            "kinesumer_checkpoint_writes",
            "Checkpoint writes that landed.",
            [*member, "stream"],
            **kw,
        )
        self.conflicts = Counter(
            "kinesumer_checkpoint_conflicts",
            "Checkpoint writes refused because another member owns the shard.",
            [*member, "stream"],
            **kw,
        )
        self.owned = Gauge("kinesumer_owned_shards", "Shards this member reads.", member, **kw)
        self.leader = Gauge(
            "kinesumer_leader", "1 while this member leads its group, else 0.", member, **kw
        )
        self.rebalances = Counter(
            "kinesumer_rebalances", "Changes of this member's assignment.", member, **kw
        )
        self.handoff = Histogram(
            "kinesumer_handoff_seconds",
            "Graceful handoff of a shard: from revoke to the release write.",
            member,
            buckets=_HANDOFF_BUCKETS,
            **kw,
        )
        self.handled = Counter(
            "kinesumer_handler_records",
            "Records given to a run() handler, by handler and outcome.",
            [*member, "handler", "outcome"],
            **kw,
        )
        self.handler_seconds = Histogram(
            "kinesumer_handler_seconds",
            "Duration of run() handler calls (each attempt), whatever their outcome.",
            [*member, "handler"],
            buckets=_LATENCY_BUCKETS,
            **kw,
        )
        self.efo_subscriptions = Counter(
            "kinesumer_efo_subscriptions",
            "Enhanced fan-out subscriptions (SubscribeToShard) begun, per shard.",
            shard,
            **kw,
        )
        self.efo_failures = Counter(
            "kinesumer_efo_subscription_failures",
            "Enhanced fan-out subscriptions that failed, by error (subscribed again later).",
            [*member, "stream", "error"],
            **kw,
        )
        self.unaggregated = Counter(
            "kinesumer_unaggregated_records",
            "Records delivered unaggregated: KPL magic and digest, but not a valid aggregate.",
            [*member, "stream"],
            **kw,
        )
        self.corrupt = Counter(
            "kinesumer_corrupt_state_items",
            "State table items skipped because they cannot be read back, by kind.",
            [*member, "kind"],
            **kw,
        )

        stream = [*member, "stream"]
        self.produced = Counter(
            "kinesumer_produced_records", "Records a Producer wrote.", stream, **kw
        )
        self.produced_bytes = Counter(
            "kinesumer_produced_bytes", "Bytes (data and key) a Producer wrote.", stream, **kw
        )
        self.produce_failures = Counter(
            "kinesumer_produce_failures",
            "Records a Producer could not write, by error.",
            [*stream, "error"],
            **kw,
        )
        self.produce_retries = Counter(
            "kinesumer_produce_retries", "PutRecords entries a Producer sent again.", stream, **kw
        )
        self.produce_throttled = Counter(
            "kinesumer_produce_throttled_entries",
            "PutRecords entries refused for throughput.",
            stream,
            **kw,
        )
        self.produce_latency = Histogram(
            "kinesumer_produce_seconds",
            "Per PutRecords answer: from the put of its oldest record to the answer.",
            stream,
            buckets=_LATENCY_BUCKETS,
            **kw,
        )
        self.outbox_relayed = Counter(
            "kinesumer_outbox_relayed", "Outbox rows acknowledged by Kinesis.", stream, **kw
        )
        self.outbox_moved_aside = Counter(
            "kinesumer_outbox_moved_aside",
            "Outbox rows Kinesis refuses for good, moved to the dead-letter table.",
            stream,
            **kw,
        )
        self.outbox_pending = Gauge(
            "kinesumer_outbox_pending", "Outbox rows not yet acknowledged by Kinesis.", member, **kw
        )
        self.outbox_oldest = Gauge(
            "kinesumer_outbox_oldest_pending_seconds",
            "Age of the oldest outbox row not yet acknowledged (0 when none).",
            member,
            **kw,
        )


_families: dict[int, _Families] = {}
_servers: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def _families_for(registry: Any) -> _Families:
    with _lock:
        families = _families.get(id(registry))
        if families is None:
            families = _families[id(registry)] = _Families(registry)
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
        self._f.efo_subscriptions.labels(*self._member, stream, shard_id).inc()

    def efo_subscribe_failed(self, stream: str, error: str) -> None:
        self._f.efo_failures.labels(*self._member, stream, error).inc()

    def efo_stalled(self, stream: str, shard_id: str) -> None:
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
    ``config.meter_provider``, through OpenTelemetry instead (:mod:`kinesumer.otel_metrics`)."""
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
