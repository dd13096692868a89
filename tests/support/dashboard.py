"""The metrics the Grafana dashboard reads (dashboards/kinesumer.json), as the library exports them:
the dashboard tests and the OpenTelemetry metrics tests both check against them."""

from __future__ import annotations

import inspect
from typing import Any

from prometheus_client import CollectorRegistry

from kinesumer.observability.metrics import Metrics, PrometheusMetrics

#: One call of every method the engine reports through, with plausible arguments.
CALLS: dict[str, tuple[Any, ...] | list[tuple[Any, ...]]] = {
    "delivered": ("orders", "shardId-0", 10, 1000),
    "behind": ("orders", "shardId-0", 1500),
    "aws_call": [
        ("dynamodb", "UpdateItem", 0.01, None, 1.0),
        ("kinesis", "GetRecords", 0.02, "ProvisionedThroughputExceededException", 0.0),
    ],
    "throttled": ("kinesis", "GetRecords"),
    "checkpoint": [("orders", False), ("orders", True)],
    "membership": (3, True),
    "rebalanced": (),
    "handoff": (0.2,),
    "handled": ("h", "ok", 5),
    "handler_call": ("h", 0.003),
    "efo_subscribed": ("orders", "shardId-0"),
    "efo_subscribe_failed": ("orders", "ResourceInUseException"),
    "efo_stalled": ("orders", "shardId-0"),
    "outbox_relayed": ("orders", 5),
    "outbox_moved_aside": ("orders",),
    "outbox_lag": (3, 1.5),
    "unaggregated": ("orders", "shardId-0"),
    "corrupt_state_item": ("client",),
    "produced": ("orders", 10, 1000, 0.05),
    "produce_failed": ("orders", "InternalFailure"),
    "produce_retried": ("orders", 3, 2),
    "produce_buffer_changed": (7, 700),
}


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, as a member's endpoint serves them."""
    public = {
        name
        for name, member in inspect.getmembers(Metrics, inspect.isfunction)
        if not name.startswith("_") and name not in ("close", "shard_dropped")
    }
    assert public == set(CALLS), "a new Metrics method: give it a call in CALLS"
    registry = CollectorRegistry()
    metrics = PrometheusMetrics("shop", "member-1", registry)
    for name, calls in CALLS.items():
        for arguments in calls if isinstance(calls, list) else [calls]:
            getattr(metrics, name)(*arguments)
    samples: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples
