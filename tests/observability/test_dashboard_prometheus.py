"""Every query of the Grafana dashboard (dashboards/kinesumer.json) returns series from a real
Prometheus (Debian's ``prometheus``) that scrapes a running group member and the lag service.

tests/observability/test_dashboard.py checks the queries' names and labels against what the
library exports; this runs them. A group of two member processes (tests/support/metrics_member.py)
with their Prometheus endpoints on, on kinesalite and dynalite: the first produces into the
stream and consumes it (some records fail its handler and are discarded; a KPL-lookalike record
that is no aggregate arrives; an unreadable client item sits in the table), the second joins
later and the first hands it a shard; and ``kinesumer lag --serve``: all scraped every second.
Each panel query and each variable's query, its template variables set to the test's app and
stream, goes to ``/api/v1/query`` until it returns a series (bounded polling: a rate needs two
scrapes). The few that cannot at a healthy polling group on the stand-ins are in
:data:`NEVER_AT_A_RUNNING_MEMBER` with the reason; the test checks that each of them is still a
query of the dashboard and still returns nothing, so the list stays minimal.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aws_kinesis_agg
import boto3
from support.cli import Running
from support.group import create_stream, kinesis, make_config, setup_table
from support.lag_service import LagService
from support.prometheus import Prometheus, prometheus  # noqa: F401 (the fixture)
from support.standins import NodeStandIn, find_free_port, repo_root
from support.wait import wait_until

DASHBOARD = repo_root() / "dashboards" / "kinesumer.json"
MEMBER = Path(__file__).resolve().parents[1] / "support" / "metrics_member.py"

#: Grafana's built-in interval variables, as a dashboard over a few minutes sets them.
INTERVALS = {"$__rate_interval": "1m", "$__interval": "5s", "$__range": "5m"}

#: Seconds until every query returns series: scrapes every second, rates over a minute; the
#: member starts, claims and reads within seconds, much more on a loaded machine.
SERIES_TIMEOUT = 180.0

_EFO = "the member polls (kinesalite has no enhanced fan-out): no subscription is made"
_PRODUCE_ERRORS = "kinesalite accepts every put of the member's producer: no failure, no retry"
_OUTBOX = "no outbox relay runs (it needs PostgreSQL); tests/outbox pins its series"

#: Dashboard queries (after substitution of the variables) that never return series at a
#: running member here, and why. Each must still be on the dashboard and still return nothing.
NEVER_AT_A_RUNNING_MEMBER: dict[str, str] = {
    'sum by (service, operation) (rate(kinesumer_throttles_total{app=~"APP"}[1m]))': (
        "the stand-ins never refuse a request for throughput"
    ),
    'sum by (stream) (rate(kinesumer_checkpoint_conflicts_total{app=~"APP", stream=~"STREAM"}'
    "[1m]))": "one member owns every shard: no other member's claim refuses its checkpoint",
    'sum by (stream, shard_id) (increase(kinesumer_efo_subscriptions_total{app=~"APP", '
    'stream=~"STREAM"}[5m]))': _EFO,
    'sum by (stream, error) (rate(kinesumer_efo_subscription_failures_total{app=~"APP", '
    'stream=~"STREAM"}[1m]))': _EFO,
    'sum by (stream, shard_id) (increase(kinesumer_efo_stalls_total{app=~"APP", '
    'stream=~"STREAM"}[5m]))': _EFO,
    'sum by (stream, error) (rate(kinesumer_produce_failures_total{app=~"APP", '
    'stream=~"STREAM"}[1m]))': _PRODUCE_ERRORS,
    'sum by (stream) (rate(kinesumer_produce_retries_total{app=~"APP", stream=~"STREAM"}[1m]))': (
        _PRODUCE_ERRORS
    ),
    'sum by (stream) (rate(kinesumer_produce_throttled_entries_total{app=~"APP", '
    'stream=~"STREAM"}[1m]))': _PRODUCE_ERRORS,
    'sum by (stream) (rate(kinesumer_outbox_relayed_total{app=~"APP", stream=~"STREAM"}[1m]))': (
        _OUTBOX
    ),
    'sum by (stream) (rate(kinesumer_outbox_moved_aside_total{app=~"APP", '
    'stream=~"STREAM"}[1m]))': _OUTBOX,
    'max by (client_id) (kinesumer_outbox_pending{app=~"APP"})': _OUTBOX,
    'max by (client_id) (kinesumer_outbox_oldest_pending_seconds{app=~"APP"})': _OUTBOX,
}


def dashboard_queries(app: str, stream: str) -> list[str]:
    """Every panel target's ``expr`` (collapsed rows' panels too) and every query variable's
    query as PromQL (``label_values(selector, label)`` is Grafana's: its selector), with the
    template variables set."""
    dashboard = json.loads(DASHBOARD.read_text())
    found: list[str] = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        found.extend(target["expr"] for target in panel.get("targets", []) if "expr" in target)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            found.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text))
    values = {"$app": app, "$stream": stream, "${app}": app, "${stream}": stream, **INTERVALS}
    out = []
    for expr in found:
        for name, value in sorted(values.items(), key=lambda item: -len(item[0])):
            expr = expr.replace(name, value)
        assert "$" not in expr, f"a template variable the test does not set: {expr}"
        out.append(expr)
    return out


def listed(expr: str, app: str, stream: str) -> str:
    """``expr`` as :data:`NEVER_AT_A_RUNNING_MEMBER` spells it (names are per test)."""
    return expr.replace(app, "APP").replace(stream, "STREAM")


def put_unaggregated(url: str, stream: str) -> None:
    """A record with the KPL's magic and a correct MD5 around a body that is no aggregate:
    delivered as it came and counted (``kinesumer_unaggregated_records_total``)."""
    body = b"\xff\xff\xff\xff"
    data = aws_kinesis_agg.MAGIC + body + hashlib.md5(body).digest()
    kinesis(url).put_record(StreamName=stream, Data=data, PartitionKey="kpl-lookalike")


def put_unreadable_client(url: str, table: str, app: str) -> None:
    """A client item whose heartbeat is no number, as another app could write it: skipped by
    the member and counted (``kinesumer_corrupt_state_items_total{kind="client"}``)."""
    client = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")
    item = {"pk": {"S": f"client#{app}"}, "sk": {"S": "0-intruder"}, "last_update": {"S": "soon"}}
    client.put_item(TableName=table, Item=item)


def test_every_dashboard_query_returns_series_from_a_real_prometheus(
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
    prometheus: Callable[[dict[str, str]], Prometheus],  # noqa: F811
) -> None:
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("orders")
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", n) for n in (app, stream))  # as regex: itself
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    create_stream(kinesalite.url, stream, 2)
    put_unaggregated(kinesalite.url, stream)
    put_unreadable_client(dynalite.url, table, app)

    ports = {"member-1": find_free_port(), "member-2": find_free_port()}
    members: dict[str, Running] = {}

    def start_member(client_id: str, *extra: str) -> None:
        argv = [sys.executable, str(MEMBER), "--app", app, "--table", table]
        argv += ["--kinesis", kinesalite.url, "--dynamodb", dynalite.url, "--client-id", client_id]
        argv += ["--metrics-port", str(ports[client_id]), *extra, stream]
        running = members[client_id] = Running(argv)
        running.wait_for(lambda: "serving metrics" in running.output, 60, f"{client_id}'s endpoint")

    def owned(client_id: str) -> float:
        found = server.query(f'kinesumer_owned_shards{{app="{app}", client_id="{client_id}"}}')
        return float(found[0]["value"][1]) if found else -1.0

    def logs() -> str:
        return "\n".join(f"{c}:\n{m.errors[-3000:]}" for c, m in members.items())

    service: LagService | None = None
    try:
        start_member("member-1")
        where = ["--app", app, "--table", table, "--region", "us-east-1"]
        where += ["--dynamodb-endpoint", dynalite.url, "--kinesis-endpoint", kinesalite.url]
        service = LagService(where, "--stream", stream, "--interval", "1")
        targets = {c: f"127.0.0.1:{port}" for c, port in ports.items()}
        server = prometheus({**targets, "lag": f"127.0.0.1:{service.port}"})
        # member-1 takes both shards; member-2 joins, and member-1 hands one shard over
        # gracefully (kinesumer_handoff_seconds, kinesumer_rebalances_total).
        wait_until(lambda: owned("member-1") == 2, 120, "member-1 owning both shards", logs)
        start_member("member-2", "--no-produce")
        wait_until(
            lambda: owned("member-1") == 1 and owned("member-2") == 1, 120, "a shard each", logs
        )
        wait_until(
            lambda: set(server.targets_up().values()) == {"up"},
            60,
            "every target scraped",
            lambda: f"targets: {server.targets_up()}\n{logs()}",
        )
        # The lag service's own series arrive too (its document is what KEDA scales on).
        wait_until(
            lambda: bool(server.query(f'kinesumer_group_lag_seconds{{app="{app}"}}')),
            60,
            "the lag service's group lag in Prometheus",
        )

        queries = dashboard_queries(app, stream)
        listed_queries = {listed(q, app, stream) for q in queries}
        assert set(NEVER_AT_A_RUNNING_MEMBER) <= listed_queries, (
            "allowlisted but not on the dashboard: "
            f"{sorted(set(NEVER_AT_A_RUNNING_MEMBER) - listed_queries)}"
        )
        pending = [q for q in queries if listed(q, app, stream) not in NEVER_AT_A_RUNNING_MEMBER]
        deadline = time.monotonic() + SERIES_TIMEOUT
        while pending and time.monotonic() < deadline:
            pending = [q for q in pending if not server.query(q)]
            if pending:
                time.sleep(1)
        assert all(m.proc.poll() is None for m in members.values()), f"a member exited:\n{logs()}"
        assert pending == [], f"no series within {SERIES_TIMEOUT:g}s for:\n" + "\n".join(pending)

        returning = [q for q in queries if listed(q, app, stream) in NEVER_AT_A_RUNNING_MEMBER]
        returning = [q for q in returning if server.query(q)]
        assert returning == [], "allowlisted but returning series: " + "\n".join(returning)
        checked = len(queries) - len(NEVER_AT_A_RUNNING_MEMBER)
        print(f"{len(queries)} queries: {checked} with series, the rest listed without")
    finally:
        if service is not None:
            service.stop(signal.SIGTERM)
        for running in reversed(members.values()):
            if running.proc.poll() is None:
                running.send_signal(signal.SIGTERM)
                try:
                    running.wait(30)
                finally:
                    running.stop()
