"""The streaming source without Spark: options, the offset codec, and the planner with its
executor reads and ledger on kinesalite + dynalite, driven by a stand-in member
(:mod:`support.spark_fakes`), so each step is checked by itself."""

from __future__ import annotations

import asyncio
import pickle
from datetime import datetime, timezone
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember

from kinesumer import ConfigError
from kinesumer.models import Position
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.ledger import Ledger, LedgerEntry
from kinesumer.spark.source.offsets import SourceOffset, Start
from kinesumer.spark.source.options import (
    SOURCE_HANDOFF_TIMEOUT,
    SourceOptions,
    parse_options,
    to_options,
)
from kinesumer.statestore.dynamodb import DynamoDBStateStore

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
        ({**BASE, "ledger_ttl_seconds": "1"}, "ledger_ttl_seconds"),
        ({**BASE, "streams": "a,not a stream!"}, "streams"),
        ({**BASE, "broadcast": "true"}, "broadcast"),
    ],
)
def test_each_bad_option_is_a_config_error_naming_it(options: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_options(options)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_handoff_timeout_defaults_to_cover_a_batch_unless_given() -> None:
    assert SOURCE_HANDOFF_TIMEOUT >= 60
    assert parse_options(BASE).config.handoff_timeout == SOURCE_HANDOFF_TIMEOUT
    assert parse_options({**BASE, "handoff_timeout": "7"}).config.handoff_timeout == 7.0
    assert parse_options({**BASE, "Handoff_Timeout": "5"}).config.handoff_timeout == 5.0


def test_to_options_round_trips_a_config() -> None:
    config = make_config(
        "http://127.0.0.1:1", "http://127.0.0.1:2", "app1", "table1", scan_limit=77
    ).replace(initial_position=datetime(2026, 1, 1, tzinfo=timezone.utc))
    strings = to_options(config, ["s2", "s1"], max_records_per_trigger=10)
    assert all(isinstance(v, str) for v in strings.values())
    parsed = parse_options(strings)
    assert parsed.config == config and parsed.streams == ("s1", "s2")
    # handoff_timeout left at Config's default: the source's larger default instead.
    default = parse_options(to_options(config.replace(handoff_timeout=5.0), ["s1"])).config
    assert default == config.replace(handoff_timeout=SOURCE_HANDOFF_TIMEOUT)
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


def new_planner(
    setup: dict[str, Any], hidden: set[tuple[str, str]] | None = None, **source: Any
) -> tuple[Planner, list[SoloMember]]:
    """A planner, not joined yet, and the members it made (each hiding ``hidden``)."""
    options = SourceOptions(config=setup["config"], streams=(setup["stream"],), **source)
    members: list[SoloMember] = []

    def factory(config: Any) -> SoloMember:
        members.append(SoloMember(config, hidden=set(hidden or ())))
        return members[-1]

    return Planner(options, factory), members  # type: ignore[arg-type]


def planner_for(setup: dict[str, Any], **source: Any) -> tuple[Planner, SoloMember]:
    planner, members = new_planner(setup, **source)
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

    from kinesumer.aws import AwsClients, RequestStats

    config = setup["config"]
    seq = "49590338271490256608559692538361571095921575989136588898"

    async def scenario() -> tuple[Any, Any, int, dict[Any, Any]]:
        clients = AwsClients(config, RequestStats())
        await clients.open()
        try:
            store = DynamoDBStateStore(
                clients.dynamodb, config.dynamodb_table, config.app, RequestStats()
            )
            ledger = Ledger(store, "q", 60)
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
    from kinesumer.aws import AwsClients, RequestStats
    from kinesumer.spark import ReplayMismatchError

    put(setup["url"], setup["stream"], 0, 10)
    planner, _ = planner_for(setup)
    try:
        first = planner.latest_offset(origin(planner), None)
        partition = planner.partitions(first)[0]
        config = setup["config"]
        beyond = Position("9" * 56, 0)  # more records than the shard holds (trimmed, say)

        async def record() -> None:
            clients = AwsClients(config, RequestStats())
            await clients.open()
            try:
                store = DynamoDBStateStore(
                    clients.dynamodb, config.dynamodb_table, config.app, RequestStats()
                )
                ledger = Ledger(store, partition.query, 60)
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


# -- review findings ----------------------------------------------------------------------------
def shard_names(offset: dict[str, Any]) -> set[str]:
    return set(offset["shards"])


def write_ledger(config: Any, query: str, entries: list[LedgerEntry]) -> None:
    from kinesumer.aws import AwsClients, RequestStats

    async def scenario() -> None:
        clients = AwsClients(config, RequestStats())
        await clients.open()
        try:
            store = DynamoDBStateStore(
                clients.dynamodb, config.dynamodb_table, config.app, RequestStats()
            )
            ledger = Ledger(store, query, 600)
            for entry in entries:
                await ledger.record(entry)
        finally:
            await clients.close()

    asyncio.run(scenario())


def test_available_now_ends_when_a_batch_is_never_read(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 20)
    planner, member = planner_for(setup)
    try:
        planner.prepare_available_now()
        offset = planner.latest_offset(origin(planner), None)
        assert offset["batch"] == 1
        for _ in range(2):  # a foreachBatch that ignores df: no reads, no ledger items
            following = planner.latest_offset(offset, None)
            if following == offset:
                break
            offset = following
        else:
            pytest.fail("availableNow plans unread batches again and again")
        assert member.closed  # the run ended: the member left
    finally:
        planner.close()


def test_an_unread_batch_waits_for_the_idle_cadence(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 20)
    planner, _ = planner_for(setup, idle_poll_interval=60.0)
    try:
        first = planner.latest_offset(origin(planner), None)
        assert planner.latest_offset(first, None) == first  # no reads: no new batch at once
        assert planner.latest_offset(first, None) == first
    finally:
        planner.close()


def test_a_restart_adopts_a_shard_that_shows_up_late(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 40)
    before, _ = planner_for(setup, max_records_per_shard=5)
    first = before.latest_offset(origin(before), None)
    read_all(before, first)  # batch 1 ran; the query then died before settling it
    ledger = before.io.batch(1)
    before.close()
    late = sorted(ledger)[1]
    late_name = "/".join(late)

    planner, members = new_planner(setup, hidden={late}, max_records_per_shard=5)
    try:
        second = planner.latest_offset(first, None)  # the restart: `late` is not readable yet
        assert second["batch"] == 2 and late_name not in shard_names(second)
        read_all(planner, second)
        member = members[0]
        member.hidden.clear()  # claimed a tick later
        third = planner.latest_offset(second, None)
        end = ledger[late].end
        assert end is not None
        assert member.positions[late] == end  # batch 1's end adopted, not lost
        assert third["shards"][late_name]["after"] == end.sequence_number
        assert member.calls.count(("complete", late, end, False)) == 1
    finally:
        planner.close()


def test_commit_after_available_now_does_not_rejoin(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 10)
    planner, members = new_planner(setup)
    planner.initial_offset()
    try:
        planner.prepare_available_now()
        first = planner.latest_offset(origin(planner), None)
        read_all(planner, first)
        assert planner.latest_offset(first, None) == first  # the run ends, the member leaves
        assert members[0].closed
        planner.commit(first)
        assert len(members) == 1 and [c for c in members[0].calls if c[0] == "start"] == [
            ("start", (setup["stream"],))
        ]
    finally:
        planner.close()


def test_available_now_drains_a_closed_shard_to_its_end(setup: dict[str, Any]) -> None:
    import boto3

    url, stream = setup["url"], setup["stream"]
    put(url, stream, 0, 20)
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    shards = client.list_shards(StreamName=stream)["Shards"]
    parent = shards[0]
    low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=parent["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = client.get_records(ShardIterator=iterator, Limit=1000)["Records"]
    assert records
    last = Position(records[-1]["SequenceNumber"], 0)

    planner, member = planner_for(setup)
    try:
        planner.prepare_available_now()
        first = planner.latest_offset(origin(planner), None)
        assert "/".join((stream, parent["ShardId"])) in shard_names(first)
        # The executor read the parent's records and stopped at the first empty answer
        # (caught up), before the closed shard said SHARD_END.
        write_ledger(
            setup["config"],
            first["query"],
            [
                LedgerEntry(1, stream, shard_id, last if shard_id == parent["ShardId"] else None,
                            len(records) if shard_id == parent["ShardId"] else 0, True, False)
                for _, shard_id in (tuple(k.split("/", 1)) for k in first["shards"])
            ],
        )  # fmt: skip
        second = planner.latest_offset(first, None)
        assert second != first, "availableNow ended with a closed parent not drained"
        assert "/".join((stream, parent["ShardId"])) in shard_names(second)
        read_all(planner, second)
        assert planner.io.batch(2)[(stream, parent["ShardId"])].shard_end
        third = planner.latest_offset(second, None)  # the parent finished: its children follow
        assert (stream, parent["ShardId"]) in member.finished
        assert len(shard_names(third) - shard_names(first)) == 2
    finally:
        planner.close()


def test_a_bound_below_the_shard_count_rotates_shards(setup: dict[str, Any]) -> None:
    put(setup["url"], setup["stream"], 0, 40)
    planner, _ = planner_for(setup, max_records_per_trigger=1)
    try:
        offset, seen = origin(planner), []
        for _ in range(4):
            offset = planner.latest_offset(offset, None)
            assert sum(offset["limits"].values()) <= 1
            assert len(read_all(planner, offset)) == 1
            seen.append(sorted(offset["shards"]))
            planner.commit(offset)
        assert seen[0] != seen[1] and seen[0] == seen[2] and seen[1] == seen[3]
        assert len(planner.settlement.settled) <= 1  # pruned on commit
        assert len(planner.settlement.planned_here) <= 1
    finally:
        planner.close()


def test_rotation_reads_every_record_once(setup: dict[str, Any]) -> None:
    produced = put(setup["url"], setup["stream"], 0, 12)
    planner, _ = planner_for(setup, max_records_per_trigger=1, idle_poll_interval=0.2)
    try:
        planner.prepare_available_now()
        offset, got = origin(planner), []
        for _ in range(40):
            following = planner.latest_offset(offset, None)
            if following == offset:
                break
            offset = following
            got.extend(read_all(planner, offset))
        else:
            pytest.fail("availableNow did not end")
        assert sorted(r.data for r in got) == sorted(produced)
    finally:
        planner.close()


def test_remove_member_keeps_a_member_that_heartbeats(setup: dict[str, Any]) -> None:
    import boto3

    from kinesumer.spark.source.driver.driverio import DriverIO
    from kinesumer.statestore.dynamodb.codecs import client_key

    config = setup["config"]
    db = boto3.client("dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1")
    key = client_key(config.app, "old-1")
    db.put_item(TableName=config.dynamodb_table, Item={**key, "last_update": {"N": "1000"}})
    io = DriverIO(config, "q", 3600, config.app)
    try:
        seen = io.member_last_update("old-1")
        assert seen == 1000
        db.put_item(TableName=config.dynamodb_table, Item={**key, "last_update": {"N": "2000"}})
        assert not io.delete_member("old-1", seen)  # it heartbeated since: alive, kept
        assert "Item" in db.get_item(TableName=config.dynamodb_table, Key=key)
        assert io.remove_member("old-1")  # unchanged since read: deleted
        assert "Item" not in db.get_item(TableName=config.dynamodb_table, Key=key)
        assert not io.remove_member("old-1")
    finally:
        io.close()


def test_a_restart_before_the_first_commit_joins_the_querys_own_group(
    setup: dict[str, Any],
) -> None:
    """A crash after offsets/0 was written but before its commit: at the restart Spark calls
    initialOffset() again (no committed offset to start batch 0 from), which mints a fresh id,
    then latestOffset(offsets/0). The member must end in the group of the id in offsets/0 (the
    one the checkpoint carries), not in that of the fresh, throw-away id."""
    put(setup["url"], setup["stream"], 0, 10)
    before, _ = planner_for(setup)
    try:
        first = before.latest_offset(origin(before), None)
        read_all(before, first)
    finally:
        before.close()
    after, members = new_planner(setup)
    try:
        after.initial_offset()  # Spark's replay of batch 0 asks for its start again
        after.latest_offset(first, None)
        app = setup["config"].app
        assert members[-1].config.app == f"{app}.spark-{first['query']}"
        assert all(m.closed for m in members[:-1])  # the throw-away id's member left
    finally:
        after.close()


def test_a_checkpoint_from_before_groups_per_query_keeps_the_apps_group(
    setup: dict[str, Any],
) -> None:
    """Offsets written before groups per query have no "group": their query read in the app's
    group (its claims, checkpoints, pins are there), and keeps doing so, resuming exactly."""
    put(setup["url"], setup["stream"], 0, 10)
    before, _ = planner_for(setup, shared_group=True)
    try:
        first = before.latest_offset(origin(before), None)
        assert len(read_all(before, first)) == 10
    finally:
        before.close()
    first.pop("group", None)  # as the code before this change wrote it
    more = put(setup["url"], setup["stream"], 10, 6)
    after, members = new_planner(setup)  # the default now: shared_group=false
    try:
        second = after.latest_offset(first, None)
        assert [m.config.app for m in members] == [setup["config"].app]
        assert second["group"] == setup["config"].app
        assert sorted(r.data for r in read_all(after, second)) == sorted(more)
    finally:
        after.close()


def test_spark_asking_for_the_initial_offset_again_gets_the_same_query(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until batch 0 commits, Spark asks initialOffset() again for its start: the reader answers
    with the same query (one id, one group), so a new query does not join a group, plan in it,
    then leave it after a handoff wait (handoff_timeout, 30 s) for a second id's group."""
    import atexit
    import signal

    from kinesumer.spark.source.datasource import KinesumerStreamReader

    minted: list[dict[str, Any]] = []

    def mint(planner: Planner) -> dict[str, Any]:
        minted.append({"query": f"q{len(minted)}", "batch": 0})
        return minted[-1]

    monkeypatch.setattr(Planner, "initial_offset", mint)
    sigterm = signal.getsignal(signal.SIGTERM)
    reader = KinesumerStreamReader(SourceOptions(config=setup["config"], streams=("s",)))
    try:
        assert reader.initialOffset() == reader.initialOffset() == {"query": "q0", "batch": 0}
        assert len(minted) == 1
    finally:  # the reader's exit hooks belong to a source worker, not to this test process
        atexit.unregister(reader.stop)
        signal.signal(signal.SIGTERM, sigterm)
