"""The OpenTelemetry path's gauges leave as the Prometheus series do: a shard that left this
member (``shard_dropped``) no longer reports its lag, and a member that closed no longer reports
its shards owned or leadership. With the SDK's default (cumulative) temporality a synchronous
gauge's last value is exported at every collection for good: a shard handed to another member
would keep its last lag (a lag alert that never clears), and a stopped leader would stay a
leader next to the new one."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from kinesumer.observability.otel_metrics import OpenTelemetryMetrics

BEHIND = "kinesumer_millis_behind_latest"


def series(memory: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, object], ...], float]:
    """``name``'s data points as the reader collects them now: attributes -> value."""
    out: dict[tuple[tuple[str, object], ...], float] = {}
    data = memory.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        out[tuple(sorted((point.attributes or {}).items()))] = point.value
    return out


def shards(memory: InMemoryMetricReader) -> dict[str, float]:
    return {dict(key)["shard_id"]: value for key, value in series(memory, BEHIND).items()}


def test_a_dropped_shard_no_longer_reports_its_lag() -> None:
    memory = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[memory]), "shop", "m-1")
    metrics.behind("orders", "shardId-0", 5000)
    metrics.behind("orders", "shardId-1", 7)
    assert shards(memory) == {"shardId-0": 5000, "shardId-1": 7}
    metrics.behind("orders", "shardId-0", 0)
    metrics.shard_dropped("orders", "shardId-1")
    assert shards(memory) == {"shardId-0": 0}
    assert shards(memory) == {"shardId-0": 0}  # and at the next collection
    metrics.behind("orders", "shardId-1", 3)  # claimed again: reported again
    assert shards(memory) == {"shardId-0": 0, "shardId-1": 3}


def test_a_closed_member_reports_no_gauges() -> None:
    memory = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[memory])
    old = OpenTelemetryMetrics(provider, "shop", "m-1")
    old.membership(4, True)
    old.behind("orders", "shardId-0", 10)
    old.close()
    new = OpenTelemetryMetrics(provider, "shop", "m-2")
    new.membership(4, True)
    leaders = {dict(key)["client_id"]: v for key, v in series(memory, "kinesumer_leader").items()}
    assert leaders == {"m-2": 1}
    owned = series(memory, "kinesumer_owned_shards")
    assert [dict(key)["client_id"] for key in owned] == ["m-2"]
    assert shards(memory) == {}


def test_a_closed_prometheus_member_forgets_shards_it_never_measured_the_lag_of() -> None:
    """A subscription that stalled before its first event (no MillisBehindLatest yet, so no
    lag reported) still counted the shard's subscriptions and stalls: close() removes them."""
    from prometheus_client import CollectorRegistry

    from kinesumer.observability.metrics import PrometheusMetrics

    registry = CollectorRegistry()
    metrics = PrometheusMetrics("shop", "m-1", registry)
    metrics.efo_subscribed("orders", "shardId-0")
    metrics.efo_stalled("orders", "shardId-0")
    metrics.delivered("orders", "shardId-1", 1, 10)  # a batch whose answer had no lag
    labels = {"app": "shop", "client_id": "m-1", "stream": "orders", "shard_id": "shardId-0"}
    assert registry.get_sample_value("kinesumer_efo_stalls_total", labels) == 1
    metrics.close()
    assert registry.get_sample_value("kinesumer_efo_stalls_total", labels) is None
    assert registry.get_sample_value("kinesumer_efo_subscriptions_total", labels) is None
    labels["shard_id"] = "shardId-1"
    assert registry.get_sample_value("kinesumer_records_total", labels) is None
