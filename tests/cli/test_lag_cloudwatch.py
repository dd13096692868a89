"""``kinesumer lag --serve --cloudwatch-namespace``: the lag published to CloudWatch after each
good probe (:mod:`kinesumer.cli.lag_cloudwatch`), read back with ListMetrics and
GetMetricStatistics from moto in server mode; a failing publish is logged and counted, and the
server goes on."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from support.group import create_stream, make_config, put, setup_table
from support.lag_service import LagService
from support.standins import NodeStandIn, find_free_port
from support.wait import wait_until

from kinesumer import Config, ConfigError
from kinesumer.cli.lag_board import LagBoard, Snapshot
from kinesumer.cli.lag_cloudwatch import METRIC_NAME, UNIT, CloudWatchPublisher
from kinesumer.cli.lag_metrics import lag_registry, render_metrics
from kinesumer.cli.lag_serve import ProbeLoop
from kinesumer.core.lag import GroupLag, ShardLag

Names = Callable[[str], str]
REGION = "us-east-1"


def config(app: str = "orders-etl") -> Config:
    return Config(app=app, dynamodb_table="kinesumer-state", region=REGION)


def snapshot(app: str = "orders-etl", *, at_ms: int | None = None) -> Snapshot:
    rows = [
        ShardLag("orders", "shardId-000000000000", None, None, 42_000),
        ShardLag("orders", "shardId-000000000001", "m-1", None, 1_000),
        ShardLag("refunds", "shardId-000000000000", "m-1", None, 7_000),
    ]
    figure = GroupLag.of(app, "kinesumer-state", rows)
    probed = at_ms if at_ms is not None else int(time.time() * 1000)
    return Snapshot(figure, (), probed, 0.1)


def cloudwatch(url: str) -> Any:
    return boto3.client("cloudwatch", region_name=REGION, endpoint_url=url)


def maximum(client: Any, namespace: str, dimensions: dict[str, str]) -> float | None:
    """The largest datapoint of the metric with exactly ``dimensions`` over the last hour."""
    now = datetime.now(timezone.utc)
    answer = client.get_metric_statistics(
        Namespace=namespace,
        MetricName=METRIC_NAME,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
        Unit=UNIT,
    )
    points = answer["Datapoints"]
    return max(p["Maximum"] for p in points) if points else None


def listed(client: Any, namespace: str) -> set[frozenset[tuple[str, str]]]:
    metrics = client.list_metrics(Namespace=namespace, MetricName=METRIC_NAME)["Metrics"]
    return {frozenset((d["Name"], d["Value"]) for d in m["Dimensions"]) for m in metrics}


def test_a_probe_is_published_per_group_and_per_stream(moto_url: str) -> None:
    publisher = CloudWatchPublisher("Kinesumer/Test", config(), endpoint=moto_url)
    publisher(snapshot())
    assert (publisher.published, publisher.failed) == (1, 0)

    client = cloudwatch(moto_url)
    assert listed(client, "Kinesumer/Test") == {
        frozenset({("App", "orders-etl")}),
        frozenset({("App", "orders-etl"), ("Stream", "orders")}),
        frozenset({("App", "orders-etl"), ("Stream", "refunds")}),
    }
    assert maximum(client, "Kinesumer/Test", {"App": "orders-etl"}) == 42_000
    assert maximum(client, "Kinesumer/Test", {"App": "orders-etl", "Stream": "orders"}) == 42_000
    assert maximum(client, "Kinesumer/Test", {"App": "orders-etl", "Stream": "refunds"}) == 7_000


def test_a_failing_publish_is_logged_and_counted_and_the_probes_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"http://127.0.0.1:{find_free_port()}"  # nothing listens there
    publisher = CloudWatchPublisher("Kinesumer/Test", config(), endpoint=dead)
    board = LagBoard("orders-etl", "kinesumer-state", interval=1)
    registry = lag_registry(board)
    registry.register(publisher)

    class Probe:
        calls = 0

        async def __call__(self) -> Snapshot:
            Probe.calls += 1
            return snapshot()

        async def aclose(self) -> None:
            pass

    def broken(_: Snapshot) -> None:
        raise RuntimeError("a listener that fails")

    loop = ProbeLoop(board, Probe(), 1, listeners=[publisher, broken])

    async def twice() -> None:
        await loop.probe_once()
        await loop.probe_once()

    with caplog.at_level(logging.WARNING):
        asyncio.run(twice())
    assert Probe.calls == 2 and board.reading(int(time.time() * 1000)).successes == 2
    assert (publisher.published, publisher.failed) == (0, 2)
    assert publisher.last_error is not None and "EndpointConnectionError" in publisher.last_error
    assert "publishing the lag to CloudWatch failed" in caplog.text
    assert "a lag listener failed" in caplog.text
    text = render_metrics(registry).decode()
    assert 'kinesumer_lag_cloudwatch_publishes_total{app="orders-etl",result="error"} 2.0' in text
    assert 'kinesumer_lag_cloudwatch_publishes_total{app="orders-etl",result="ok"} 0.0' in text


@pytest.mark.parametrize(
    ("namespace", "endpoint", "says"),
    [
        ("", None, "a CloudWatch namespace"),
        ("AWS/Kinesis", None, "AWS's own"),
        ("Kinesumer", "http://cloudwatch.example.com", "plain HTTP to another machine"),
    ],
)
def test_a_bad_namespace_or_endpoint_is_refused_before_serving(
    namespace: str, endpoint: str | None, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        CloudWatchPublisher(namespace, config(), endpoint=endpoint)


def test_the_server_publishes_after_each_good_probe(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, moto_url: str, unique_name: Names
) -> None:
    """``kinesumer lag --serve --cloudwatch-namespace`` as a user runs it: records nobody read,
    and the group's lag shows in CloudWatch (moto) with the figure /lag.json serves."""
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("cw")
    setup_table(make_config(kinesalite.url, dynalite.url, app, table))
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 3)
    where = [
        *("--app", app, "--table", table, "--region", REGION),
        *("--dynamodb-endpoint", dynalite.url, "--kinesis-endpoint", kinesalite.url),
    ]
    extra = ["--stream", stream, "--interval", "1", "--cloudwatch-namespace", "Kinesumer/E2E"]
    service = LagService(where, *extra, "--cloudwatch-endpoint", moto_url)
    client = cloudwatch(moto_url)
    try:
        wait_until(
            lambda: 'result="ok"} 2.0' in service.get("/metrics")[1].decode(),
            60,
            "two publishes",
        )
        served = service.json("/lag.json")
    finally:
        assert service.stop(signal.SIGINT) == 0, service.proc.errors
    assert served["max_millis_behind"] > 0
    assert listed(client, "Kinesumer/E2E") == {
        frozenset({("App", app)}),
        frozenset({("App", app), ("Stream", stream)}),
    }
    group = maximum(client, "Kinesumer/E2E", {"App": app})
    assert group is not None and group > 0  # records nobody read: behind, and growing
    assert maximum(client, "Kinesumer/E2E", {"App": app, "Stream": stream}) == group


def test_cloudwatch_options_need_serve_and_a_namespace(moto_url: str) -> None:
    from kinesumer.cli import main

    base = ["lag", "--app", "a-app", "--table", "a-table", "--region", REGION]
    assert main([*base, "--cloudwatch-namespace", "NS"]) == 2
    assert main([*base, "--serve", "--port", "0", "--cloudwatch-endpoint", moto_url]) == 2
