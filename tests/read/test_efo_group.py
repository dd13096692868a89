"""Enhanced fan-out in the engine: a group of members reading through subscriptions.

kinesalite + dynalite, with the stand-in transport of ``support/efo_fake.py`` pushing the stream's
real records as SubscribeToShard events (so every guarantee is checked against a real stream,
real SHARD_END and 56-digit sequence numbers): every record once through expiring and busy
subscriptions, a graceful handoff with no duplicate, a crash and takeover, a split while
consuming (parents first), a slow application keeping memory bounded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from support.efo_fake import FakeEfo
from support.group import Member, create_stream, datas, duplicates, kinesis, make_config, put
from support.group import setup_table as create_table
from support.wait import eventually

from kinesumer import AsyncKinesumer, Config, ConfigError, Record
from kinesumer.consumer.base import engine_of

Names = Callable[[str], str]


@pytest.fixture
def env(kinesalite: Any, dynalite: Any, unique_name: Names) -> dict[str, Any]:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        enhanced_fan_out=True,
    )
    create_table(config)
    return {"url": kinesalite.url, "config": config, "stream": unique_name("s")}


def efo_member(
    config: Config, client_id: str, stream: str, sink: list[tuple[str, Record]], fake: FakeEfo
) -> Member:
    member = Member(config.replace(client_id=client_id), [stream], sink)
    engine_of(member.consumer).efo_transport = fake.transport()
    return member.start()


def test_config_checks() -> None:
    config = Config(app="orders", dynamodb_table="state", enhanced_fan_out=True)
    assert config.effective_consumer_name == "orders"
    named = config.replace(consumer_name="orders-efo")
    assert named.effective_consumer_name == "orders-efo"
    with pytest.raises(ConfigError, match="consumer_name"):
        Config(app="orders", dynamodb_table="state", consumer_name="x")
    with pytest.raises(ConfigError, match="consumer_name"):
        config.replace(consumer_name="no spaces")
    with pytest.raises(ConfigError, match="broadcast"):
        config.replace(broadcast=True)


async def test_every_record_once_through_expiring_and_busy_subscriptions(
    env: dict[str, Any],
) -> None:
    """Subscriptions end every 2 events and the first attempt on each shard finds the shard
    busy: each resubscription starts AFTER the last buffered record, nothing is lost or
    repeated."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 4)
    fake = FakeEfo(url, expire_after=2, busy_first=1, event_records=7)
    sink: list[tuple[str, Record]] = []
    members = [efo_member(env["config"], c, stream, sink, fake) for c in "ab"]
    produced = put(url, stream, 0, 400)
    await eventually(lambda: len(sink) >= 400, what="every record")
    for member in members:
        await member.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    # Both members registered the app's consumer on the stream before claiming.
    assert {name for _, name in fake.registrations} == {env["config"].app}
    assert len(fake.registrations) == 2
    # Resubscriptions continue right after the last record delivered before them.
    by_shard: dict[str, list[str]] = defaultdict(list)
    for _, record in sink:
        by_shard[record.shard_id].append(record.sequence_number)
    for shard_id, position in fake.positions:
        if position["Type"] == "AFTER_SEQUENCE_NUMBER":
            assert position["SequenceNumber"] in by_shard[shard_id]
    resubscribed = [p for _, p in fake.positions if p["Type"] == "AFTER_SEQUENCE_NUMBER"]
    assert len(resubscribed) >= 10


async def test_graceful_handoff_has_no_duplicate(env: dict[str, Any]) -> None:
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 4)
    fake = FakeEfo(url)
    sink: list[tuple[str, Record]] = []
    first = efo_member(env["config"], "a", stream, sink, fake)
    produced = put(url, stream, 0, 200)
    await eventually(lambda: len(sink) >= 200, what="records before the second member")
    second = efo_member(env["config"], "b", stream, sink, fake)
    await eventually(lambda: len(second.owned()) == 2, what="the rebalance")
    produced += put(url, stream, 200, 200)
    await eventually(lambda: len(set(datas(sink))) >= 400, what="records after it")
    await first.close()  # hands its two shards to the second member
    produced += put(url, stream, 400, 200)
    await eventually(lambda: len(set(datas(sink))) >= 600, what="records after the handoff")
    await second.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    # The second member resumed the handed-off shards AT their checkpoints (the fetcher
    # skips the checkpointed record itself), not from TRIM_HORIZON.
    assert any(p["Type"] == "AT_SEQUENCE_NUMBER" for _, p in fake.positions)


async def test_crash_and_takeover_loses_nothing(env: dict[str, Any]) -> None:
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    fake = FakeEfo(url)
    sink: list[tuple[str, Record]] = []
    first = efo_member(env["config"], "a", stream, sink, fake)
    second = efo_member(env["config"], "b", stream, sink, fake)
    produced = put(url, stream, 0, 200)
    await eventually(lambda: len(set(datas(sink))) >= 200, what="records before the crash")
    await first.crash()  # no handoff: its subscriptions close as a killed process's would
    produced += put(url, stream, 200, 200)
    await eventually(lambda: len(second.owned()) == 2, what="the takeover")
    await eventually(lambda: len(set(datas(sink))) >= 400, what="records after the crash")
    await second.close()
    assert set(datas(sink)) == set(produced)


def split(url: str, stream: str) -> None:
    client = kinesis(url)
    first = client.list_shards(StreamName=stream)["Shards"][0]
    low, high = (int(first["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=first["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})


@pytest.mark.parametrize(
    ("send_children", "never_end"),
    [(True, False), (False, False), (False, True)],
    ids=["children-in-event", "listing", "never-ends"],
)
async def test_split_while_consuming_reads_parents_first(
    env: dict[str, Any], send_children: bool, never_end: bool
) -> None:
    """``never-ends``: the parent's subscription never says SHARD_END (kinesis-local); the
    fetcher finds the closed shard drained with GetRecords and ends it."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    fake = FakeEfo(url, send_children=send_children, never_end=never_end)
    sink: list[tuple[str, Record]] = []
    members = [efo_member(env["config"], c, stream, sink, fake) for c in "ab"]
    key = lambda i: f"key-{i % 16}"  # noqa: E731
    produced = put(url, stream, 0, 200, key)
    await eventually(lambda: len(sink) >= 200, what="records before the split")
    split(url, stream)
    produced += put(url, stream, 200, 200, key)
    await eventually(lambda: len(set(datas(sink))) >= 400, what="records after the split")
    for member in members:
        await member.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, record in sink:
        by_key[record.partition_key].append(int(record.data))
    assert all(numbers == sorted(numbers) for numbers in by_key.values())
    # The parent's subscription ended at SHARD_END; its children started at TRIM_HORIZON.
    children = {r.shard_id for _, r in sink} - {"shardId-000000000000", "shardId-000000000001"}
    assert len(children) == 2
    firsts = {sid: p for sid, p in reversed(fake.positions) if sid in children}
    assert {p["Type"] for p in firsts.values()} == {"TRIM_HORIZON"}


async def test_slow_application_keeps_memory_bounded(env: dict[str, Any]) -> None:
    """Nobody takes records: the buffer fills to its bound and the subscriptions stop reading
    (the transport is asked for no more events), then everything arrives once taken."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    fake = FakeEfo(url, event_records=10)
    config = env["config"].replace(max_buffered_records=40, client_id="slow")
    produced = put(url, stream, 0, 600)
    consumer = AsyncKinesumer(config)
    engine_of(consumer).efo_transport = fake.transport()
    await engine_of(consumer).start((stream,))
    try:
        await eventually(lambda: engine_of(consumer).buffered()[0] >= 30, what="a full buffer")
        sent = sum(fake.events_sent.values())
        records, _ = engine_of(consumer).buffered()
        assert records <= 40
        # At most one more event per shard was read and waits for room: no unbounded reading.
        assert sent * 10 <= 40 + 2 * 10 + 2 * 10
        got: list[bytes] = []
        async for record in consumer.consume([stream]):
            got.append(record.data)
            assert engine_of(consumer).buffered()[0] <= 40
            if len(got) == 600:
                break
        assert sorted(got) == sorted(produced)
    finally:
        await consumer.aclose()
