"""``kinesumer lag --serve`` as a child process on kinesalite and dynalite: what it serves for a
real group's table and stream, that a failing probe keeps the last good figures (stale) without
stopping the server, and that SIGTERM stops it cleanly even where SIGINT is ignored.

No assertion races a timer: every wait polls the server's own documents with a bound."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import boto3
from prometheus_client.parser import text_string_to_metric_families
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.lag_service import LagService, checkpoint, heartbeat_ahead
from support.standins import NodeStandIn
from support.wait import wait_until

Names = Callable[[str], str]


def samples(service: LagService) -> dict[str, list[Any]]:
    code, body = service.get("/metrics")
    assert code == 200
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_the_service_serves_the_groups_lag_and_keeps_it_stale_when_probes_fail(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names
) -> None:
    """Two shards: one checkpointed at its last record by a live owner (lag 0), one never
    read (the age of its oldest record). Then the table is deleted: probes fail, the figures
    stay, marked stale, and the server answers on until SIGTERM, which it obeys although it
    was started with SIGINT ignored (as ``cmd &`` in a script starts it)."""
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("orders")
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 40)
    client = kinesis(kinesalite.url)
    shards = sorted(s["ShardId"] for s in client.list_shards(StreamName=stream)["Shards"])
    read, unread = shards
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=read, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    last = client.get_records(ShardIterator=iterator)["Records"][-1]["SequenceNumber"]
    asyncio.run(checkpoint(config, stream, read, last, owner="member-1"))
    asyncio.run(heartbeat_ahead(config, "member-1", frozenset({stream})))
    where = ["--app", app, "--table", table, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", dynalite.url, "--kinesis-endpoint", kinesalite.url]

    service = LagService(where, "--stream", stream, "--interval", "1", sigint_ignored=True)
    try:
        wait_until(lambda: service.get("/lag.json")[0] == 200, 60, "a first good probe")
        lag = service.json("/lag.json")
        rows = {row["shard_id"]: row for row in lag["shards"]}
        assert set(rows) == {read, unread}
        assert (rows[read]["owner"], rows[read]["checkpoint"]) == ("member-1", last)
        assert rows[read]["millis_behind"] == 0
        assert (rows[unread]["owner"], rows[unread]["checkpoint"]) == (None, None)
        assert lag["max_millis_behind"] == rows[unread]["millis_behind"]
        assert lag["max_seconds_behind"] == lag["max_millis_behind"] / 1000
        assert lag["stale"] is False

        # The figure grows while nobody reads (probes every second; Kinesis's Date is per
        # second): wait for a later probe's larger figure.
        first = lag["max_millis_behind"]
        wait_until(
            lambda: service.json("/lag.json")["max_millis_behind"] > first, 60, "a larger lag"
        )
        found = samples(service)
        (group,) = found["kinesumer_group_lag_seconds"]
        assert group.labels == {"app": app} and group.value > 0
        per_shard = {s.labels["shard_id"]: s.value for s in found["kinesumer_shard_lag_seconds"]}
        assert per_shard[read] == 0 and per_shard[unread] > 0
        owners = {
            s.labels["shard_id"]: s.labels["owner"] for s in found["kinesumer_shard_owner_info"]
        }
        assert owners == {read: "member-1", unread: ""}
        (live,) = found["kinesumer_group_live_members"]
        assert live.value == 1
        status = service.json("/status.json")
        assert [(m["client_id"], m["live"], m["leader"]) for m in status["members"]] == [
            ("member-1", True, True)
        ]
        assert status["members"][0]["shards"] == [f"{stream}/{read}"]
        assert len(status["history"]["times"]) >= 2

        # The table goes: every probe fails from now on.
        boto3.client("dynamodb", endpoint_url=dynalite.url, region_name="us-east-1").delete_table(
            TableName=table
        )
        wait_until(lambda: service.json("/lag.json")["stale"], 60, "stale figures")
        stale = service.json("/lag.json")
        assert stale["probes"]["failed"] >= 1 and "does not exist" in stale["probes"]["last_error"]
        assert {row["shard_id"] for row in stale["shards"]} == {read, unread}  # kept
        found = samples(service)
        assert found["kinesumer_lag_stale"][0].value == 1
        failures = {s.labels["result"]: s.value for s in found["kinesumer_lag_probes_total"]}
        assert failures["error"] >= 1 and failures["ok"] >= 2
        assert found["kinesumer_group_lag_seconds"][0].value > 0  # the last good figure
        assert service.get("/healthz")[0] == 200
    finally:
        code = service.stop(signal.SIGTERM)
    assert code == 0, service.proc.errors
    assert "stopped" in service.proc.output
