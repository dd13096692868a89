"""The engine's metrics through OpenTelemetry (``Config(meter_provider=...)``): the same names,
attributes and meaning as the Prometheus series (so the dashboard serves both paths), checked
method by method against :class:`~kinesumer.observability.metrics.PrometheusMetrics`, and from
a real member on kinesalite + dynalite read by an SDK in-memory reader."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.dashboard import CALLS, exported
from support.faultproxy import Fault
from support.group import Member, create_stream, make_config, put, setup_table
from support.wait import eventually, wait_until

from kinesumer import Config, ConfigError, Producer, Record
from kinesumer.observability.metrics import metrics_for
from kinesumer.observability.otel_metrics import OpenTelemetryMetrics


def reader() -> tuple[MeterProvider, InMemoryMetricReader]:
    memory = InMemoryMetricReader()
    return MeterProvider(metric_readers=[memory]), memory


def points(memory: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Metric name -> its data points, as the reader collects them now."""
    out: dict[str, list[Any]] = {}
    data = memory.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_every_series_is_the_prometheus_one() -> None:
    provider, memory = reader()
    metrics = OpenTelemetryMetrics(provider, "shop", "member-1")
    for name, calls in CALLS.items():
        for arguments in calls if isinstance(calls, list) else [calls]:
            getattr(metrics, name)(*arguments)
    otel = {
        name: set().union(*(set(p.attributes) for p in found))
        for name, found in points(memory).items()
    }
    prometheus: dict[str, set[str]] = {}
    for sample, labels in exported().items():
        if sample.endswith("_created"):
            continue
        family = re.sub(r"_(total|bucket|count|sum)$", "", sample)
        prometheus.setdefault(family, set()).update(labels - {"le"})
    assert otel == prometheus


def test_a_meter_provider_is_checked_and_excludes_prometheus() -> None:
    provider, _ = reader()
    with pytest.raises(ConfigError, match="meter_provider"):
        Config(app="a", dynamodb_table="state", meter_provider="statsd")
    with pytest.raises(ConfigError, match="meter_provider"):
        Config(app="a", dynamodb_table="state", meter_provider=provider, metrics=True)
    config = Config(app="a", dynamodb_table="state", meter_provider=provider)
    assert isinstance(metrics_for(config, "m1"), OpenTelemetryMetrics)


async def test_a_member_reports_through_opentelemetry(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    provider, memory = reader()
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        meter_provider=provider,
        client_id="otel-1",
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 30)
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink).start()
    try:
        await eventually(lambda: len(sink) >= 30, what="every record")
        found = points(memory)
        delivered = [p for p in found["kinesumer_records"] if p.attributes["stream"] == stream]
        assert sum(p.value for p in delivered) == 30
        assert {p.attributes["shard_id"] for p in delivered} == {r.shard_id for _, r in sink}
        assert all(p.attributes["client_id"] == "otel-1" for p in delivered)
        (owned,) = found["kinesumer_owned_shards"]
        assert owned.value == 2 and owned.attributes == {"app": config.app, "client_id": "otel-1"}
        assert [p.value for p in found["kinesumer_leader"]] == [1]
        calls = {
            (p.attributes["operation"], p.attributes["outcome"])
            for p in found["kinesumer_aws_requests"]
        }
        assert ("GetRecords", "ok") in calls
        assert any(p.count for p in found["kinesumer_aws_request_seconds"])
    finally:
        await member.close()


def test_a_producer_reports_its_buffer_through_opentelemetry(
    kinesalite: Any, unique_name: Callable[[str], str], fault_proxy: Callable[[str], Any]
) -> None:
    provider, memory = reader()
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    held = proxy.add_rule(Fault.blackhole(), service="kinesis", operation="PutRecords")
    config = Config(
        app=unique_name("app"),
        dynamodb_table="unused",
        region="us-east-1",
        kinesis_endpoint=proxy.url,
        meter_provider=provider,
    )

    def buffered(unit: str) -> float:
        found = points(memory).get(f"kinesumer_produce_buffered_{unit}", [])
        assert all(p.attributes == {"app": config.app, "client_id": "producer"} for p in found)
        return sum(p.value for p in found)

    with Producer.from_config(config) as producer:
        for i in range(20):
            producer.put(stream, b"%d" % i, partition_key=f"k{i}")
        wait_until(lambda: buffered("records") == 20, what="20 records reported buffered")
        assert buffered("bytes") == producer.stats().buffered_bytes > 0
        held.remove()
        producer.flush()
        assert buffered("records") == 0 and buffered("bytes") == 0


def test_providers_stay_in_the_driver_process() -> None:
    """The Spark source's options (strings, for executors) leave the providers out: they are
    objects of the driver's process, and the executors make no spans."""
    from opentelemetry.sdk.trace import TracerProvider

    from kinesumer.spark.source.options import parse_options, to_options

    provider, _ = reader()
    config = Config(
        app="a", dynamodb_table="state", meter_provider=provider, tracer_provider=TracerProvider()
    )
    options = to_options(config, ["orders"])
    assert not {"meter_provider", "tracer_provider"} & set(options)
    parsed = parse_options(options).config  # the executors' config, from the strings
    assert parsed.replace(handoff_timeout=config.handoff_timeout) == config
    assert parsed.tracer_provider is None and parsed.meter_provider is None
