"""The streaming source without Spark: options, the offset codec, and the planner with its
executor reads and ledger on kinesalite + dynalite, driven by a stand-in member
(:mod:`_spark_fakes`), so each step is checked by itself."""

from __future__ import annotations

import asyncio
import pickle
from datetime import datetime, timezone
from typing import Any

import pytest
from _group import create_stream, make_config, put, setup_table
from _spark_fakes import SoloMember

from kinesumer import ConfigError
from kinesumer.models import Position
from kinesumer.spark.source.executor import read_records
from kinesumer.spark.source.ledger import Ledger, LedgerEntry
from kinesumer.spark.source.offsets import SourceOffset, Start
from kinesumer.spark.source.options import SourceOptions, parse_options, to_options
from kinesumer.spark.source.planner import Planner

BASE = {"app": "orders", "dynamodb_table": "state-table", "streams": "a,b"}


# -- options ------------------------------------------------------------------------------------
def test_options_parse_config_fields_and_source_options_case_insensitively() -> None:
    parsed = parse_options(
        {
            **BASE,
            "Scan_Interval": "0.5",
            "SCAN_LIMIT": "500",
            "auto_commit": "false",
            "initial_position": "trim_horizon",
            "metrics_port": "none",
            "max_records_per_trigger": "1000",
            "idle_poll_interval": "2",
        }
    )
    assert parsed.streams == ("a", "b")
    assert parsed.config.scan_interval == 0.5 and parsed.config.scan_limit == 500
    assert parsed.config.auto_commit is False and parsed.config.initial_position == "TRIM_HORIZON"
    assert parsed.max_records_per_trigger == 1000 and parsed.idle_poll_interval == 2.0
    when = parse_options({**BASE, "initial_position": "2026-01-02T03:04:05Z"})
    assert when.config.initial_position == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"dynamodb_table": "t1x", "streams": "s"}, "app"),
        ({"app": "a", "streams": "s"}, "dynamodb_table"),
        ({"app": "a", "dynamodb_table": "t1x"}, "streams"),
        ({**BASE, "colour": "blue"}, "colour"),
        ({**BASE, "scan_limit": "many"}, "scan_limit"),
        ({**BASE, "scan_interval": "0.01"}, "scan_interval"),
        ({**BASE, "auto_commit": "perhaps"}, "auto_commit"),
        ({**BASE, "initial_position": "yesterday"}, "initial_position"),
        ({**BASE, "max_records_per_trigger": "0"}, "max_records_per_trigger"),
        ({**BASE, "idle_poll_interval": "x"}, "idle_poll_interval"),
        ({**BASE, "streams": "a,not a stream!"}, "streams"),
    ],
)
def test_each_bad_option_is_a_config_error_naming_it(options: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_options(options)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_to_options_round_trips_a_config() -> None:
    config = make_config(
        "http://127.0.0.1:1", "http://127.0.0.1:2", "app1", "table1", scan_limit=77
    ).replace(initial_position=datetime(2026, 1, 1, tzinfo=timezone.utc))
    strings = to_options(config, ["s2", "s1"], max_records_per_trigger=10)
    assert all(isinstance(v, str) for v in strings.values())
    parsed = parse_options(strings)
    assert parsed.config == config and parsed.streams == ("s1", "s2")
    assert parsed.max_records_per_trigger == 10
    with pytest.raises(ConfigError, match="nonsense"):
        to_options(config, ["s1"], nonsense=1)


# -- offsets ------------------------------------------------------------------------------------
def test_offsets_round_trip_through_json_with_long_sequence_numbers() -> None:
    seq = "49590338271490256608559692538361571095921575989136588898"
    offset = SourceOffset(
        query="q1",
        batch=7,
        owner="me",
        shards={
            ("s", "shardId-000000000000"): Start(after=Position(seq, 3), lease=2),
            ("s", "shardId-000000000001"): Start(at="TRIM_HORIZON", lease=1),
            ("t", "shardId-000000000000"): Start(at_timestamp_ms=1767225600000),
        },
        limits={("s", "shardId-000000000000"): 500},
    )
    import json

    text = json.dumps(offset.to_json())
    assert seq in text  # a string, never a float
    assert SourceOffset.from_json(json.loads(text)) == offset


# -- planner, executor and ledger on kinesalite + dynalite --------------------------------------
@pytest.fixture
def setup(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    return {"config": config, "stream": stream, "url": kinesalite.url}


def planner_for(setup: dict[str, Any], **source: Any) -> tuple[Planner, SoloMember]:
    options = SourceOptions(config=setup["config"], streams=(setup["stream"],), **source)
    members: list[SoloMember] = []

    def factory(config: Any) -> SoloMember:
        members.append(SoloMember(config))
        return members[-1]

    planner = Planner(options, factory)  # type: ignore[arg-type]
    planner.initial_offset()
    return planner, members[0]


def origin(planner: Planner) -> dict[str, Any]:
    """What initialOffset() returned: batch 0, no shards."""
    return SourceOffset(planner.query or "", 0).to_json()


def read_all(planner: Planner, end: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for partition in planner.partitions(end):
        pickle.loads(pickle.dumps(partition))  # executors get a pickled copy
        out.extend(asyncio.run(read_records(partition)))
    return out


def test_planner_reads_everything_then_waits_for_new_records(setup: dict[str, Any]) -> None:
    produced = put(setup["url"], setup["stream"], 0, 40)
    planner, member = planner_for(setup, idle_poll_interval=0.2)
    try:
        first = planner.latest_offset(origin(planner), None)
        assert first["batch"] == 1 and len(first["shards"]) == 2
        assert [c[0] for c in member.calls].count("begin") == 2
        got = read_all(planner, first)
        assert sorted(r.data for r in got) == sorted(produced)
        # Caught up, nothing new: the same offset comes back (no empty batch) ...
        assert planner.latest_offset(first, None) == first
        assert [c[0] for c in member.calls].count("complete") == 2  # batch 1 settled once
        assert planner.latest_offset(first, None) == first
        # ... until a probe finds new records.
        more = put(setup["url"], setup["stream"], 40, 10)
        second = None
        for _ in range(50):
            second = planner.latest_offset(first, None)
            if second != first:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert second is not None and second["batch"] == 2
        assert all("after" in s for s in second["shards"].values())
        assert sorted(r.data for r in read_all(planner, second)) == sorted(more)
        planner.commit(second)
    finally:
        planner.close()


def test_a_replay_reads_exactly_the_recorded_range(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 30)
    planner, _ = planner_for(setup, max_records_per_shard=5)
    try:
        first = planner.latest_offset(origin(planner), None)
        original = read_all(planner, first)
        assert len(original) == 10  # 5 per shard: the limit
        put(setup["url"], setup["stream"], 30, 30)
        assert read_all(planner, first) == original  # a retry: the same records
        second = planner.latest_offset(first, None)
        got = read_all(planner, second)
        assert not {r.sequence_number for r in got} & {r.sequence_number for r in original}
    finally:
        planner.close()


def test_admission_control_splits_max_rows_across_shards(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 50)
    planner, _ = planner_for(setup, max_records_per_trigger=8)
    try:
        first = planner.latest_offset(
            origin(planner), 6
        )  # Spark's ReadMaxRows(6) is the tighter bound
        assert set(first["limits"].values()) == {3}
        assert len(read_all(planner, first)) == 6
    finally:
        planner.close()


def test_a_losing_attempt_returns_the_winners_range(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 20)
    planner, _ = planner_for(setup)
    try:
        first = planner.latest_offset(origin(planner), None)
        partition = planner.partitions(first)[0]
        # Another attempt recorded a shorter range first: this one must return exactly that.
        winner = asyncio.run(
            read_records(partition.__class__(**{**partition.__dict__, "limit": 2}))
        )
        assert len(winner) == 2
        assert asyncio.run(read_records(partition)) == winner
    finally:
        planner.close()


def test_ledger_keeps_sequence_numbers_as_strings_and_cleans_up(
    setup: dict[str, Any], dynalite: Any
) -> None:
    import boto3

    from kinesumer.aws import AwsClients, RetryStats

    config = setup["config"]
    seq = "49590338271490256608559692538361571095921575989136588898"

    async def scenario() -> tuple[Any, Any, int, dict[Any, Any]]:
        clients = AwsClients(config, RetryStats())
        await clients.open()
        try:
            ledger = Ledger(
                clients.dynamodb, config.dynamodb_table, config.app, "q", RetryStats(), 60
            )
            for batch in (1, 2, 3):
                entry = LedgerEntry(batch, "s", "shard-1", Position(seq, 1), 4, True, False)
                assert await ledger.record(entry) == entry
            other = LedgerEntry(2, "s", "shard-1", None, 0, True, False)
            held = await ledger.record(other)  # the first write wins
            deleted = await ledger.delete_before(3)
            return held, await ledger.get(1, "s", "shard-1"), deleted, await ledger.batch(3)
        finally:
            await clients.close()

    held, gone, deleted, left = asyncio.run(scenario())
    assert held.end == Position(seq, 1) and held.count == 4
    assert gone is None and deleted == 2 and list(left) == [("s", "shard-1")]
    raw = boto3.client("dynamodb", endpoint_url=dynalite.url, region_name="us-east-1").scan(
        TableName=config.dynamodb_table
    )["Items"]
    ledger_items = [i for i in raw if i["pk"]["S"].startswith("spark_ledger#")]
    assert ledger_items[0]["end_sequence_number"] == {"S": seq}
    assert "expires_at" in ledger_items[0]


def test_the_reader_pickles_without_its_runtime_state(setup: dict[str, Any]) -> None:
    from kinesumer.spark.source.datasource import KinesumerStreamReader

    options = SourceOptions(config=setup["config"], streams=(setup["stream"],))
    reader = KinesumerStreamReader(options)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == options


def test_a_replay_that_cannot_find_its_records_is_a_named_error(setup: dict[str, Any]) -> None:
    from kinesumer.aws import AwsClients, RetryStats
    from kinesumer.spark import ReplayMismatchError

    put(setup["url"], setup["stream"], 0, 10)
    planner, _ = planner_for(setup)
    try:
        first = planner.latest_offset(origin(planner), None)
        partition = planner.partitions(first)[0]
        config = setup["config"]
        beyond = Position("9" * 56, 0)  # more records than the shard holds (trimmed, say)

        async def record() -> None:
            clients = AwsClients(config, RetryStats())
            await clients.open()
            try:
                ledger = Ledger(
                    clients.dynamodb, config.dynamodb_table, config.app, partition.query,
                    RetryStats(), 60,
                )  # fmt: skip
                entry = LedgerEntry(
                    partition.batch, partition.stream, partition.shard_id, beyond, 99, True, False
                )
                await ledger.record(entry)
            finally:
                await clients.close()

        asyncio.run(record())
        with pytest.raises(ReplayMismatchError, match="99 records"):
            asyncio.run(read_records(partition))
    finally:
        planner.close()
