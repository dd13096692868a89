"""Enhanced fan-out on Kinesis streams given by ARN, in other accounts and regions: a group reads
``orders`` in account A's us-east-1 (the home, given by name), A's eu-west-1 and B's us-east-1
(given by ARN) through subscriptions, each stream's consumer registered, subscribed to and
deregistered in its own place.

Each place is a MemoryKinesis of its own (its stream ARNs and consumer ARNs carry its account and
region, and it serves SubscribeToShard), behind the routing transport
(``tests/support/memory_places.py``). moto in server mode keeps consumers per account and region
too, but serves no SubscribeToShard: ``tests/consumer/test_efo_by_arn_moto.py`` checks the
registration there.

A member's kill is an in-process crash (no handoff, no final checkpoint)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import pytest
from support.memory_places import NAME, PLACES, STREAMS, A, B, MemoryPlaces, arn, three_places
from support.wait import eventually

from kinesumer import AccessDeniedError, AccountAccessError, AsyncKinesumer, Config, Record
from kinesumer.admin import deregister_stream_consumer
from kinesumer.config import check_streams_for
from kinesumer.consumer.base import engine_of
from kinesumer.errors import ConfigError
from kinesumer.kinesis.routing import RoutingTransport
from kinesumer.testing import MemoryKinesis, MemoryState

CONSUMER = "shop-efo"
WAIT = 60.0  # a bound for a busy machine, not a figure


class Env:
    def __init__(self) -> None:
        self.memories, self.kinesis = three_places(dict.fromkeys(PLACES, 2))
        self.state = MemoryState()
        self.config = Config(
            app="shop",
            dynamodb_table="kinesumer-state",
            region="us-east-1",
            initial_position="TRIM_HORIZON",
            heartbeat_interval=0.5,
            client_timeout=5.0,
            commit_interval=0.2,
            enhanced_fan_out=True,
            consumer_name=CONSUMER,
        )

    def member(self, client_id: str) -> AsyncKinesumer:
        return AsyncKinesumer(
            self.config.replace(client_id=client_id), kinesis=self.kinesis, state=self.state
        )

    def put(self, tag: str, start: int, count: int) -> set[bytes]:
        """Records ``<tag>:k<n % 8>:<n>``, one by one (a key's records keep their order)."""
        datas = [f"{tag}:k{n % 8}:{n}".encode() for n in range(start, start + count)]
        for data in datas:
            self.memories[tag].put(NAME, data, data.decode().split(":")[1])
        return set(datas)

    async def consumers(self, tag: str) -> list[str]:
        account, region = PLACES[tag]
        page = await self.memories[tag].list_stream_consumers(arn(region, account))
        return [c["ConsumerName"] for c in page["Consumers"]]


@pytest.fixture
def env() -> Iterator[Env]:
    yield Env()


class Reader:
    """A member consuming the three streams in a task of its own, recording every delivery."""

    def __init__(self, consumer: AsyncKinesumer, sink: list[Record]) -> None:
        self.consumer, self.sink = consumer, sink
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for record in self.consumer.consume(list(STREAMS.values())):
                self.sink.append(record)
        except Exception as exc:  # reported by the test
            self.error = exc
            raise

    def flushed(self) -> bool:
        """Every shard it holds is checkpointed at the last record it delivered from it."""
        last = {(r.stream, r.shard_id): r.sequence_number for r in self.sink}
        active = [s for s in self.consumer.stats().shards if s.status == "active"]
        return bool(active) and all(
            s.checkpoint == last.get((s.stream, s.shard_id)) for s in active
        )

    async def crash(self) -> None:
        self.task.cancel()
        await engine_of(self.consumer).abort()

    async def close(self) -> None:
        await self.consumer.aclose()
        await asyncio.wait_for(self.task, WAIT)


def first_seen_in_order(got: list[Record]) -> dict[tuple[str, str], list[int]]:
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for record in got:
        _, key, n = record.data.decode().split(":")
        if int(n) not in seen[(record.stream, key)]:
            seen[(record.stream, key)].append(int(n))
    return seen


async def test_a_group_reads_a_name_and_arns_of_two_accounts_and_regions_through_subscriptions(
    env: Env,
) -> None:
    expected = {STREAMS[tag]: env.put(tag, 0, 40) for tag in PLACES}
    sink: list[Record] = []
    first, second = Reader(env.member("m1"), sink), Reader(env.member("m2"), sink)
    readers = [first, second]

    def delivered() -> dict[str, set[bytes]]:
        found: dict[str, set[bytes]] = defaultdict(set)
        for record in sink:
            found[record.stream].add(record.data)
        return found

    try:
        await eventually(lambda: delivered() == expected, WAIT, "the first 120 records")
        await eventually(first.flushed, WAIT, "m1's checkpoints written")
        await first.crash()
        third = Reader(env.member("m3"), sink)
        readers = [second, third]
        for tag in PLACES:
            expected[STREAMS[tag]] |= env.put(tag, 40, 40)
        await eventually(
            lambda: delivered() == expected,
            WAIT,
            "every record after the crash and the join",
            lambda: f"missing: { {s: len(expected[s] - delivered()[s]) for s in expected} }",
        )
        for reader in readers:  # read through subscriptions, none fell back to polling
            assert not any(s.efo_polling for s in reader.consumer.stats().shards)
    finally:
        await asyncio.gather(*(r.close() for r in readers), return_exceptions=True)

    assert all(r.error is None for r in readers), [r.error for r in readers]
    assert {r.stream for r in sink} == set(STREAMS.values())
    for (stream, key), numbers in first_seen_in_order(sink).items():
        assert numbers == sorted(numbers), (stream, key)
    for tag, stream in STREAMS.items():  # each stream's records from its own place
        assert all(r.data.decode().startswith(f"{tag}:") for r in sink if r.stream == stream)
    # The consumer lives on each stream, in the stream's own account and region: registered
    # once there, whichever member came first.
    for tag in PLACES:
        consumers = await env.consumers(tag)
        assert consumers == [CONSUMER], tag
    account, region = PLACES["b-us"]
    described = await env.memories["b-us"].describe_stream_consumer(arn(region, account), CONSUMER)
    assert described["ConsumerARN"].startswith(f"arn:aws:kinesis:{region}:{B}:stream/{NAME}/")


async def test_the_consumer_is_deregistered_per_stream_in_its_own_account_and_region(
    env: Env,
) -> None:
    env.put("b-us", 0, 4)
    consumer = env.member("m1")
    async with consumer:
        await consumer.subscribe(list(STREAMS.values()))
    for tag in PLACES:
        assert await env.consumers(tag) == [CONSUMER]

    assert await deregister_stream_consumer(env.config, STREAMS["b-us"], kinesis=env.kinesis)
    assert await env.consumers("b-us") == []
    assert await env.consumers("a-us") == [CONSUMER]
    assert await env.consumers("a-eu") == [CONSUMER]
    # Twice: none of that name is left there.
    assert not await deregister_stream_consumer(env.config, STREAMS["b-us"], kinesis=env.kinesis)

    assert await deregister_stream_consumer(env.config, STREAMS["a-eu"], kinesis=env.kinesis)
    assert await deregister_stream_consumer(env.config, NAME, kinesis=env.kinesis)
    for tag in PLACES:
        assert await env.consumers(tag) == []

    with pytest.raises(ConfigError, match="no stream consumers"):
        await deregister_stream_consumer(
            env.config,
            "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000",
            kinesis=env.kinesis,
        )


async def test_a_deregistered_consumer_of_another_account_is_registered_again_and_reading_goes_on(
    env: Env,
) -> None:
    sink: list[Record] = []
    reader = Reader(env.member("m1"), sink)
    try:
        first = env.put("b-us", 0, 20)
        await eventually(lambda: {r.data for r in sink} >= first, WAIT, "B's first records")
        assert await deregister_stream_consumer(env.config, STREAMS["b-us"], kinesis=env.kinesis)
        later = env.put("b-us", 20, 20)
        await eventually(lambda: {r.data for r in sink} >= first | later, WAIT, "B's later ones")
    finally:
        await reader.close()
    assert reader.error is None
    assert len([r for r in sink if r.stream == STREAMS["b-us"]]) == 40  # none read twice
    assert await env.consumers("b-us") == [CONSUMER]


async def test_a_role_without_register_stream_consumer_is_a_named_error_at_subscribe(
    env: Env,
) -> None:
    env.memories["b-us"].fail_next(
        "RegisterStreamConsumer", code="AccessDeniedException", times=100
    )
    consumer = env.member("m1")
    async with consumer:
        with pytest.raises(AccessDeniedError, match="kinesis:RegisterStreamConsumer") as caught:
            await consumer.subscribe(list(STREAMS.values()))
    assert B in str(caught.value)  # the stream ARN, its account with it


async def test_an_account_it_cannot_reach_is_a_named_error_at_subscribe(env: Env) -> None:
    stranger = "222222222222"
    consumer = env.member("m1")
    async with consumer:
        with pytest.raises(AccountAccessError, match=stranger):
            await consumer.subscribe([NAME, arn("us-east-1", stranger)])


def test_fan_out_takes_kinesis_arns_and_still_refuses_a_table_stream() -> None:
    config = Config(app="shop", dynamodb_table="state", enhanced_fan_out=True)
    check_streams_for(config, (NAME, arn("eu-west-1", B)))
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000"
    with pytest.raises(ConfigError, match="DynamoDB Streams has no enhanced fan-out"):
        check_streams_for(config, (arn("eu-west-1", B), table))


async def test_a_subscription_denied_in_another_account_is_raised_not_retried(env: Env) -> None:
    """consume() raises the refusal (a given transport's error as it raised it): the fetcher of
    B's shard does not subscribe again and again while the other places read on."""
    env.put("b-us", 0, 4)
    env.memories["b-us"].fail_next("SubscribeToShard", code="AccessDeniedException", times=1000)
    consumer = env.member("m1")
    with pytest.raises(Exception, match="AccessDeniedException"):
        async with consumer:
            async for _ in consumer.consume(list(STREAMS.values())):
                pass


async def test_a_home_stream_named_consumer_keeps_its_subscriptions_home_without_asking() -> None:
    """A consumer ARN holds ``/consumer/`` once more when its stream is named ``consumer``:
    the stream's ARN is what comes before the last one (consumer names hold no ``/``)."""
    home = MemoryKinesis(account=A, region="us-east-1")
    home.create_stream("consumer")
    home.put("consumer", b"x", "k")
    places = MemoryPlaces({"a-us": home})
    kinesis = RoutingTransport(home, MemoryKinesis(), places)
    summary = await kinesis.describe_stream_summary("consumer")
    stream = summary["StreamDescriptionSummary"]["StreamARN"]
    registered = await kinesis.register_stream_consumer(stream, "consumer")
    events = kinesis.subscribe_to_shard(
        registered["ConsumerARN"], "shardId-000000000000", {"Type": "TRIM_HORIZON"}
    )
    first = await anext(aiter(events))
    await events.aclose()  # type: ignore[attr-defined]
    assert [r["Data"] for r in first.records] == [b"x"]
    assert places.asked == set()  # a group reading names never asks where its account is
