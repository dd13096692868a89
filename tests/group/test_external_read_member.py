"""ExternalReadMember on kinesalite + dynalite: a group member whose records are read elsewhere
(as Spark executors do), sharing claims, fencing, handoffs and lineage with every other member.

The "executor" here is a plain boto3 Kinesis client reading the shard from the position the
member hands out."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, kinesis, make_config, put, state_store
from support.group import setup_table as create_table
from support.wait import wait_until

from kinesumer import Kinesumer
from kinesumer.group.external import ExternalReadMember, OwnedShard
from kinesumer.models import Checkpoint, Position

Names = Callable[[str], str]
Key = tuple[str, str]


@pytest.fixture
def env(kinesalite: Any, dynalite: Any, unique_name: Names) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    create_table(config)
    return {"url": kinesalite.url, "config": config, "stream": unique_name("s")}


def read(url: str, shard: OwnedShard) -> tuple[list[bytes], Position | None, bool]:
    """What an executor does: read the shard from where the member says, to the tip or the
    end. Returns the data, the last position read (None: nothing), and whether SHARD_END came."""
    client = kinesis(url)
    if shard.position is not None:
        iterator = client.get_shard_iterator(
            StreamName=shard.stream,
            ShardId=shard.shard_id,
            ShardIteratorType="AFTER_SEQUENCE_NUMBER",
            StartingSequenceNumber=shard.position.sequence_number,
        )["ShardIterator"]
    else:
        iterator = client.get_shard_iterator(
            StreamName=shard.stream, ShardId=shard.shard_id, ShardIteratorType=shard.start
        )["ShardIterator"]
    data: list[bytes] = []
    last: Position | None = None
    while True:
        answer = client.get_records(ShardIterator=iterator, Limit=1000)
        for record in answer["Records"]:
            data.append(record["Data"])
            last = Position(record["SequenceNumber"], 0)
        iterator = answer.get("NextShardIterator")
        if iterator is None:
            return data, last, True
        if not answer["Records"] and not answer.get("MillisBehindLatest"):
            return data, last, False


def checkpoints(config: Any, stream: str) -> dict[str, Checkpoint]:
    async def fetch() -> dict[str, Checkpoint]:
        async with state_store(config) as store:
            return await store.get_checkpoints(stream)

    return asyncio.run(fetch())


def live_clients(config: Any) -> list[str]:
    async def fetch() -> list[str]:
        async with state_store(config) as store:
            return [c.client_id for c in await store.list_clients()]

    return asyncio.run(fetch())


def keys(member: ExternalReadMember) -> set[Key]:
    return {shard.key for shard in member.owned()}


def owned_by(member: ExternalReadMember, key: Key) -> OwnedShard | None:
    return next((s for s in member.owned() if s.key == key), None)


def ticks_pass(member: ExternalReadMember, count: int) -> None:
    """Wait until ``member``'s coordinator ran ``count`` more ticks."""
    start = member.stats().coordinator_ticks
    wait_until(lambda: member.stats().coordinator_ticks >= start + count, what=f"{count} ticks")


def test_two_external_members_split_the_shards(env: dict[str, Any]) -> None:
    config, stream = env["config"], env["stream"]
    create_stream(env["url"], stream, 4)
    with ExternalReadMember(config) as a, ExternalReadMember(config) as b:
        a.start([stream])
        b.start([stream])
        wait_until(
            lambda: len(keys(a)) == 2 and len(keys(b)) == 2,
            what="two shards each",
            diagnose=lambda: f"a={keys(a)} b={keys(b)}",
        )
        assert not keys(a) & keys(b)
        shard = a.owned()[0]
        assert shard.owner == a.client_id and shard.lease >= 1
        assert shard.position is None and shard.start == "TRIM_HORIZON"
        assert a.stats().state == "running"
    assert a.stats().state == "closed" and live_clients(config) == []


def test_complete_writes_fenced_checkpoints_and_a_stolen_lease_returns_false(
    env: dict[str, Any],
) -> None:
    config, stream, url = env["config"], env["stream"], env["url"]
    create_stream(url, stream, 1)
    put(url, stream, 0, 20)
    with ExternalReadMember(config) as member:
        member.start([stream])
        wait_until(lambda: len(member.owned()) == 1, what="the shard")
        shard = member.owned()[0]
        member.begin(shard.key)
        data, last, ended = read(url, shard)
        assert data == [str(i).encode() for i in range(20)] and not ended
        assert member.complete(shard.key, last)
        written = checkpoints(config, stream)[shard.shard_id]
        assert written.sequence_number == last.sequence_number  # type: ignore[union-attr]
        assert written.owner == member.client_id and written.lease == shard.lease
        assert owned_by(member, shard.key) == OwnedShard(
            stream, shard.shard_id, member.client_id, shard.lease, last, "TRIM_HORIZON"
        )

        member.begin(shard.key)
        put(url, stream, 20, 5)
        _, newer, _ = read(url, owned_by(member, shard.key))  # type: ignore[arg-type]

        async def steal() -> None:
            async with state_store(config) as intruder:
                seen = (await intruder.get_checkpoints(stream, [shard.shard_id]))[shard.shard_id]
                assert await intruder.claim(stream, shard.shard_id, "intruder", seen) is not None

        asyncio.run(steal())
        assert not member.complete(shard.key, newer)  # refused: nothing written
        after = checkpoints(config, stream)[shard.shard_id]
        assert after.sequence_number == last.sequence_number  # type: ignore[union-attr]
        assert member.stats().checkpoint_conflicts == 1


def test_a_handoff_waits_for_a_begun_batch_and_releases_at_the_completed_position(
    env: dict[str, Any],
) -> None:
    config, stream, url = env["config"], env["stream"], env["url"]
    config = make_config(
        config.kinesis_endpoint,
        config.dynamodb_endpoint,
        config.app,
        config.dynamodb_table,
        handoff_timeout=60.0,
    )
    create_stream(url, stream, 2)
    put(url, stream, 0, 40)
    with ExternalReadMember(config) as a:
        a.start([stream])
        wait_until(lambda: len(a.owned()) == 2, what="both shards")
        reads = {shard.key: read(url, shard) for shard in a.owned()}
        for key in reads:
            a.begin(key)
        with ExternalReadMember(config) as b:
            b.start([stream])
            wait_until(lambda: len(a.owned()) == 1, what="a shard moving away")
            (moving,) = set(reads) - keys(a)
            ticks_pass(b, 3)
            assert moving not in keys(b)  # the handoff waits for a's begun batch
            statuses = {(s.stream, s.shard_id): s.status for s in a.stats().shards}
            assert statuses[moving] == "revoking"
            _, last, _ = reads[moving]
            assert a.complete(moving, last)  # the normal way a handoff finishes
            wait_until(lambda: moving in keys(b), what="b claims the shard")
            taken = owned_by(b, moving)
            assert taken is not None and taken.position == last  # right after a's batch
            staying = next(iter(keys(a)))
            assert a.complete(staying, reads[staying][1])


def test_children_are_listed_only_after_their_parent_completed_finished(
    env: dict[str, Any],
) -> None:
    config, stream, url = env["config"], env["stream"], env["url"]
    config = make_config(
        config.kinesis_endpoint,
        config.dynamodb_endpoint,
        config.app,
        config.dynamodb_table,
        initial_position="LATEST",  # children must still start at TRIM_HORIZON
    )
    create_stream(url, stream, 1)
    put(url, stream, 0, 10)
    client = kinesis(url)
    parent = client.list_shards(StreamName=stream)["Shards"][0]
    with ExternalReadMember(config) as member:
        member.start([stream])
        wait_until(lambda: len(member.owned()) == 1, what="the parent")
        low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        client.split_shard(
            StreamName=stream,
            ShardToSplit=parent["ShardId"],
            NewStartingHashKey=str((low + high) // 2),
        )
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
        put(url, stream, 10, 10)
        wait_until(lambda: len(member.stats().shards) == 3, what="the children claimed")
        assert keys(member) == {(stream, parent["ShardId"])}  # claimed, not readable yet
        (shard,) = member.owned()
        assert shard.start == "LATEST"  # a root shard: the configured position
        member.begin(shard.key)
        data, last, ended = read(url, dataclasses.replace(shard, start="TRIM_HORIZON"))
        assert ended and data[:10] == [str(i).encode() for i in range(10)]
        assert member.complete(shard.key, last, finished=True)
        assert checkpoints(config, stream)[parent["ShardId"]].finished
        wait_until(lambda: len(member.owned()) == 2, what="the children readable")
        children = member.owned()
        assert parent["ShardId"] not in {c.shard_id for c in children}
        assert all(c.position is None and c.start == "TRIM_HORIZON" for c in children)
        after = [d for child in children for d in read(url, child)[0]]
        assert sorted(data[10:] + after) == sorted(str(i).encode() for i in range(10, 20))


def test_an_external_member_and_a_kinesumer_split_the_shards(env: dict[str, Any]) -> None:
    config, stream = env["config"], env["stream"]
    create_stream(env["url"], stream, 4)
    with ExternalReadMember(config) as external, Kinesumer(config) as consumer:
        external.start([stream])
        consumer.subscribe([stream])

        def read_by_consumer() -> set[Key]:
            return {(s.stream, s.shard_id) for s in consumer.stats().shards if s.status == "active"}

        wait_until(
            lambda: len(keys(external)) == 2 and len(read_by_consumer()) == 2,
            what="two shards each",
            diagnose=lambda: f"external={keys(external)} consumer={read_by_consumer()}",
        )
        assert not keys(external) & read_by_consumer()


def test_close_waits_for_begun_batches_and_hands_everything_off(env: dict[str, Any]) -> None:
    config, stream, url = env["config"], env["stream"], env["url"]
    config = make_config(
        config.kinesis_endpoint,
        config.dynamodb_endpoint,
        config.app,
        config.dynamodb_table,
        handoff_timeout=60.0,
    )
    create_stream(url, stream, 2)
    put(url, stream, 0, 30)
    member = ExternalReadMember(config)
    member.start([stream])
    wait_until(lambda: len(member.owned()) == 2, what="both shards")
    reads = {shard.key: read(url, shard) for shard in member.owned()}
    for key in reads:
        member.begin(key)
    closing = threading.Thread(target=member.close)
    closing.start()
    wait_until(lambda: member.stats().state == "closing", what="closing")
    for key, (_, last, _) in reads.items():
        assert member.complete(key, last)  # closing waits for these
    closing.join(30)
    assert not closing.is_alive()
    member.close()  # idempotent
    assert member.stats().state == "closed"
    assert live_clients(config) == []
    written = checkpoints(config, stream)
    for (_, shard_id), (_, last, _) in reads.items():
        assert written[shard_id].owner is None  # released
        assert written[shard_id].sequence_number == last.sequence_number  # type: ignore[union-attr]
    assert member.owned() == []


def test_begin_refuses_a_shard_not_held_now(env: dict[str, Any]) -> None:
    """A planner that looked at owned() and begins later must learn that the shard moved (or was
    re-claimed under another lease) meanwhile, instead of reading a shard it does not hold."""
    config, stream, url = env["config"], env["stream"], env["url"]
    create_stream(url, stream, 1)
    put(url, stream, 0, 3)
    with ExternalReadMember(config) as member:
        member.start([stream])
        wait_until(lambda: len(member.owned()) == 1, what="the shard")
        shard = member.owned()[0]
        assert not member.begin((stream, "shardId-000000000099"))  # never ours
        assert not member.begin(shard.key, shard.lease + 1)  # not under the lease planned with
        assert not member.complete(shard.key, None)  # the refused begin's complete writes nothing
        assert not member.complete(shard.key, None)
        assert member.begin(shard.key, shard.lease)
        _, last, _ = read(url, shard)
        assert member.complete(shard.key, last)
        assert checkpoints(config, stream)[shard.shard_id].sequence_number == last.sequence_number  # type: ignore[union-attr]


def test_two_threads_closing_at_once_both_return_and_the_shard_is_released(
    env: dict[str, Any],
) -> None:
    config, stream, url = env["config"], env["stream"], env["url"]
    config = dataclasses.replace(config, handoff_timeout=2.0)
    create_stream(url, stream, 1)
    member = ExternalReadMember(config)
    member.start([stream])
    wait_until(lambda: len(member.owned()) == 1, what="the shard")
    shard = member.owned()[0]
    assert member.begin(shard.key)  # never completed: the close waits handoff_timeout for it
    closers = [threading.Thread(target=member.close) for _ in range(2)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(timeout=60)
    assert not any(closer.is_alive() for closer in closers), "a close() never returned"
    assert checkpoints(config, stream)[shard.shard_id].owner is None
    assert not member.complete(shard.key, None)  # after close: refused, no hang
    assert member.stats().state == "closed"


def test_abandon_all_ends_every_begin_so_close_hands_off_at_once(env: dict[str, Any]) -> None:
    """Begins never completed (a caller cut short) would hold close() for handoff_timeout:
    abandon_all() ends them all without writing, and the shards are released unmoved."""
    config, stream, url = env["config"], env["stream"], env["url"]
    config = make_config(
        config.kinesis_endpoint,
        config.dynamodb_endpoint,
        config.app,
        config.dynamodb_table,
        handoff_timeout=300.0,
    )
    create_stream(url, stream, 2)
    put(url, stream, 0, 10)
    member = ExternalReadMember(config)
    member.start([stream])
    wait_until(lambda: len(member.owned()) == 2, what="both shards")
    first, second = (shard.key for shard in member.owned())
    assert member.begin(first) and member.begin(first) and member.begin(second)
    assert not member.begin((stream, "shardId-000000000099"))  # refused, yet it counts
    assert member.abandon_all() == 4
    assert member.abandon_all() == 0
    closing = threading.Thread(target=member.close)
    closing.start()
    closing.join(60)  # far under handoff_timeout: nothing is waited for
    assert not closing.is_alive()
    written = checkpoints(config, stream)
    assert all(written[key[1]].owner is None for key in (first, second))
    assert all(written[key[1]].sequence_number is None for key in (first, second))
    assert member.abandon_all() == 0  # closed: nothing to end
