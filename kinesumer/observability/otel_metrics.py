"""The engine's metrics through OpenTelemetry, for a team that prefers it to Prometheus:
``Config(meter_provider=...)`` (the ``otel`` extra).

The instruments are the Prometheus series of :mod:`.metrics`, with the same names
(without ``_total``: an OpenTelemetry exporter to Prometheus adds it back, so
``dashboards/kinesumer.json`` works on either path), the same attributes (``app``,
``client_id``, and each series' own) and the same meaning. Counters and histograms are
OpenTelemetry's. The three member gauges (lag per shard, shards owned, leader) are observable
gauges reading :class:`_MemberGauges`, so that a series leaves as its Prometheus twin does: a
shard that left this member stops reporting its lag, a member that closed its gauges. (A
synchronous gauge cannot forget a series: with the SDK's default cumulative temporality its last
value is exported at every collection for good, a handed-off shard's lag with it.) Counters and
histograms keep their series, as OpenTelemetry has no removal: a shard's counters that stopped
moving only add nothing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .._version import __version__
from .metric_events import Metrics
from .metric_families import HANDOFF_BUCKETS, LATENCY_BUCKETS

#: The member gauges: name -> description.
BEHIND = "kinesumer_millis_behind_latest"
OWNED = "kinesumer_owned_shards"
LEADER = "kinesumer_leader"
_GAUGES = {
    BEHIND: "MillisBehindLatest of each shard.",
    OWNED: "Shards read.",
    LEADER: "1 while leading.",
}

Attributes = tuple[tuple[str, Any], ...]


class _MemberGauges:
    """The member gauges' current values, by attributes, observed at each collection: a value
    is reported until it is removed. One per meter, shared by every member reporting to it (the
    SDK gives a second observable gauge of a name the first one, callbacks and all)."""

    def __init__(self, meter: Any) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Attributes, float]] = {name: {} for name in _GAUGES}
        for name, description in _GAUGES.items():
            meter.create_observable_gauge(
                name, callbacks=[self._observer(name)], description=description
            )

    def _observer(self, name: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(_: Any) -> Iterable[Any]:
            with self._lock:  # the reader's thread; members set values on theirs
                values = list(self._values[name].items())
            return [Observation(value, dict(attributes)) for attributes, value in values]

        return observe

    def set(self, name: str, value: float, attributes: dict[str, Any]) -> None:
        with self._lock:
            self._values[name][tuple(sorted(attributes.items()))] = value

    def remove(self, name: str, where: Callable[[dict[str, Any]], bool]) -> None:
        with self._lock:
            values = self._values[name]
            for attributes in [a for a in values if where(dict(a))]:
                del values[attributes]


_BOARDS: weakref.WeakKeyDictionary[Any, _MemberGauges] = weakref.WeakKeyDictionary()
_BOARDS_LOCK = threading.Lock()


def _gauges_of(meter: Any) -> _MemberGauges:
    with _BOARDS_LOCK:
        try:
            board = _BOARDS.get(meter)
        except TypeError:  # not weakly referenceable: its own board
            return _MemberGauges(meter)
        if board is None:
            board = _BOARDS[meter] = _MemberGauges(meter)
        return board


class OpenTelemetryMetrics(Metrics):
    """Records what the engine reports into instruments of ``provider``'s meter ``kinesumer``."""

    times_handlers = True

    def __init__(self, provider: Any, app: str, client_id: str) -> None:
        meter = provider.get_meter("kinesumer", __version__)
        self._member = {"app": app, "client_id": client_id}

        def counter(name: str, what: str) -> Any:
            return meter.create_counter(name, description=what)

        def histogram(name: str, what: str, buckets: tuple[float, ...]) -> Any:
            return meter.create_histogram(
                name, description=what, explicit_bucket_boundaries_advisory=list(buckets)
            )

        self._records = counter("kinesumer_records", "Records handed to the application.")
        self._bytes = counter("kinesumer_bytes", "Bytes of record data handed to the application.")
        self._gauges = _gauges_of(meter)
        self._calls = counter("kinesumer_aws_requests", "AWS requests, every attempt, by outcome.")
        self._latency = histogram(
            "kinesumer_aws_request_seconds", "Latency of AWS requests.", LATENCY_BUCKETS
        )
        self._throttles = counter("kinesumer_throttles", "AWS requests refused for throughput.")
        self._capacity = counter(
            "kinesumer_dynamodb_consumed_capacity", "DynamoDB capacity units consumed."
        )
        self._checkpoints = counter("kinesumer_checkpoint_writes", "Checkpoint writes that landed.")
        self._conflicts = counter(
            "kinesumer_checkpoint_conflicts", "Checkpoint writes refused: another member owns it."
        )
        self._rebalances = counter("kinesumer_rebalances", "Changes of the member's assignment.")
        self._handoff = histogram(
            "kinesumer_handoff_seconds", "Graceful handoff of a shard.", HANDOFF_BUCKETS
        )
        self._handled = counter("kinesumer_handler_records", "Records given to a run() handler.")
        self._handler_seconds = histogram(
            "kinesumer_handler_seconds", "Duration of run() handler calls.", LATENCY_BUCKETS
        )
        self._efo_subscriptions = counter(
            "kinesumer_efo_subscriptions", "Enhanced fan-out subscriptions begun."
        )
        self._efo_failures = counter(
            "kinesumer_efo_subscription_failures", "Enhanced fan-out subscriptions that failed."
        )
        self._efo_stalls = counter(
            "kinesumer_efo_stalls", "Enhanced fan-out subscriptions stalled."
        )
        self._unaggregated = counter(
            "kinesumer_unaggregated_records", "Records delivered unaggregated."
        )
        self._corrupt = counter("kinesumer_corrupt_state_items", "State items skipped.")
        self._produced = counter("kinesumer_produced_records", "Records a Producer wrote.")
        self._produced_bytes = counter("kinesumer_produced_bytes", "Bytes a Producer wrote.")
        self._produce_failures = counter(
            "kinesumer_produce_failures", "Records a Producer could not write."
        )
        self._produce_retries = counter(
            "kinesumer_produce_retries", "PutRecords entries a Producer sent again."
        )
        self._produce_throttled = counter(
            "kinesumer_produce_throttled_entries", "PutRecords entries refused for throughput."
        )
        self._produce_latency = histogram(
            "kinesumer_produce_seconds",
            "Per PutRecords answer, from its oldest put.",
            LATENCY_BUCKETS,
        )
        # Up-down counters: each Producer adds its buffer's changes, so several add up.
        self._produce_buffered = meter.create_up_down_counter(
            "kinesumer_produce_buffered_records", description="Records Producers buffer."
        )
        self._produce_buffered_bytes = meter.create_up_down_counter(
            "kinesumer_produce_buffered_bytes", description="Bytes Producers buffer."
        )
        self._outbox_relayed = counter("kinesumer_outbox_relayed", "Outbox rows acknowledged.")
        self._outbox_moved = counter("kinesumer_outbox_moved_aside", "Outbox rows moved aside.")
        self._outbox_pending = meter.create_gauge(
            "kinesumer_outbox_pending", description="Outbox rows not yet acknowledged."
        )
        self._outbox_oldest = meter.create_gauge(
            "kinesumer_outbox_oldest_pending_seconds", description="Oldest outbox row's age."
        )

    def _with(self, **attributes: Any) -> dict[str, Any]:
        return {**self._member, **attributes}

    def delivered(self, stream: str, shard_id: str, records: int, nbytes: int) -> None:
        attributes = self._with(stream=stream, shard_id=shard_id)
        self._records.add(records, attributes)
        self._bytes.add(nbytes, attributes)

    def behind(self, stream: str, shard_id: str, millis: int | None) -> None:
        if millis is not None:
            self._gauges.set(BEHIND, millis, self._with(stream=stream, shard_id=shard_id))

    def shard_dropped(self, stream: str, shard_id: str) -> None:
        shard = self._with(stream=stream, shard_id=shard_id)
        self._gauges.remove(BEHIND, lambda attributes: attributes == shard)

    def aws_call(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        attributes = self._with(service=service, operation=operation)
        self._calls.add(1, {**attributes, "outcome": error or "ok"})
        self._latency.record(seconds, attributes)
        if capacity:
            self._capacity.add(capacity, self._with(operation=operation))

    def throttled(self, service: str, operation: str) -> None:
        self._throttles.add(1, self._with(service=service, operation=operation))

    def checkpoint(self, stream: str, conflict: bool) -> None:
        (self._conflicts if conflict else self._checkpoints).add(1, self._with(stream=stream))

    def membership(self, owned: int, leader: bool) -> None:
        self._gauges.set(OWNED, owned, self._member)
        self._gauges.set(LEADER, 1 if leader else 0, self._member)

    def rebalanced(self) -> None:
        self._rebalances.add(1, self._member)

    def handoff(self, seconds: float) -> None:
        self._handoff.record(seconds, self._member)

    def handled(self, handler: str, outcome: str, records: int) -> None:
        self._handled.add(records, self._with(handler=handler, outcome=outcome))

    def handler_call(self, handler: str, seconds: float) -> None:
        self._handler_seconds.record(seconds, self._with(handler=handler))

    def efo_subscribed(self, stream: str, shard_id: str) -> None:
        self._efo_subscriptions.add(1, self._with(stream=stream, shard_id=shard_id))

    def efo_subscribe_failed(self, stream: str, error: str) -> None:
        self._efo_failures.add(1, self._with(stream=stream, error=error))

    def efo_stalled(self, stream: str, shard_id: str) -> None:
        self._efo_stalls.add(1, self._with(stream=stream, shard_id=shard_id))

    def unaggregated(self, stream: str, shard_id: str) -> None:
        self._unaggregated.add(1, self._with(stream=stream))

    def corrupt_state_item(self, kind: str) -> None:
        self._corrupt.add(1, self._with(kind=kind))

    def produced(self, stream: str, records: int, nbytes: int, seconds: float) -> None:
        attributes = self._with(stream=stream)
        self._produced.add(records, attributes)
        self._produced_bytes.add(nbytes, attributes)
        self._produce_latency.record(seconds, attributes)

    def produce_failed(self, stream: str, error: str) -> None:
        self._produce_failures.add(1, self._with(stream=stream, error=error))

    def produce_retried(self, stream: str, entries: int, throttled: int) -> None:
        self._produce_retries.add(entries, self._with(stream=stream))
        if throttled:
            self._produce_throttled.add(throttled, self._with(stream=stream))

    def produce_buffer_changed(self, records: int, nbytes: int) -> None:
        self._produce_buffered.add(records, self._member)
        self._produce_buffered_bytes.add(nbytes, self._member)

    def outbox_relayed(self, stream: str, records: int) -> None:
        self._outbox_relayed.add(records, self._with(stream=stream))

    def outbox_moved_aside(self, stream: str) -> None:
        self._outbox_moved.add(1, self._with(stream=stream))

    def outbox_lag(self, pending: int, oldest_seconds: float | None) -> None:
        self._outbox_pending.set(pending, self._member)
        self._outbox_oldest.set(oldest_seconds or 0.0, self._member)

    def close(self) -> None:
        """The member left: its gauges would otherwise report stale values forever."""
        member = self._member.items()
        for name in _GAUGES:
            self._gauges.remove(name, lambda attributes: member <= attributes.items())
