"""The consumer group's protocol (splits, handoffs, takeovers, checkpoints, hooks), on the
in-memory Kinesis and state table every member shares (support.memory_group): the
contract suite (tests/contract/) keeps those honest against the real stand-ins. The tests whose
point is the DynamoDB store itself run on moto in server mode, each saying why."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.group import (
    POSITIONS,
    Member,
    datas,
    duplicates,
    make_config,
    setup_table,
    state_store,
    wait_reading,
)
from support.memory_group import MemoryGroup
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.models import Position

Names = Callable[[str], str]


class Group(MemoryGroup):
    """A test's group in memory, with the name of the stream most tests read."""

    def __init__(self, app: str, table: str, stream: str, initial_position: str) -> None:
        super().__init__(app, table)
        self.stream = stream
        self.initial_position = initial_position

    def started(
        self, client_id: str, streams: list[str], sink: list[tuple[str, Record]], **overrides: Any
    ) -> Member:
        """A started member at the group's initial position."""
        values = {"client_id": client_id, "initial_position": self.initial_position, **overrides}
        return self.member(self.config(**values), streams, sink).start()


@pytest.fixture
def group(unique_name: Names) -> Group:
    """A fresh group in memory: its stream's name (not created), its members read from
    ``TRIM_HORIZON``."""
    return Group(unique_name("app"), unique_name("state"), unique_name("s"), "TRIM_HORIZON")


@pytest.fixture(params=POSITIONS)
def at(request: pytest.FixtureRequest, group: Group) -> Group:
    """:func:`group`, its members at ``initial_position`` ``group.initial_position``: the
    default ``LATEST``, and ``TRIM_HORIZON``. At ``LATEST`` a test puts records only once the
    members read every shard (:func:`wait_reading`)."""
    group.initial_position = request.param
    return group


@pytest.fixture
def moto_group(moto_url: str, unique_name: Names) -> dict[str, Any]:
    """A table and app on moto in server mode, the table created: for the DynamoDB store's own
    tests."""
    names = {"app": unique_name("app"), "table": unique_name("state")}
    config = make_config(moto_url, moto_url, names["app"], names["table"])
    setup_table(config)
    return {**names, "url": moto_url, "config": config}


async def test_two_clients_split_shards_and_read_every_record_once(at: Group) -> None:
    stream = at.stream
    at.create_stream(stream, 4)
    sink: list[tuple[str, Record]] = []
    a = at.started("a", [stream], sink)
    await eventually(lambda: len(a.owned()) == 4, what="a owns all 4 shards")
    await wait_reading([a], 4)
    produced = at.put(stream, 0, 200)
    await eventually(lambda: len(sink) >= 100, what="a reading")
    b = at.started("b", [stream], sink)
    joined = time.monotonic()
    await eventually(
        lambda: len(a.owned()) == 2 and len(b.owned()) == 2 and not (a.owned() & b.owned()),
        what="a and b own two shards each",
    )
    print(f"rebalance after join: {time.monotonic() - joined:.2f}s")
    produced += at.put(stream, 200, 200)
    await eventually(lambda: len(set(datas(sink))) == 400, what="all 400 records")
    owned = {"a": a.owned(), "b": b.owned()}
    await a.close()
    await b.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    # Records produced after the rebalance went only to their shard's new owner.
    for cid, record in sink:
        if int(record.data) >= 200:
            assert (stream, record.shard_id) in owned[cid]


async def test_three_clients_read_every_record_exactly_once(at: Group) -> None:
    stream = at.stream
    at.create_stream(stream, 6)
    sink: list[tuple[str, Record]] = []
    members = [at.started(c, [stream], sink) for c in "xyz"]
    await eventually(lambda: [len(m.owned()) for m in members] == [2, 2, 2], what="two shards each")
    await wait_reading(members, 6)
    owned = [m.owned() for m in members]
    assert set().union(*owned) == {(stream, f"shardId-{i:012d}") for i in range(6)}
    produced = at.put(stream, 0, 600)
    await eventually(lambda: len(sink) >= 600, what="600 records")
    for m in members:
        await m.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    for member, shards in zip(members, owned, strict=True):
        mine = {(stream, r.shard_id) for cid, r in sink if cid == member.client_id}
        assert mine <= shards  # membership was stable: nobody read another's shard


async def test_leaving_client_hands_shards_over_without_duplicates(at: Group) -> None:
    stream = at.stream
    at.create_stream(stream, 4)
    sink: list[tuple[str, Record]] = []
    a = at.started("a", [stream], sink)
    b = at.started("b", [stream], sink)
    await eventually(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, what="split")
    await wait_reading([a, b], 4)
    produced = at.put(stream, 0, 300)
    await eventually(lambda: len(sink) >= 150, what="half consumed")
    await a.close()  # graceful: checkpoints written, shards released, client item deleted
    await eventually(lambda: len(b.owned()) == 4, timeout=10, what="b takes all shards")
    produced += at.put(stream, 300, 300)
    await eventually(lambda: len(set(datas(sink))) == 600, what="all records")
    await b.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}


async def test_checkpoint_write_refused_after_takeover(group: Group) -> None:
    """A client whose shard was claimed by someone else cannot write its checkpoint, and the
    newer checkpoint is never overwritten by the older owner."""
    stream = group.stream
    group.create_stream(stream, 1)
    shard = "shardId-000000000000"
    group.put(stream, 0, 50)
    sink: list[tuple[str, Record]] = []
    a = group.started("a", [stream], sink, commit_interval=60)
    await eventually(lambda: len(sink) == 50, what="a read 50")
    await a.consumer.commit()
    # The same table, written as another client would.
    async with group.state_store() as intruder:
        seen = (await intruder.get_checkpoints(stream, [shard]))[shard]
        assert seen.owner == "a"
        taken = await intruder.claim(stream, shard, "intruder", seen)
        assert taken is not None and taken.lease == seen.lease + 1
        newer = Position(sink[-1][1].sequence_number, 0)
        assert await intruder.write_checkpoint(taken, newer)
        # a's old lease can no longer write, whatever position it holds.
        assert not await intruder.write_checkpoint(seen, Position(sink[0][1].sequence_number, 0))
        group.put(stream, 50, 10)
        await eventually(lambda: len(sink) >= 51, what="a reads on until it learns")
        await a.consumer.commit()  # refused: a's lease was taken over
        stats = a.consumer.stats()
        assert stats.checkpoint_conflicts >= 1
        after = (await intruder.get_checkpoints(stream, [shard]))[shard]
        assert after.sequence_number == newer.sequence_number
        assert after.lease >= taken.lease
    await a.close()


def put_once_reading(
    consumer: AsyncKinesumer, shards: int, group: Group, count: int
) -> asyncio.Task[list[bytes]]:
    """Put records 0..count-1 into ``group.stream`` once ``consumer`` reads ``shards`` shards
    (at ``LATEST``, records put earlier are not read), from a task: the test meanwhile iterates
    the consumer."""

    async def once_reading() -> list[bytes]:
        await eventually(
            lambda: sum(s.millis_behind is not None for s in consumer.stats().shards) == shards,
            what=f"{shards} shards read",
        )
        return group.put(group.stream, 0, count)

    return asyncio.create_task(once_reading())


async def test_restart_resumes_after_the_checkpoint(at: Group) -> None:
    stream = at.stream
    at.create_stream(stream, 2)
    config = at.config(initial_position=at.initial_position)
    first: list[Record] = []
    consumer = at.consumer(config)
    producing = put_once_reading(consumer, 2, at, 200)
    async for record in consumer.consume([stream]):
        first.append(record)
        if len(first) == 120:
            break
    await consumer.aclose()  # from the iterating task: the 120th record counts as processed
    produced = await producing
    second: list[Record] = []
    consumer = at.consumer(config)  # at LATEST too: after the checkpoint, not at the tip
    async for record in consumer.consume([stream]):
        second.append(record)
        if len(first) + len(second) == 200:
            break
    await consumer.aclose()
    assert len(first) == 120
    assert sorted(r.data for r in first + second) == sorted(produced)


async def test_multiple_streams_spread_over_members(at: Group, unique_name: Names) -> None:
    s1, s2 = at.stream, unique_name("s")
    at.create_stream(s1, 2)
    at.create_stream(s2, 3)
    sink: list[tuple[str, Record]] = []
    members = [at.started(c, [s1, s2], sink) for c in "ab"]
    await eventually(
        lambda: sorted(len(m.owned()) for m in members) == [2, 3], what="5 shards split 2/3"
    )
    await wait_reading(members, 5)
    produced = at.put(s1, 0, 100) + at.put(s2, 1000, 150)
    await eventually(lambda: len(sink) >= 250, what="all records of both streams")
    for m in members:
        await m.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    assert {r.stream for _, r in sink} == {s1, s2}


async def test_manual_commit_checkpoints_only_what_was_committed(at: Group) -> None:
    stream = at.stream
    at.create_stream(stream, 1)
    config = at.config(auto_commit=False, commit_interval=0.1, initial_position=at.initial_position)
    consumer = at.consumer(config)
    producing = put_once_reading(consumer, 1, at, 60)
    got: list[Record] = []
    async for record in consumer.consume([stream]):
        got.append(record)
        if len(got) == 30:
            await consumer.commit()
        if len(got) == 45:
            break
    await asyncio.sleep(0.3)  # periodic flushes must not write the 15 uncommitted records
    await consumer.aclose()  # manual mode: closing does not commit
    produced = await producing
    again: list[Record] = []
    consumer = at.consumer(config)
    async for record in consumer.consume([stream]):
        again.append(record)
        if len(again) == 30:
            await consumer.commit()
            break
    await consumer.aclose()
    assert [r.data for r in again] == produced[30:60]


async def test_crashed_member_shards_are_taken_over_at_least_once(group: Group) -> None:
    stream = group.stream
    group.create_stream(stream, 2)
    sink: list[tuple[str, Record]] = []
    a = group.started("a", [stream], sink)
    b = group.started("b", [stream], sink)
    await eventually(lambda: len(a.owned()) == 1 and len(b.owned()) == 1, what="split")
    produced = group.put(stream, 0, 200)
    await eventually(lambda: len(sink) >= 200, what="all read once")
    await eventually(a.flushed, what="a's checkpoints at its last records")
    await a.crash()
    crashed = time.monotonic()
    await eventually(lambda: len(b.owned()) == 2, timeout=15, what="b takes a's shard")
    print(f"takeover after crash: {time.monotonic() - crashed:.2f}s")
    # The leader (b) prunes the dead member's item, with a delete conditional on what it saw.
    members: list[str] = []
    async with group.state_store() as store:
        for _ in range(100):
            members = [c.client_id for c in await store.list_clients()]
            if members == ["b"]:
                break
            await asyncio.sleep(0.1)
    assert members == ["b"]
    produced += group.put(stream, 200, 100)
    await eventually(lambda: len(set(datas(sink))) == 300, what="all 300")
    await b.close()
    assert sorted(set(datas(sink))) == sorted(produced)
    # a flushed before dying: b resumed after a's checkpoint, so nothing was delivered twice.
    assert duplicates(sink) == {}


async def test_a_recorded_latest_start_that_overrides_the_initial_position_is_warned_once(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """A shard with no position but a recorded LATEST start is read from that start, whatever
    the member's initial position: each member says so once per shard, at WARNING, naming the
    command that makes the group forget it."""
    stream = group.stream
    group.create_stream(stream, 2)
    shards = ["shardId-000000000000", "shardId-000000000001"]
    async with group.state_store() as earlier:  # a run at LATEST, as its fetcher does
        for shard_id in shards:
            claimed = await earlier.claim(stream, shard_id, "earlier", None)
            assert claimed is not None and await earlier.record_start(claimed, 1_000)
            assert await earlier.write_checkpoint(claimed, None, release=True)
    caplog.set_level(logging.WARNING, logger="kinesumer.coordinator")
    sink: list[tuple[str, Record]] = []
    # The table's endpoint as a member would be given it (the memory table ignores it): the
    # command it prints must reach that table.
    endpoint = "http://127.0.0.1:4566"
    a = group.started("a", [stream], sink, dynamodb_endpoint=endpoint)
    await eventually(lambda: len(a.reading()) == 2, what="a reads both shards")
    b = group.started("b", [stream], sink, dynamodb_endpoint=endpoint)
    await eventually(lambda: len(a.owned()) == 1 and len(b.reading()) == 1, what="split")
    (moved,) = b.owned()
    await b.close()
    await eventually(lambda: len(a.reading()) == 2, what="a reads both shards again")
    await a.close()

    def warned(client_id: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING
            and r.getMessage().startswith(f"[{client_id}] ")
            and "recorded LATEST start" in r.getMessage()
        ]

    command = (
        f"kinesumer checkpoints reset --app {group.app} --table {group.table} --region us-east-1"
        f" --dynamodb-endpoint {endpoint}"
    )
    (to_a,) = warned("a")  # once, though it claimed the moved shard again
    assert f"{shards[0]}, {shards[1]} have no checkpoint" in to_a
    assert "initial_position TRIM_HORIZON" in to_a
    assert f"`{command} --stream {stream} --shard ID` for each" in to_a
    (to_b,) = warned("b")
    assert f"`{command} --stream {stream} --shard {moved[1]}`" in to_b


async def test_shard_cache_round_trips_20000_shards(moto_group: dict[str, Any]) -> None:
    """On moto in server mode: the point is the DynamoDB store's chunked body (20,000 shards
    compress past one item's 400 KB, which moto refuses as DynamoDB does), not the group."""
    from kinesumer.models import Shard
    from kinesumer.statestore.base import ShardCache

    shards = [Shard(f"shardId-{i:012d}", closed=i < 10_000) for i in range(10_000)]
    shards += [
        Shard(f"shardId-{i:012d}", parent_shard_id=f"shardId-{i - 10_000:012d}")
        for i in range(10_000, 20_000)
    ]
    cache = ShardCache("big", tuple(shards), frozenset(s.shard_id for s in shards[:5000]))
    async with state_store(moto_group["config"]) as store:
        assert await store.save_shard_cache(cache, None)
        assert not await store.save_shard_cache(cache, None)  # conditional: already there
        loaded = await store.load_shard_cache("big")
        assert loaded == cache
        assert (await store.shard_cache_digests(["big", "none"])) == {"big": cache.digest}
        smaller = ShardCache("big", tuple(shards[:10]), frozenset())
        assert not await store.save_shard_cache(smaller, "stale-digest")
        assert await store.save_shard_cache(smaller, cache.digest)
        assert await store.load_shard_cache("big") == smaller


async def test_hot_standby_takes_over_when_a_member_leaves(at: Group) -> None:
    stream = at.stream
    at.create_stream(stream, 2)
    sink: list[tuple[str, Record]] = []
    members = [at.started(c, [stream], sink) for c in "abc"]
    await eventually(
        lambda: sorted(len(m.owned()) for m in members) == [0, 1, 1], what="one hot standby"
    )
    await wait_reading(members, 2)
    standby = next(m for m in members if not m.owned())
    leaving = next(m for m in members if m.owned() and m is not standby)
    produced = at.put(stream, 0, 100)
    await eventually(lambda: len(sink) >= 100, what="first 100")
    await leaving.close()
    await eventually(lambda: len(standby.owned()) == 1, timeout=10, what="standby steps in")
    produced += at.put(stream, 100, 100)
    await eventually(lambda: len(set(datas(sink))) == 200, what="all 200")
    for m in members:
        if m is not leaving:
            await m.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}


async def test_slow_application_bounds_the_buffer(group: Group) -> None:
    """Each GetRecords reserves room for its Limit first: buffered records never exceed the
    bound, however many shards the member reads and however far behind the application is
    (before, every shard's fetcher could pass a half-empty buffer at once: bound + shards x
    scan_limit)."""
    stream = group.stream
    group.create_stream(stream, 6)
    group.put(stream, 0, 2000)
    consumer = group.consumer(group.config(max_buffered_records=100, scan_limit=50))
    peak = 0
    got = 0
    async for _ in consumer.consume([stream]):
        got += 1
        peak = max(peak, consumer.stats().buffered_records)
        if got % 50 == 0:
            await asyncio.sleep(0.2)  # a slow application; fetchers keep polling meanwhile
        if got == 400:
            break
    await consumer.aclose()
    assert 0 < peak <= 100


async def test_prune_spares_a_member_that_heartbeated_since(moto_group: dict[str, Any]) -> None:
    """On moto in server mode: the point is the DynamoDB store's conditional delete of a
    client item (tests/contract/ holds the in-memory table to the same rule)."""
    from kinesumer.models import ClientInfo

    async with state_store(moto_group["config"]) as store:
        old = ClientInfo("zombie", last_update_ms=1_000)
        await store.heartbeat(old, 3600)
        await store.heartbeat(ClientInfo("zombie", last_update_ms=2_000), 3600)  # revived
        assert not await store.prune_client(old)  # the leader saw the old heartbeat
        assert [c.client_id for c in await store.list_clients()] == ["zombie"]
        assert await store.prune_client(ClientInfo("zombie", last_update_ms=2_000))
        assert await store.list_clients() == []


async def test_rebalance_hooks_and_lag(at: Group) -> None:
    """on_assigned before the first record of a shard; on_revoked during a handoff, after the
    in-hand record and before the release (the checkpoint still names us as owner)."""
    stream = at.stream
    at.create_stream(stream, 2)
    events: list[tuple[str, str, list[tuple[str, str]]]] = []
    owner_at_revoke: list[str | None] = []

    def assigned(shards: list[tuple[str, str]]) -> None:
        events.append(("a", "assigned", shards))

    async def revoked(shards: list[tuple[str, str]]) -> None:
        events.append(("a", "revoked", shards))
        (key,) = shards
        async with at.state_store() as store:
            checkpoint = (await store.get_checkpoints(key[0], [key[1]]))[key[1]]
        owner_at_revoke.append(checkpoint.owner)

    sink: list[tuple[str, Record]] = []
    config = at.config(client_id="a", initial_position=at.initial_position)
    consumer = at.consumer(config, on_assigned=assigned, on_revoked=revoked)
    a = Member(config, [stream], sink, consumer=consumer).start()
    # The hook runs once the tick's claims all settled: a lease shows as owned a moment earlier.
    await eventually(
        lambda: len(a.owned()) == 2 and sum(len(keys) for *_, keys in events) >= 2,
        what="a owns both, announced",
    )
    announced = [k for _, kind, keys in events if kind == "assigned" for k in keys]
    assert all(kind == "assigned" for _, kind, _ in events)
    assert sorted(announced) == sorted(a.owned())  # each shard announced once
    await wait_reading([a], 2)
    at.put(stream, 0, 20)
    await eventually(lambda: len(sink) >= 20, what="records")
    lag = a.consumer.lag()
    assert set(lag) == a.owned() and all(v is not None and v >= 0 for v in lag.values())
    b = at.started("b", [stream], sink)
    await eventually(lambda: len(b.owned()) == 1, what="b takes one shard")
    revokes = [keys for _, kind, keys in events if kind == "revoked"]
    assert len(revokes) == 1 and len(revokes[0]) == 1
    assert owner_at_revoke == ["a"]  # the hook ran before the release
    await a.close()
    await b.close()
    with pytest.raises(TypeError):
        at.consumer(at.config(), on_assigned="not callable")


async def test_close_leaves_no_shard_owned(group: Group) -> None:
    """close() waits for a coordinator tick in flight: a claim made during close would leave a
    shard owned by a member that has gone."""
    stream = group.stream
    group.create_stream(stream, 4)
    group.put(stream, 0, 40)
    for round_ in range(3):
        consumer = group.consumer(group.config(client_id=f"c{round_}"))
        async for _ in consumer.consume([stream]):
            break
        await consumer.aclose()
        async with group.state_store() as store:
            owners = {c.owner for c in (await store.get_checkpoints(stream)).values()}
        assert owners <= {None}, (round_, owners)


async def test_buffer_reservations_bound_buffered_plus_in_flight() -> None:
    """The bound holds with many fetchers: each reserves its fair share of it (its GetRecords
    Limit) before calling, reservations plus buffered records never exceed the bound, and a
    used or released reservation makes room again."""
    from kinesumer.models import Checkpoint
    from kinesumer.read.buffer import RecordBuffer
    from kinesumer.read.progress import shard_lease

    buffer = RecordBuffer(max_records=100, max_bytes=1 << 20)
    buffer.fetchers = 2
    lease = shard_lease(Checkpoint("s", "shard-0", owner="c", lease=1))
    first = await buffer.reserve(80)
    second = await buffer.reserve(80)
    assert (first, second) == (50, 50)  # a fair share each, not scan_limit each
    waiting = asyncio.ensure_future(buffer.reserve(80))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # nothing free: a third call waits instead of overshooting
    records = [Record("s", "shard-0", str(i), 0, "k", b"x", None) for i in range(10)]  # type: ignore[arg-type]
    await buffer.put(lease, records, reserved=first)  # 50 reserved became 10 buffered
    await asyncio.sleep(0.01)
    assert not waiting.done()  # 40 free: less than a share
    await buffer.get()
    assert await asyncio.wait_for(waiting, 1) == 50
    buffer.release(second)  # a failed call gives its room back
    assert await asyncio.wait_for(buffer.reserve(80), 1) == 50
    assert buffer.size == (0, 0)


async def test_a_waiting_fetcher_needs_only_the_current_fair_share() -> None:
    """A fetcher that began waiting while few shards were fetched (a big share) is served as
    soon as today's share is free, not starved behind fetchers with smaller shares."""
    from kinesumer.read.buffer import RecordBuffer

    buffer = RecordBuffer(max_records=100, max_bytes=1 << 20)
    buffer.fetchers = 1
    assert await buffer.reserve(80) == 80
    waiting = asyncio.ensure_future(buffer.reserve(80))  # its share now: 80, only 20 free
    await asyncio.sleep(0.01)
    assert not waiting.done()
    buffer.fetchers = 5  # more shards joined: a share is 20 now
    buffer.release(0)  # any change wakes the waiters
    assert await asyncio.wait_for(waiting, 1) == 20
