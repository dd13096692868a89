"""The source at ``initial_position=LATEST`` (the default): once a shard was opened at LATEST, no
later read of it starts later than that moment. The planner with its executor reads and ledger
on kinesalite + dynalite, driven by the stand-in member of :mod:`support.spark_fakes`.

Kinesalite's AT_TIMESTAMP never answers when no record of the shard arrived at or after the
instant (STANDINS.md), so every read here has records after its start. The records put before
the query first opens the shards must not be read (they came before LATEST); a pin is Kinesis's
``Date`` minus ``SERVER_CLOCK_MARGIN_MS`` (it may read that much earlier, never later), and
botocore sends AT_TIMESTAMP in whole seconds, hence the pause of the margin and over a second
between them and the pins.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from datetime import datetime, timezone
from typing import Any

import boto3
import pytest
from support.faultproxy import FaultProxy
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember

from kinesumer.kinesis.reader import SERVER_CLOCK_MARGIN_MS
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions


@pytest.fixture
def latest(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    config = make_config(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"),
        initial_position="LATEST",
    )  # fmt: skip
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 10)  # before LATEST: never read
    time.sleep(SERVER_CLOCK_MARGIN_MS / 1000 + 1.1)
    return {"config": config, "stream": stream, "url": kinesalite.url}


def new_run(
    latest: dict[str, Any], shared: bool = False, **member: Any
) -> tuple[Planner, list[SoloMember]]:
    """A run of a new query (an empty checkpoint folder) with a member of its own; ``shared``:
    in the app's group (``shared_group``), else in a group of its own (the default)."""
    options = SourceOptions(
        config=latest["config"], streams=(latest["stream"],), shared_group=shared
    )
    members: list[SoloMember] = []

    def factory(config: Any) -> SoloMember:
        members.append(SoloMember(config, **member))
        return members[-1]

    planner = Planner(options, factory)  # type: ignore[arg-type]
    planner.initial_offset()
    return planner, members


def first_batch(planner: Planner) -> dict[str, Any]:
    offset = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
    assert offset["batch"] == 1 and len(offset["shards"]) == 2
    assert all("at_timestamp" in s for s in offset["shards"].values())  # LATEST, pinned
    return offset


def read_all(planner: Planner, end: dict[str, Any]) -> list[bytes]:
    out: list[bytes] = []
    for partition in planner.partitions(end):
        records = asyncio.run(read_records(pickle.loads(pickle.dumps(partition))))
        out.extend(r.data for r in records)
    return sorted(out)


def test_records_put_between_the_plan_and_a_retried_read_are_all_read(
    latest: dict[str, Any],
) -> None:
    planner, _ = new_run(latest)
    try:
        first = first_batch(planner)
        time.sleep(0.05)
        new = put(latest["url"], latest["stream"], 10, 20)  # after the plan, before the read
        assert read_all(planner, first) == sorted(new)
        assert read_all(planner, first) == sorted(new)  # a retried task: the same records
    finally:
        planner.close()


def test_in_the_apps_group_a_new_query_reads_from_where_the_first_opened_the_shards_at_latest(
    latest: dict[str, Any],
) -> None:
    before, _ = new_run(latest, shared=True)
    first_batch(before)  # the shards opened at LATEST; the driver died before any read
    before.close()
    time.sleep(0.05)
    new = put(latest["url"], latest["stream"], 10, 20)  # while no query runs
    time.sleep(1.1)
    after, members = new_run(latest, shared=True)  # a new, empty checkpoint folder
    try:
        second = first_batch(after)
        assert members[0].positions == {}  # the group has no checkpoint for them
        late = put(latest["url"], latest["stream"], 30, 4)  # after the new run's own "now"
        assert read_all(after, second) == sorted(new + late)
    finally:
        after.close()


def test_a_shard_a_plain_member_began_at_latest_is_read_from_there(
    latest: dict[str, Any],
) -> None:
    # A plain member opened the shards at LATEST here (Kinesis's clock less the margin) ...
    began = int(time.time() * 1000) - SERVER_CLOCK_MARGIN_MS
    time.sleep(0.05)
    new = put(latest["url"], latest["stream"], 10, 20)  # ... and left before processing these
    time.sleep(1.1)
    client = boto3.client("kinesis", endpoint_url=latest["url"], region_name="us-east-1")
    shards = client.list_shards(StreamName=latest["stream"])["Shards"]
    planner, _ = new_run(
        latest, shared=True, started={(latest["stream"], s["ShardId"]): began for s in shards}
    )
    try:
        first = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
        assert {s["at_timestamp"] for s in first["shards"].values()} == {began}
        late = put(latest["url"], latest["stream"], 30, 4)  # after the planner's own "now"
        assert read_all(planner, first) == sorted(new + late)
    finally:
        planner.close()


@pytest.mark.parametrize("position", ["TRIM_HORIZON", "AT_TIMESTAMP"])
def test_a_query_at_another_initial_position_reads_from_the_groups_recorded_start(
    latest: dict[str, Any], position: str
) -> None:
    """The recorded start wins over the query's own initial position, as it does for plain and
    fan-out members (and as the member's WARNING says): at TRIM_HORIZON the query would read
    again what the group read before, at an AT_TIMESTAMP after the start it would skip what the
    first reader never processed."""
    began = int(time.time() * 1000) - SERVER_CLOCK_MARGIN_MS  # a plain member opened LATEST
    time.sleep(0.05)
    new = put(latest["url"], latest["stream"], 10, 20)  # ... and left before processing these
    time.sleep(1.1)
    after_them = datetime.now(timezone.utc)
    client = boto3.client("kinesis", endpoint_url=latest["url"], region_name="us-east-1")
    shards = client.list_shards(StreamName=latest["stream"])["Shards"]
    initial = "TRIM_HORIZON" if position == "TRIM_HORIZON" else after_them
    latest["config"] = latest["config"].replace(initial_position=initial)
    planner, _ = new_run(
        latest, shared=True, started={(latest["stream"], s["ShardId"]): began for s in shards}
    )
    try:
        first = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
        assert {s.get("at_timestamp") for s in first["shards"].values()} == {began}
        late = put(latest["url"], latest["stream"], 30, 4)
        assert read_all(planner, first) == sorted(new + late)
    finally:
        planner.close()


def test_a_driver_clock_running_ahead_pins_latest_at_aws_time(
    latest: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner's host clock runs 30 s ahead of AWS's: a LATEST pin taken from it would
    skip every record of the next 30 s (kinesalite refuses a timestamp in its future)."""
    from kinesumer.spark.source.driver import planner as planner_module

    class Ahead:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def time(self) -> float:
            return time.time() + 30.0

    monkeypatch.setattr(planner_module, "time", Ahead())
    planner, _ = new_run(latest)
    try:
        first = first_batch(planner)
        assert all(s["at_timestamp"] <= time.time() * 1000 for s in first["shards"].values())
        time.sleep(0.05)
        new = put(latest["url"], latest["stream"], 10, 20)
        assert read_all(planner, first) == sorted(new)
    finally:
        planner.close()


@pytest.mark.parametrize("ahead", [60.0, -60.0], ids=["dynamodb-ahead", "dynamodb-behind"])
def test_a_pin_is_kinesis_time_less_the_margin_whatever_dynamodbs_clock_says(
    latest: dict[str, Any], ahead: float
) -> None:
    """The pin follows the rule of every LATEST start in the group: the ``Date`` of Kinesis's
    answer less ``SERVER_CLOCK_MARGIN_MS``, not DynamoDB's ``Date``. With DynamoDB's clock a
    minute ahead a pin from it would skip a minute of records; a minute behind, it would read a
    minute of records from before LATEST."""
    proxy = FaultProxy(latest["config"].dynamodb_endpoint)
    proxy.date_offset = ahead
    try:
        config = latest["config"].replace(dynamodb_endpoint=proxy.url)
        planner, _ = new_run({**latest, "config": config})
        try:
            kinesis_now = time.time() * 1000
            first = first_batch(planner)
            for shard in first["shards"].values():
                assert kinesis_now - SERVER_CLOCK_MARGIN_MS - 1000 <= shard["at_timestamp"]
                assert shard["at_timestamp"] <= time.time() * 1000 - SERVER_CLOCK_MARGIN_MS
            time.sleep(0.05)
            new = put(latest["url"], latest["stream"], 10, 20)
            assert read_all(planner, first) == sorted(new)
        finally:
            planner.close()
    finally:
        proxy.stop()
