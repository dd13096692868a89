"""At the default ``initial_position="LATEST"``: once a member opened a shard, no reopening of
that read starts later than that moment (issue 17, items 1 and 1b); and enhanced fan-out's
deregistered consumer (item 5).

A shard read from LATEST has no checkpoint until its first processed record. Where its reading
began is recorded in its checkpoint item before any record is handed out, and every reopening
starts there: an iterator that expires before the first record, the next owner after a
handoff, a crash or a close, through polling or enhanced fan-out. kinesalite + dynalite (the
fault proxy for the expiry; the stand-in EFO transport of ``support/efo_fake.py`` for enhanced
fan-out), and kinesis-local with the real transport for the deregistered consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.efo_fake import FakeEfo, FakeSubscribeError
from support.faultproxy import Fault, FaultKind, OpKey
from support.group import (
    Member,
    create_stream,
    datas,
    duplicates,
    kinesis,
    make_config,
    put,
    state_store,
)
from support.group import setup_table as create_table
from support.wait import eventually

from kinesumer import AsyncKinesumer, Config, Record
from kinesumer.aws import RequestStats
from kinesumer.consumer.base import engine_of
from kinesumer.errors import StreamNotFoundError
from kinesumer.kinesis.efo.consumers import stream_arn
from kinesumer.kinesis.reader import SERVER_CLOCK_MARGIN_MS
from kinesumer.read.efo_session import EfoTransport

Names = Callable[[str], str]
GET_RECORDS = OpKey("kinesis", "GetRecords")


async def caught_up(consumer: AsyncKinesumer, shards: int) -> None:
    """Every shard claimed and read once at the tip: its LATEST iterator is open."""
    await eventually(
        lambda: sum(s.caught_up for s in consumer.stats().shards) == shards,
        what=f"{shards} shards read at the tip",
    )


@pytest.mark.parametrize("broadcast", [False, True], ids=["group", "broadcast"])
async def test_an_iterator_expiring_before_the_first_record_skips_nothing(
    proxied: dict[str, Any], broadcast: bool
) -> None:
    """r1 reaches an idle shard; the next GetRecords answers ExpiredIteratorException before the
    fetcher saw r1. The renewed iterator must not open at LATEST again: r1 and r2 arrive."""
    url, stream, proxy = proxied["url"], proxied["stream"], proxied["kinesis"]
    create_stream(url, stream, 1)
    config = proxied["config"].replace(initial_position="LATEST", broadcast=broadcast)
    consumer = AsyncKinesumer(config)
    sink: list[tuple[str, Record]] = []

    async def run() -> None:
        async for record in consumer.consume([stream]):
            sink.append(("c", record))

    task = asyncio.create_task(run())
    await caught_up(consumer, 1)
    # Hold the fetcher's next GetRecords (no answer) while r1 arrives and the expiry is armed
    # behind the hold; removing the hold drops the held call, whose retry meets the expiry.
    hold = proxy.add_rule(Fault.blackhole(), operation="GetRecords")
    await eventually(
        lambda: proxy.stats()[GET_RECORDS].faults[FaultKind.BLACKHOLE] >= 1, what="a held read"
    )
    produced = put(url, stream, 1, 1)
    expiry = proxy.add_rule(Fault.expired_iterator(), operation="GetRecords", count=1)
    hold.remove()
    await eventually(
        lambda: proxy.stats()[GET_RECORDS].faults[FaultKind.EXPIRED_ITERATOR] == 1,
        what="the expiry",
    )
    expiry.remove()
    produced += put(url, stream, 2, 1)
    await eventually(lambda: b"2" in datas(sink), what="r2")
    await asyncio.sleep(1.0)  # r1, if it comes at all, came first
    await consumer.aclose()
    await asyncio.wait_for(task, 10)
    assert sorted(datas(sink)) == sorted(produced)


@pytest.fixture
def env(kinesalite: Any, dynalite: Any, unique_name: Names) -> dict[str, Any]:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
        commit_interval=600,  # no checkpoint unless a handoff writes one
    )
    create_table(config)
    return {"url": kinesalite.url, "config": config, "stream": unique_name("s")}


def member(
    config: Config, name: str, stream: str, sink: list[tuple[str, Record]], efo: FakeEfo | None
) -> Member:
    if efo is not None:
        config = config.replace(enhanced_fan_out=True)
    joined = Member(config.replace(client_id=name), [stream], sink)
    if efo is not None:
        engine_of(joined.consumer).efo_transport = efo.transport()
    return joined


@pytest.mark.parametrize("fan_out", [False, True], ids=["polling", "efo"])
async def test_a_handoff_before_the_first_checkpoint_loses_nothing(
    env: dict[str, Any], fan_out: bool
) -> None:
    """Member A alone on 2 shards at LATEST; 80 records arrive while its application has not
    polled yet (A fetched them; nothing is processed, nothing checkpointed). B joins and a shard
    moves: B reads it from where A began, so every record is delivered (at least once)."""
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 2)
    efo = FakeEfo(url) if fan_out else None
    sink: list[tuple[str, Record]] = []
    first = member(config, "a", stream, sink, efo)
    await first.consumer.subscribe([stream])  # joined, reading; the application polls later
    if fan_out:
        await eventually(lambda: len(first.owned()) == 2, what="A's shards")
        await eventually(lambda: len(efo.opened) == 2, what="A's subscriptions open at LATEST")
    else:
        await caught_up(first.consumer, 2)
    produced = put(url, stream, 0, 80)
    await eventually(lambda: first.consumer.stats().buffered_records >= 40, what="A fetched")
    second = member(config, "b", stream, sink, efo).start()
    await eventually(lambda: len(second.owned()) == 1, what="a shard moved to B")
    first.start()  # A's application polls at last
    await eventually(lambda: set(datas(sink)) >= set(produced), timeout=60, what="every record")
    await first.close()
    await second.close()
    assert set(datas(sink)) == set(produced)


async def test_a_close_before_the_first_checkpoint_loses_nothing(env: dict[str, Any]) -> None:
    """Member A reads from LATEST, fetches records its application never polled, and closes:
    the handoff writes no position; B, started later, reads from where A began."""
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 1)
    sink: list[tuple[str, Record]] = []
    first = member(config, "a", stream, sink, None)
    await first.consumer.subscribe([stream])
    await caught_up(first.consumer, 1)
    produced = put(url, stream, 0, 30)
    await eventually(lambda: first.consumer.stats().buffered_records >= 30, what="A fetched")
    await first.consumer.aclose()
    produced += put(url, stream, 30, 10)
    second = member(config, "b", stream, sink, None).start()
    await eventually(lambda: set(datas(sink)) >= set(produced), timeout=60, what="every record")
    await second.close()
    assert set(datas(sink)) == set(produced)


@pytest.mark.parametrize("fan_out", [False, True], ids=["polling", "efo"])
async def test_a_crash_before_the_first_checkpoint_loses_nothing(
    env: dict[str, Any], fan_out: bool
) -> None:
    """Member A reads 2 shards from LATEST and dies (kill -9) before its first checkpoint,
    with records fetched and delivered; B takes both shards over and delivers every record
    that arrived since A opened them, and none of those written well before (kinesalite takes
    the scan that stands in for AT_TIMESTAMP: it must skip them)."""
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 2)
    old = put(url, stream, 1000, 20)
    await asyncio.sleep(SERVER_CLOCK_MARGIN_MS / 1000 + 1.5)  # older than any start, margin in
    efo = FakeEfo(url) if fan_out else None
    sink: list[tuple[str, Record]] = []
    first = member(config, "a", stream, sink, efo).start()
    if fan_out:
        await eventually(lambda: len(first.owned()) == 2, what="A's shards")
        await eventually(lambda: len(efo.opened) == 2, what="A's subscriptions open at LATEST")
    else:
        await caught_up(first.consumer, 2)
    produced = put(url, stream, 0, 80)
    await eventually(lambda: len(sink) >= 10, what="A delivered some")
    await first.crash()
    async with state_store(config) as store:
        checkpoints = await store.get_checkpoints(stream)
    assert all(c.sequence_number is None for c in checkpoints.values())  # before any checkpoint
    assert all(c.started_at_ms is not None for c in checkpoints.values())
    produced += put(url, stream, 80, 20)
    second = member(config, "b", stream, sink, efo).start()
    await eventually(lambda: set(datas(sink)) >= set(produced), timeout=60, what="every record")
    await second.close()
    assert set(datas(sink)) == set(produced)
    assert not set(old) & set(datas(sink))


class Deregistrable:
    """The stand-in EFO transport with a consumer an operator can deregister: a subscription
    through an ARN that is no longer the registered one answers ResourceNotFoundException (at
    once, or in the middle of an open subscription, as AWS ends it); registering again makes a
    new ARN. Stream ARNs come from DescribeStreamSummary, so a deleted stream is found gone."""

    def __init__(self, url: str) -> None:
        self.fake = FakeEfo(url)
        self.current: str | None = None
        self.registrations = 0

    def transport(self) -> EfoTransport:
        async def arn_of(client: Any, stream: str) -> str:
            return await stream_arn(client, stream, stats=RequestStats())

        async def register(client: Any, arn: str, name: str) -> str:
            if self.current is None:
                self.registrations += 1
                self.current = f"{arn}/consumer/{name}:{self.registrations}"
            return self.current

        return EfoTransport(arn_of, register, lambda: self)

    def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[Any]:
        return self._checked(consumer_arn, shard_id, position)

    async def _checked(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[Any]:
        if consumer_arn != self.current:
            raise FakeSubscribeError("ResourceNotFoundException")
        events = self.fake.subscribe(consumer_arn, shard_id, position)
        try:
            async for event in events:
                if consumer_arn != self.current:  # deregistered: AWS ends the subscription
                    raise FakeSubscribeError("ResourceNotFoundException")
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]


async def test_efo_a_deregistered_consumer_is_registered_again_and_reading_resumes(
    env: dict[str, Any],
) -> None:
    """Issue 17, item 5: ``kinesumer deregister-consumer`` while members read: the member
    registers the consumer again and goes on where it was: nothing lost, nothing replayed."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 2)
    efo = Deregistrable(url)
    sink: list[tuple[str, Record]] = []
    joined = Member(env["config"].replace(enhanced_fan_out=True), [stream], sink)
    engine_of(joined.consumer).efo_transport = efo.transport()
    joined.start()
    await eventually(lambda: len(joined.owned()) == 2, what="the shards")
    await eventually(lambda: len(efo.fake.opened) == 2, what="the subscriptions open at LATEST")
    produced = put(url, stream, 0, 100)
    await eventually(lambda: len(sink) >= 100, what="records before the deregistration")
    efo.current = None  # the operator deregistered the consumer
    produced += put(url, stream, 100, 100)
    await eventually(lambda: len(sink) >= 200 or joined.error is not None, what="the rest")
    assert joined.error is None
    await joined.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    assert efo.registrations == 2


async def test_efo_a_deleted_stream_still_raises_stream_not_found(env: dict[str, Any]) -> None:
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 1)
    efo = Deregistrable(url)
    sink: list[tuple[str, Record]] = []
    joined = Member(env["config"].replace(enhanced_fan_out=True), [stream], sink)
    engine_of(joined.consumer).efo_transport = efo.transport()
    joined.start()
    await eventually(lambda: len(joined.owned()) == 1, what="the shard")
    kinesis(url).delete_stream(StreamName=stream)
    efo.current = None  # a deleted stream's consumers go with it
    await eventually(lambda: joined.error is not None, what="the failure")
    assert isinstance(joined.error, StreamNotFoundError)
    with contextlib.suppress(StreamNotFoundError):  # the task ended with it
        await joined.close()


async def test_the_recorded_start_is_fenced_kept_and_forgotten_by_a_reset(
    env: dict[str, Any],
) -> None:
    """``started_at`` on the checkpoint item: written only under the claim's owner and lease,
    never moved later, absent from older items (they still read), removed by an operator's
    reset (which restarts the shard from the initial position)."""
    config = env["config"]
    async with state_store(config) as store:
        assert await store.move_checkpoint("s", "shard-1", None, None)  # an older item's shape
        (seen,) = (await store.get_checkpoints("s")).values()
        assert seen.started_at_ms is None
        claimed = await store.claim("s", "shard-1", "a", seen)
        assert claimed is not None
        assert await store.record_start(claimed, 2_000)
        assert await store.record_start(claimed, 3_000)  # kept: a start never moves later
        (read,) = (await store.get_checkpoints("s")).values()
        assert (read.started_at_ms, read.sequence_number) == (2_000, None)
        taken = await store.claim("s", "shard-1", "b", read)
        assert taken is not None and taken.started_at_ms == 2_000  # the next owner sees it
        assert not await store.record_start(claimed, 1_000)  # an older lease: refused
        assert await store.move_checkpoint("s", "shard-1", taken, None)
        (reset,) = (await store.get_checkpoints("s")).values()
        assert reset.started_at_ms is None


async def test_efo_a_subscription_refused_before_its_first_event_skips_nothing(
    env: dict[str, Any],
) -> None:
    """The first subscriptions are refused (ResourceInUse, as during a takeover) while records
    arrive: every one, the first included, starts from where the read began (the recorded
    instant), never at LATEST, which would begin only when the subscription is established."""
    url, stream = env["url"], env["stream"]
    create_stream(url, stream, 1)
    fake = FakeEfo(url, busy_first=3)
    sink: list[tuple[str, Record]] = []
    joined = member(env["config"], "a", stream, sink, fake).start()
    await eventually(lambda: len(fake.positions) >= 1, what="the first attempt")
    assert fake.positions[0][1]["Type"] in ("AT_TIMESTAMP", "TRIM_HORIZON")
    produced = put(url, stream, 0, 20)
    try:
        await eventually(lambda: len(sink) >= 20, what="every record")
    finally:
        await joined.close()
    assert sorted(datas(sink)) == sorted(produced)


async def test_efo_kinesis_local_deregistered_consumer_is_registered_again(
    kinesis_local: Any, dynalite: Any, unique_name: Names
) -> None:
    """The same on kinesis-local, with the real transport. Its open subscriptions outlive a
    deregistration, so the member meets the gone consumer when it next subscribes: after the
    operator deregistered the consumer, B joins (registering a new one) and leaves, and A
    subscribes to the shard B handed back through the ARN it knew."""
    config = make_config(
        kinesis_local.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        enhanced_fan_out=True,
    )
    create_table(config)
    url, stream = kinesis_local.url, unique_name("s")
    create_stream(url, stream, 2)
    sink: list[tuple[str, Record]] = []
    first = Member(config.replace(client_id="a"), [stream], sink).start()
    produced = put(url, stream, 0, 50)
    await eventually(lambda: len(sink) >= 50, timeout=60, what="records before")
    client = kinesis(url)
    arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    client.deregister_stream_consumer(StreamARN=arn, ConsumerName=config.app)
    await eventually(
        lambda: not client.list_stream_consumers(StreamARN=arn)["Consumers"],
        what="the consumer deleted",
    )
    second = Member(config.replace(client_id="b"), [stream], sink).start()
    await eventually(lambda: len(second.owned()) == 1, timeout=60, what="B's shard")
    await second.close()
    produced += put(url, stream, 50, 50)
    try:
        await eventually(
            lambda: len(set(datas(sink))) >= 100 or first.error is not None,
            timeout=60,
            what="the rest",
        )
    finally:
        await first.close()
    assert first.error is None
    assert set(datas(sink)) == set(produced)
