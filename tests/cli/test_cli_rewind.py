"""``kinesumer checkpoints rewind`` (and :func:`kinesumer.admin.rewind_stream`) on kinesalite and
dynalite, with a member running.

Timing: kinesalite runs on this host, so its arrival stamps are on this host's clock. The
boundary instant is chosen after the first group's last arrival (read back from kinesalite) and
the second group is put only once this host's clock passed it; the test then checks, from the
stamps read back, that every record of the second group arrived at or after the instant and
every record of the first before it. No assertion depends on how long anything took: a member
is awaited (bounded waits, 60 s against an expected bound of ``commit_interval`` = 0.5 s plus a
claim) until it delivered what the test expects, and a sentinel record put afterwards, delivered
last, shows nothing else came in between.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from support.group import (
    Member,
    create_stream,
    kinesis,
    make_config,
    put,
    setup_table,
    split_in_two,
    state_store,
)
from support.standins import NodeStandIn
from support.wait import eventually, wait_until

from kinesumer import Config, Record, RewindConflictError, cli
from kinesumer.admin import rewind_stream
from kinesumer.aws import AwsClients, RequestStats
from kinesumer.cli import options
from kinesumer.core.rewind import RewindTarget
from kinesumer.models import Checkpoint, Position
from kinesumer.statestore import DynamoDBStateStore

Names = Callable[[str], str]

#: Bound of every wait for a member (expected: well under 5 s even on a loaded machine).
WAIT = 60.0


@pytest.fixture
def group(kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names) -> dict[str, Any]:
    app, table = unique_name("app"), unique_name("state")
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    where = ["--app", app, "--table", table, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", dynalite.url, "--kinesis-endpoint", kinesalite.url]
    stream = unique_name("stream")
    return {"config": config, "where": where, "url": kinesalite.url, "stream": stream}


def arrivals(url: str, stream: str) -> dict[bytes, tuple[str, float]]:
    """Every record's data -> (shard id, arrival in epoch ms), read back from kinesalite."""
    client = kinesis(url)
    found = {}
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for r in client.get_records(ShardIterator=iterator, Limit=10_000)["Records"]:
            found[r["Data"]] = (
                shard["ShardId"],
                r["ApproximateArrivalTimestamp"].timestamp() * 1e3,
            )
    return found


def boundary_after(url: str, stream: str) -> int:
    """An instant (epoch ms) after every record the stream holds, once this host's clock (which
    stamps kinesalite's arrivals) is past it: what is put from now on arrives at or after it."""
    instant = int(max(ms for _, ms in arrivals(url, stream).values())) + 1
    wait_until(lambda: time.time() * 1000 > instant + 1, 10, "the clock to pass the boundary")
    return instant


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def items(config: Config, stream: str) -> list[dict[str, Any]]:
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name=config.region
    )
    return sorted(
        client.query(
            TableName=config.dynamodb_table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
            ConsistentRead=True,
        )["Items"],
        key=lambda item: item["sk"]["S"],
    )


def rewind(g: dict[str, Any], capsys: pytest.CaptureFixture[str], *how: str) -> tuple[int, str]:
    try:
        code = cli.main(["checkpoints", "rewind", *g["where"], "--stream", g["stream"], *how])
    except SystemExit as exc:  # argparse's refusal of an option value
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out + err


def after(sink: list[tuple[str, Record]], start: int) -> list[Record]:
    return [r for _, r in sink[start:]]


def in_shard_order(records: list[Record]) -> bool:
    """Each shard's records in ascending sequence order (numbers compared as numbers)."""
    last: dict[str, int] = {}
    for r in records:
        number = int(r.sequence_number)
        if number <= last.get(r.shard_id, -1):
            return False
        last[r.shard_id] = number
    return True


async def delivered(sink: list[tuple[str, Record]], start: int, wanted: set[bytes]) -> None:
    await eventually(
        lambda: wanted <= {r.data for r in after(sink, start)},
        WAIT,
        f"{len(wanted)} records delivered",
        lambda: f"got {sorted(r.data for r in after(sink, start))}",
    )


async def reclaimed(config: Config, stream: str, client_id: str) -> None:
    """Until ``client_id`` claimed every shard again after a rewind (which left each without
    an owner: an owner named now claimed it since)."""
    await eventually(
        lambda: all(item.get("owner", {}).get("S") == client_id for item in items(config, stream)),
        WAIT,
        "the shards claimed again",
        interval=0.1,
    )


async def test_a_rewind_to_a_time_makes_a_running_member_deliver_exactly_the_records_since(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two time groups on two shards, read by a running member whose shards then go idle (no
    checkpoint write pending: the lease check finds the move). After the rewind to the instant
    between them it delivers the second group again, in shard order, nothing of the first, and
    then a sentinel put after the rewind."""
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 2)
    first = set(put(url, stream, 0, 20))
    instant = boundary_after(url, stream)
    second = set(put(url, stream, 100, 20))
    stamps = arrivals(url, stream)
    assert all(stamps[d][1] < instant for d in first)
    assert all(stamps[d][1] >= instant for d in second)
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink).start()
    try:
        await delivered(sink, 0, first | second)
        await eventually(member.flushed, WAIT, "the member's checkpoints flushed")
        start = len(sink)
        code, out = await asyncio.to_thread(rewind, g, capsys, "--to-time", iso(instant))
        assert code == 0, out
        assert "moved" in out
        await delivered(sink, start, second)
        sentinel = set(put(url, stream, 500, 1))
        await delivered(sink, start, second | sentinel)
        again = after(sink, start)
        assert sorted(r.data for r in again) == sorted(second | sentinel)  # none twice, none old
        assert in_shard_order(again)
        assert again[-1].data in sentinel or {r.data for r in again[-2:]} & sentinel
        assert member.error is None
    finally:
        await member.close()


async def test_a_rewind_before_a_split_reopens_the_parent_and_restarts_the_children(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Parent: records before and after the instant; then a split and records in the children.
    Rewound to the instant, the member delivers the parent's later records, then the
    children's, none lost, nothing from before the instant; parents before children."""
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 1)
    early = set(put(url, stream, 0, 10))
    instant = boundary_after(url, stream)
    late = set(put(url, stream, 100, 10))
    parent = split_in_two(url, stream)
    children_records = set(put(url, stream, 200, 20))
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink).start()
    try:
        await delivered(sink, 0, early | late | children_records)
        await eventually(member.flushed, WAIT, "the member's checkpoints flushed")
        start = len(sink)
        code, out = await asyncio.to_thread(rewind, g, capsys, "--to-time", iso(instant), "--json")
        assert code == 0, out
        document = json.loads(out)
        rows = {row["shard_id"]: row for row in document["shards"]}
        assert document["shards"][0]["shard_id"] == parent  # ancestors first
        assert rows[parent]["old"]["finished"] and not rows[parent]["new"]["finished"]
        assert all(row["new"]["started_at"] == iso(instant) for row in rows.values())
        await delivered(sink, start, late | children_records)
        sentinel = set(put(url, stream, 500, 1))
        await delivered(sink, start, late | children_records | sentinel)
        again = after(sink, start)
        assert sorted(r.data for r in again) == sorted(late | children_records | sentinel)
        assert in_shard_order(again)
        last_of_parent = max(i for i, r in enumerate(again) if r.shard_id == parent)
        first_of_child = min(i for i, r in enumerate(again) if r.shard_id != parent)
        assert last_of_parent < first_of_child
    finally:
        await member.close()


async def test_trim_horizon_replays_everything_and_latest_skips_to_what_comes_next(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 2)
    records = set(put(url, stream, 0, 30))
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink).start()
    try:
        await delivered(sink, 0, records)
        start = len(sink)
        code, out = await asyncio.to_thread(rewind, g, capsys, "--to", "trim-horizon")
        assert code == 0, out
        assert "from the oldest record" in out
        await delivered(sink, start, records)
        assert sorted(r.data for r in after(sink, start)) == sorted(records)
        await eventually(member.flushed, WAIT, "the member's checkpoints flushed")
        start = len(sink)
        code, out = await asyncio.to_thread(rewind, g, capsys, "--to", "latest")
        assert code == 0, out
        # Records put before the member saw the move would be delivered twice (once under the
        # old lease, once after it): at-least-once. The test waits until it claimed again.
        await reclaimed(config, stream, member.client_id)
        sentinel = set(put(url, stream, 500, 5))
        await delivered(sink, start, sentinel)
        assert sorted(r.data for r in after(sink, start)) == sorted(sentinel)
    finally:
        await member.close()


def test_a_dry_run_prints_the_moves_and_writes_nothing(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 2)
    put(url, stream, 0, 10)
    instant = boundary_after(url, stream)
    asyncio.run(_read_all(config, stream, 10))
    before = items(config, stream)
    assert len(before) == 2
    code, out = rewind(g, capsys, "--to-time", iso(instant), "--dry-run")
    assert code == 0, out
    assert "dry run: nothing written" in out and "to move" in out
    assert f"from {iso(instant)}" in out
    code, out = rewind(g, capsys, "--to-time", iso(instant), "--dry-run", "--json")
    assert code == 0, out
    document = json.loads(out)
    assert document["dry_run"] is True
    assert [row["moved"] for row in document["shards"]] == [False, False]
    assert all(row["old"]["sequence_number"] for row in document["shards"])
    assert items(config, stream) == before


async def _read_all(config: Config, stream: str, count: int) -> None:
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink).start()
    try:
        await eventually(lambda: len(sink) >= count, WAIT, f"{count} records")
        await eventually(member.flushed, WAIT, "the checkpoints flushed")
    finally:
        await member.close()


class RacingStore(DynamoDBStateStore):
    """A store whose every rewind write is preceded, ``races`` times, by a member's claim of the
    same shard (through another store): the rewind's item as read is then stale."""

    def __init__(self, client: Any, config: Config, intruder: DynamoDBStateStore, races: int):
        super().__init__(client, config.dynamodb_table, config.app, RequestStats())
        self.intruder = intruder
        self.races = races
        self.attempts = 0

    async def rewind_checkpoint(
        self, stream: str, shard_id: str, seen: Checkpoint | None, target: RewindTarget
    ) -> bool:
        self.attempts += 1
        if self.races:
            self.races -= 1
            current = (await self.intruder.get_checkpoints(stream, [shard_id])).get(shard_id)
            owner = f"intruder-{self.attempts}"
            assert await self.intruder.claim(stream, shard_id, owner, current) is not None
        return await super().rewind_checkpoint(stream, shard_id, seen, target)


async def _rewind_racing(config: Config, stream: str, races: int) -> tuple[RacingStore, Any]:
    aws = AwsClients(config, RequestStats())
    await aws.open()
    try:
        async with state_store(config) as intruder:
            store = RacingStore(aws.dynamodb, config, intruder, races)
            try:
                result = await rewind_stream(config, stream, to="trim-horizon", state=store)
            except RewindConflictError as exc:
                return store, exc
            return store, result
    finally:
        await aws.close()


def test_a_racing_claim_makes_the_rewind_read_again_and_retry(group: dict[str, Any]) -> None:
    g, config = group, group["config"]
    create_stream(g["url"], g["stream"], 1)
    put(g["url"], g["stream"], 0, 3)
    asyncio.run(_read_all(config, g["stream"], 3))
    store, result = asyncio.run(_rewind_racing(config, g["stream"], races=2))
    assert not isinstance(result, Exception)
    assert store.attempts == 3 and len(result.moved) == 1
    (item,) = items(config, g["stream"])
    assert "owner" not in item and item["started_at"]["N"] == "0"
    assert "sequence_number" not in item


def test_a_shard_that_keeps_changing_stops_the_rewind_without_overwriting(
    group: dict[str, Any],
) -> None:
    """Every attempt meets a fresh claim: the rewind fails with a named error that says what
    moved and what did not, and the last claim stands."""
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 1)
    put(url, stream, 0, 3)
    asyncio.run(_read_all(config, stream, 3))
    (shard_id,) = [s["ShardId"] for s in kinesis(url).list_shards(StreamName=stream)["Shards"]]
    store, error = asyncio.run(_rewind_racing(config, stream, races=100))
    assert isinstance(error, RewindConflictError)
    assert error.moved == () and error.not_moved == (shard_id,)
    assert shard_id in str(error) and "nothing was overwritten" in str(error)
    (item,) = items(config, stream)
    assert item["owner"]["S"] == f"intruder-{store.attempts}"
    assert "sequence_number" in item and "started_at" not in item


def test_bad_input_is_a_named_error_with_the_usual_exit_code(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    g = group
    create_stream(g["url"], g["stream"], 1)
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    code, out = rewind(g, capsys, "--to-time", future.isoformat())
    assert code == 2 and "--to-time" in out and "in the future" in out
    code, out = rewind(g, capsys, "--by-duration", "an hour")
    assert code == 2 and "duration" in out
    code, out = rewind(g, capsys, "--to-time", "yesterday")
    assert code == 2 and "ISO 8601" in out
    code, out = rewind(g, capsys, "--to", "sideways")
    assert code == 2
    code, out = rewind(g, capsys)  # no target at all
    assert code == 2
    g_other = {**g, "stream": g["stream"] + "-missing"}
    code, out = rewind(g_other, capsys, "--by-duration", "1h")
    assert code == 1 and "does not exist" in out
    assert items(g["config"], g["stream"]) == []


class ReshardingStore(DynamoDBStateStore):
    """A store through which the rewind reads the table while, at its first read of the
    stream's checkpoints, the stream's only shard splits and a member claims a child (through
    another store): a reshard landing between the rewind's ListShards and its table reads."""

    def __init__(self, client: Any, config: Config, intruder: DynamoDBStateStore, url: str):
        super().__init__(client, config.dynamodb_table, config.app, RequestStats())
        self.intruder = intruder
        self.url = url
        self.children: list[str] = []

    async def get_checkpoints(self, stream: str, shard_ids: Any = None) -> dict[str, Checkpoint]:
        if shard_ids is None and not self.children:
            parent = await asyncio.to_thread(split_in_two, self.url, stream)
            listed = (await asyncio.to_thread(kinesis(self.url).list_shards, StreamName=stream))[
                "Shards"
            ]
            self.children = sorted(s["ShardId"] for s in listed if s["ShardId"] != parent)
            claimed = await self.intruder.claim(stream, self.children[0], "member-1", None)
            assert claimed is not None
        return await super().get_checkpoints(stream, shard_ids)


async def _rewind_during_a_split(config: Config, url: str, stream: str) -> ReshardingStore:
    aws = AwsClients(config, RequestStats())
    await aws.open()
    try:
        async with state_store(config) as intruder:
            store = ReshardingStore(aws.dynamodb, config, intruder, url)
            await rewind_stream(config, stream, to="trim-horizon", state=store)
            return store
    finally:
        await aws.close()


def test_a_child_born_while_the_rewind_reads_is_not_taken_for_an_aged_out_shard(
    group: dict[str, Any],
) -> None:
    """A split lands, and a member claims a child, between the rewind's ListShards and its
    read of the table: the child is in the table but not in the listing taken before. It is a
    new shard, not one that aged out: it must not be finished (its records would never be
    read), but read from its start like its sibling."""
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 1)
    put(url, stream, 0, 3)
    store = asyncio.run(_rewind_during_a_split(config, url, stream))
    rows = {item["sk"]["S"]: item for item in items(config, stream)}
    child = store.children[0]
    assert child in rows
    assert not rows[child].get("finished", {}).get("BOOL", False), rows[child]


class SplitBeforeWritesStore(DynamoDBStateStore):
    """A store whose first rewind write is preceded by a split of the stream's only shard, a
    record put into a child, and a member's claim and checkpoint of that child past it (through
    another store): a reshard landing after the rewind listed the shards and read the table,
    and a member reading the new child before the parent is moved."""

    def __init__(self, client: Any, config: Config, intruder: DynamoDBStateStore, url: str):
        super().__init__(client, config.dynamodb_table, config.app, RequestStats())
        self.intruder = intruder
        self.url = url
        self.child: str | None = None
        self.child_record: set[bytes] = set()

    async def rewind_checkpoint(
        self, stream: str, shard_id: str, seen: Checkpoint | None, target: RewindTarget
    ) -> bool:
        if self.child is None:
            await asyncio.to_thread(split_in_two, self.url, stream)
            put = await asyncio.to_thread(
                kinesis(self.url).put_record,
                StreamName=stream,
                Data=b"in-the-child",
                PartitionKey="k",
                ExplicitHashKey="0",
            )
            self.child, self.child_record = put["ShardId"], {b"in-the-child"}
            claimed = await self.intruder.claim(stream, self.child, "member-1", None)
            assert claimed is not None
            position = Position(put["SequenceNumber"], 0)
            assert await self.intruder.write_checkpoint(claimed, position)
        return await super().rewind_checkpoint(stream, shard_id, seen, target)


async def _rewind_split_before_writes(
    config: Config, url: str, stream: str, to: str
) -> tuple[SplitBeforeWritesStore, Any]:
    aws = AwsClients(config, RequestStats())
    await aws.open()
    try:
        async with state_store(config) as intruder:
            store = SplitBeforeWritesStore(aws.dynamodb, config, intruder, url)
            result = await rewind_stream(config, stream, to=to, state=store)
            return store, result
    finally:
        await aws.close()


@pytest.mark.parametrize("to", ["trim-horizon", "latest"])
def test_a_child_born_and_read_during_the_rewind_is_moved_too(
    group: dict[str, Any], to: str
) -> None:
    """The parent, open when listed, splits before it is moved, and a member reads (and
    checkpoints) a new child meanwhile. The parent is reopened at its oldest record: the child,
    whose records follow the parent's, must start over too, not go on from its checkpoint (its
    records since would be skipped by the rewind, and read before the parent's)."""
    g, config = group, group["config"]
    url, stream = g["url"], g["stream"]
    create_stream(url, stream, 1)
    put(url, stream, 0, 3)
    store, result = asyncio.run(_rewind_split_before_writes(config, url, stream, to))
    rows = {item["sk"]["S"]: item for item in items(config, stream)}
    assert store.child is not None and store.child in rows
    child = rows[store.child]
    assert "sequence_number" not in child and "owner" not in child, child
    assert child["started_at"]["N"] == "0"
    assert store.child in result.moved
    assert [m.shard_id for m in result.shards].index(store.child) > 0  # after its parent


def test_a_duration_longer_than_the_epoch_is_the_oldest_record(group: dict[str, Any]) -> None:
    """``by`` past 1970 (a typo's ``3000w``): the instant is 0 (the oldest record, as a time
    before the epoch is), not a negative epoch time no reader's AT_TIMESTAMP takes."""
    g, config = group, group["config"]
    create_stream(g["url"], g["stream"], 1)
    by = timedelta(weeks=3000)
    result = asyncio.run(rewind_stream(config, g["stream"], by=by, dry_run=True))
    assert result.instant_ms == 0
    assert all(m.target.started_at_ms == 0 for m in result.shards)


def test_a_duration_beyond_datetimes_range_is_the_oldest_record_too(
    group: dict[str, Any],
) -> None:
    """``--by-duration 99999999999w`` is past what ``timedelta`` holds: capped at a century
    (already before 1970), it is the oldest record, not a traceback."""
    g, config = group, group["config"]
    create_stream(g["url"], g["stream"], 1)
    by = options.duration("99999999999w")
    result = asyncio.run(rewind_stream(config, g["stream"], by=by, dry_run=True))
    assert result.instant_ms == 0


def test_an_item_without_a_sub_sequence_attribute_is_moved(group: dict[str, Any]) -> None:
    """A checkpoint item with a sequence number but no ``sub_sequence_number`` (it decodes as
    0): the rewind's condition matches it as read, instead of being refused at every try."""
    g, config = group, group["config"]
    create_stream(g["url"], g["stream"], 1)
    put(g["url"], g["stream"], 0, 3)
    client = kinesis(g["url"])
    (shard,) = client.list_shards(StreamName=g["stream"])["Shards"]
    first = client.get_records(
        ShardIterator=client.get_shard_iterator(
            StreamName=g["stream"], ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
    )["Records"][0]["SequenceNumber"]
    dynamodb = boto3.client("dynamodb", endpoint_url=config.dynamodb_endpoint)
    key = {"pk": {"S": f"check_point#{config.app}#{g['stream']}"}, "sk": {"S": shard["ShardId"]}}
    dynamodb.put_item(
        TableName=config.dynamodb_table,
        Item={**key, "sequence_number": {"S": first}, "lease": {"N": "3"}},
    )
    result = asyncio.run(rewind_stream(config, g["stream"], to="trim-horizon"))
    assert [m.target.started_at_ms for m in result.shards] == [0]
    item = dynamodb.get_item(TableName=config.dynamodb_table, Key=key, ConsistentRead=True)
    assert "sequence_number" not in item["Item"]
    assert item["Item"]["started_at"] == {"N": "0"}
