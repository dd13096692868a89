"""Observability: Prometheus metrics scraped over HTTP from a consuming member (kinesalite +
dynalite behind fault proxies, so throttles are real answers on the wire), the request and
capacity accounting behind them, and the 1 KB client item that keeps heartbeats at one write
unit."""

from __future__ import annotations

import asyncio
import socket
import sys
import urllib.request
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support.faultproxy import Fault
from support.group import create_stream, put
from support.wait import eventually

from kinesumer import AsyncKinesumer, Config, ConfigError, MetricsNotInstalledError, Record
from kinesumer.group.checkpointer import Checkpointer
from kinesumer.models import Checkpoint, ClientInfo, Position
from kinesumer.observability.metrics import PrometheusMetrics
from kinesumer.read.engine import Engine
from kinesumer.read.progress import ShardLease, shard_lease
from kinesumer.statestore.dynamodb.store import CLIENT_ITEM_BUDGET, client_item
from kinesumer.statestore.schema import item_size

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def series(samples: Samples, name: str, **labels: str) -> list[dict[str, str]]:
    wanted = set(labels.items())
    return [dict(ls) for (n, ls), _ in samples.items() if n == name and wanted <= ls]


async def test_a_member_exposes_its_metrics_over_http(proxied: dict[str, Any]) -> None:
    url, stream = proxied["url"], proxied["stream"]
    create_stream(url, stream, 2)
    produced = put(url, stream, 0, 120)
    port = free_port()
    config: Config = proxied["config"].replace(
        metrics_port=port, metrics_address="127.0.0.1", client_id="m1"
    )
    # Throttle a share of GetRecords on the wire: counted as throttles, retried, nothing lost.
    rule = proxied["kinesis"].add_rule(Fault.throttle(), operation="GetRecords", rate=0.3, seed=7)
    consumer = AsyncKinesumer(config)
    got: list[Record] = []

    async def run() -> None:
        async for record in consumer.consume([stream]):
            got.append(record)

    task = asyncio.create_task(run())
    await eventually(lambda: len(got) == len(produced), what="every record")
    await consumer.commit()
    await eventually(lambda: rule.fired > 0, what="a throttled GetRecords")
    mine = {"app": config.app, "client_id": "m1"}
    samples = await asyncio.to_thread(scrape, port)

    assert total(samples, "kinesumer_records_total", **mine) == len(produced)
    assert total(samples, "kinesumer_bytes_total", **mine) == sum(len(d) for d in produced)
    assert {s["shard_id"] for s in series(samples, "kinesumer_records_total", **mine)} == {
        "shardId-000000000000",
        "shardId-000000000001",
    }
    behind = series(samples, "kinesumer_millis_behind_latest", **mine, stream=stream)
    assert len(behind) == 2
    assert total(samples, "kinesumer_owned_shards", **mine) == 2
    assert total(samples, "kinesumer_leader", **mine) == 1
    assert total(samples, "kinesumer_rebalances_total", **mine) >= 1
    assert total(samples, "kinesumer_checkpoint_writes_total", **mine, stream=stream) >= 2
    assert total(samples, "kinesumer_checkpoint_conflicts_total", **mine) == 0
    ok_reads = total(
        samples, "kinesumer_aws_requests_total", **mine, operation="GetRecords", outcome="ok"
    )
    assert ok_reads > 0
    throttled = total(samples, "kinesumer_throttles_total", **mine, operation="GetRecords")
    assert throttled >= rule.fired > 0  # every refusal the proxy sent was seen
    assert (
        total(
            samples,
            "kinesumer_aws_requests_total",
            **mine,
            operation="GetRecords",
            outcome="ProvisionedThroughputExceededException",
        )
        == throttled
    )
    latency = total(samples, "kinesumer_aws_request_seconds_count", **mine, operation="GetRecords")
    assert latency == ok_reads + throttled
    # Heartbeats (the thread's boto3 client) and claims count too, with their capacity.
    assert total(samples, "kinesumer_aws_requests_total", **mine, operation="PutItem") > 0
    assert total(samples, "kinesumer_dynamodb_consumed_capacity_total", **mine) > 0
    stats = consumer.stats()
    assert stats.throttles["kinesis:GetRecords"] == throttled
    assert stats.requests["dynamodb:PutItem"] > 0
    assert stats.dynamodb_capacity["PutItem"] > 0

    rule.remove()
    await consumer.aclose()
    await asyncio.wait_for(task, 10)
    samples = await asyncio.to_thread(scrape, port)
    # Handoffs timed; the member's gauges and per-shard series gone with it.
    assert total(samples, "kinesumer_handoff_seconds_count", **mine) == 2
    assert series(samples, "kinesumer_owned_shards", **mine) == []
    assert series(samples, "kinesumer_millis_behind_latest", **mine) == []
    assert series(samples, "kinesumer_records_total", **mine) == []


async def test_refused_checkpoint_write_counts_as_a_conflict() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics("app", "c1", registry)

    class RefusingStore:
        async def write_checkpoint(self, *args: Any, **kwargs: Any) -> bool:
            return False

    lost: list[ShardLease] = []
    checkpointer = Checkpointer(RefusingStore(), "c1", on_lost=lost.append, metrics=metrics)  # type: ignore[arg-type]
    lease = shard_lease(Checkpoint("s", "shard-1", owner="c1", lease=1))
    lease.progress.mark_processed(Position("1", 0))
    assert await checkpointer.write(lease) is False
    assert lost == [lease]
    labels = {"app": "app", "client_id": "c1", "stream": "s"}
    assert registry.get_sample_value("kinesumer_checkpoint_conflicts_total", labels) == 1
    assert registry.get_sample_value("kinesumer_checkpoint_writes_total", labels) is None


def test_metrics_without_the_extra_is_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    config = Config(app="a", dynamodb_table="table", metrics=True)
    with pytest.raises(MetricsNotInstalledError, match=r"kinesumer\[metrics\]"):
        AsyncKinesumer(config)
    Engine(config.replace(metrics=False))  # off (the default): prometheus_client not needed


def test_a_busy_metrics_port_names_the_field() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = Config(app="a", dynamodb_table="table", metrics_port=port)
        with pytest.raises(ConfigError, match="metrics_port"):
            AsyncKinesumer(config.replace(metrics_address="127.0.0.1"))


@pytest.mark.parametrize(
    "field, value",
    [("metrics", "yes"), ("metrics_port", 0), ("metrics_port", 70000), ("metrics_address", "")],
)
def test_metrics_fields_are_checked(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        Config(app="a", dynamodb_table="table", **{field: value})


owned_maps = st.dictionaries(
    st.from_regex(r"[a-z0-9-]{1,60}/shardId-0000000[0-9]{5}", fullmatch=True),
    st.integers(min_value=-1, max_value=10**9),
    max_size=400,
)


@settings(max_examples=200, deadline=None)
@given(owned=owned_maps, streams=st.integers(min_value=1, max_value=4))
def test_client_item_stays_within_one_write_unit(owned: dict[str, int], streams: int) -> None:
    info = ClientInfo(
        client_id="host-12345-abcdef",
        last_update_ms=1_700_000_000_000,
        streams=frozenset(f"stream-name-{i}" for i in range(streams)),
        host="ip-10-0-0-1.eu-west-1.compute.internal",
        pid=12345,
        version="0.1.0",
        owned=owned,
    )
    item = client_item("orders-etl", info, 3600)
    assert item_size(item) <= CLIENT_ITEM_BUDGET
    kept = {k: int(v["N"]) for k, v in item["owned"]["M"].items()}
    assert item["owned_count"] == {"N": str(len(owned))}
    assert kept.items() <= owned.items()
    if len(kept) < len(owned):  # what was left out lags no more than what was kept
        dropped = [lag for key, lag in owned.items() if key not in kept]
        assert max(dropped) <= min(kept.values(), default=max(dropped))


def test_item_size_matches_what_dynamodb_bills(dynalite: Any) -> None:
    """dynalite bills writes as DynamoDB does (1 unit per started KB): a client item for 20,000
    shards is at most one unit, and our size estimate is never below the billed size."""
    db = boto3.client("dynamodb", endpoint_url=dynalite.url, region_name="us-east-1")
    config = Config(app="a", dynamodb_table="sizes-table", dynamodb_endpoint=dynalite.url)
    from kinesumer import create_state_table

    create_state_table(config)
    owned = {f"orders/shardId-{i:012d}": i for i in range(20_000)}
    info = ClientInfo("c1", 1_700_000_000_000, frozenset({"orders"}), "h", 1, "0.1.0", owned)
    item = client_item("a", info, 3600)
    response = db.put_item(TableName="sizes-table", Item=item, ReturnConsumedCapacity="TOTAL")
    assert response["ConsumedCapacity"]["CapacityUnits"] == 1.0
    for size in (900, 1100, 5000):
        blob = {"pk": {"S": "x"}, "sk": {"S": str(size)}, "data": {"B": b"x" * size}}
        response = db.put_item(TableName="sizes-table", Item=blob, ReturnConsumedCapacity="TOTAL")
        billed_kb = response["ConsumedCapacity"]["CapacityUnits"]
        assert billed_kb == -(-item_size(blob) // 1024)
