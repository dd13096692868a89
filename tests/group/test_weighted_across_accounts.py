"""Load-aware assignment (``assignment="weighted"``) over streams of two accounts and two regions
with very different shard counts and loads: ``orders`` in account A's us-east-1 (the home, by
name, 6 light shards), A's eu-west-1 (by ARN, 2 light shards) and B's us-east-1 (by ARN, one
shard taking large records at a high rate), read by three members.

Kinesis is in memory, one MemoryKinesis per place behind the routing transport
(``tests/support/memory_places.py``). The state is dynalite's: the operator controls, the load
reports and the leader's weights are items of the DynamoDB table (a member given a
``MemoryState`` has no controls, and assigns by range). The published weights are read back
with the library's codecs (``kinesumer.statestore.dynamodb.controls``), as every member reads
them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from support.group import FAST, setup_table
from support.memory_places import NAME, STREAMS, three_places
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import AsyncKinesumer, Config
from kinesumer.core import assign
from kinesumer.core.weighted import default_weight, weighted_assign
from kinesumer.group import controls as engine_controls
from kinesumer.statestore.dynamodb.controls import (
    Publication,
    decode_numbers,
    decode_publication,
    load_pk,
    split_name,
    weights_key,
)
from kinesumer.testing import MemoryKinesis

WAIT = 90.0  # a bound for a busy machine, not a figure
SHARDS = {"a-us": 6, "a-eu": 2, "b-us": 1}
MEMBERS = ("m1", "m2", "m3")
HEAVY = b"x" * 4096  # B's records: 16 of these every 0.25 s, about 256 KiB/s on one shard
LIGHT = b"y" * 48  # every other shard: one of these every 0.25 s, about 256 B/s

Shard = tuple[str, str]  # (state key, shard id)


@pytest.fixture
def quick_controls() -> Iterator[None]:
    """Members read the weights every 0.5 s instead of 5 s, so the test waits less."""
    saved = engine_controls.READ_EVERY
    engine_controls.READ_EVERY = 0.5
    yield
    engine_controls.READ_EVERY = saved


class Places:
    """The three streams, their shards, and what was put (an id per record: ``<tag>:<n>``)."""

    def __init__(self) -> None:
        self.memories, self.kinesis = three_places(SHARDS)
        self.shards: dict[str, dict[str, str]] = {}  # state key -> shard id -> its first hash
        self.put: list[bytes] = []
        self.count = 0

    async def list(self) -> None:
        for tag, memory in self.memories.items():
            page = await memory.list_shards(NAME)
            self.shards[STREAMS[tag]] = {
                s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in page["Shards"]
            }

    def all_shards(self) -> set[Shard]:
        return {(stream, sid) for stream, ids in self.shards.items() for sid in ids}

    def round(self) -> None:
        """One round of puts: B's shard heavy, one small record on every other shard."""
        for tag, memory in self.memories.items():
            for first_hash in self.shards[STREAMS[tag]].values():
                heavy = tag == "b-us"
                for _ in range(16 if heavy else 1):
                    self.put_one(memory, tag, first_hash, HEAVY if heavy else LIGHT)

    def put_one(self, memory: MemoryKinesis, tag: str, first_hash: str, body: bytes) -> None:
        ident = f"{tag}:{self.count}".encode()
        self.count += 1
        memory.put(NAME, ident + b"|" + body, "k", explicit_hash_key=first_hash)
        self.put.append(ident)


class Reader:
    """A member consuming the three streams in a task of its own, recording each record's id."""

    def __init__(self, consumer: AsyncKinesumer, sink: list[bytes]) -> None:
        self.consumer, self.sink = consumer, sink
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for record in self.consumer.consume(list(STREAMS.values())):
                self.sink.append(record.data.partition(b"|")[0])
        except Exception as exc:  # reported by the test
            self.error = exc
            raise

    def owned(self) -> set[Shard]:
        return {
            (s.stream, s.shard_id) for s in self.consumer.stats().shards if s.status == "active"
        }

    async def close(self) -> None:
        await self.consumer.aclose()
        await asyncio.wait_for(self.task, WAIT)


class Table:
    """The leader's publication and the members' load reports, as items and as the library
    decodes them; refreshed by a task of its own (strongly consistent reads)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.client: Any = boto3.client(
            "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name=config.region
        )
        self.weights_item: dict[str, Any] = {}
        self.publication = Publication()
        self.load_items: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._watch())

    def _read(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        name = self.config.dynamodb_table
        item = self.client.get_item(
            TableName=name, Key=weights_key(self.config.app), ConsistentRead=True
        ).get("Item", {})
        loads = self.client.query(
            TableName=name,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": load_pk(self.config.app)}},
            ConsistentRead=True,
        )["Items"]
        return item, loads

    async def _watch(self) -> None:
        while True:
            self.weights_item, self.load_items = await asyncio.to_thread(self._read)
            self.publication = decode_publication(self.weights_item or None)
            await asyncio.sleep(0.2)

    def close(self) -> None:
        self.task.cancel()


def raw_names(item: dict[str, Any], attribute: str) -> set[str]:
    return set(item.get(attribute, {}).get("M", {}))


@pytest.mark.timeout(240)
async def test_weights_split_streams_of_two_accounts_and_regions_by_load(
    dynalite: NodeStandIn, unique_name: Any, quick_controls: None
) -> None:
    config = Config(
        app=unique_name("app"),
        dynamodb_table=unique_name("table"),
        region="us-east-1",
        dynamodb_endpoint=dynalite.url,
        initial_position="TRIM_HORIZON",
        assignment="weighted",
    ).replace(**{**FAST, "client_timeout": 4.0, "shard_sync_interval": 1.0})
    setup_table(config)
    places = Places()
    await places.list()
    every = places.all_shards()
    heavy = next(s for s in every if s[0] == STREAMS["b-us"])
    sink: list[bytes] = []
    readers = [
        Reader(AsyncKinesumer(config.replace(client_id=m), kinesis=places.kinesis), sink)
        for m in MEMBERS
    ]
    table = Table(config)
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            places.round()
            await asyncio.sleep(0.25)

    producer = asyncio.create_task(produce())

    async def close_all() -> None:
        table.close()
        await asyncio.gather(*(r.close() for r in readers), return_exceptions=True)

    def owners() -> dict[str, set[Shard]]:
        return {m: r.owned() for m, r in zip(MEMBERS, readers, strict=True)}

    def weighted_now() -> dict[str, set[Shard]]:
        """The assignment every member computes from the weights published now."""
        members = {m: set(STREAMS.values()) for m in MEMBERS}
        shards = {stream: list(ids) for stream, ids in places.shards.items()}
        result = weighted_assign(members, shards, table.publication.weights)
        return {m: {(s, sid) for s, ids in by.items() for sid in ids} for m, by in result.items()}

    def published() -> bool:
        weights = table.publication.weights
        measured = {(s, sid): w for s, by in weights.items() for sid, w in by.items()}
        light = [w for shard, w in measured.items() if shard != heavy]
        return set(measured) == every and measured[heavy] > 64 * max(light)

    def reported() -> set[Shard]:
        """The shards the load reports name, as the leader decodes them."""
        rates = [decode_numbers(item, "rates") for item in table.load_items]
        return {(s, sid) for by_stream in rates for s, by in by_stream.items() for sid in by}

    try:
        await eventually(
            published,
            WAIT,
            "weights of all nine shards, B's the heaviest by far",
            lambda: f"published: {table.publication.weights}",
        )
        await eventually(
            # A shard in handoff is reported by nobody for a moment (it then counts as the
            # mean): the split is judged on reports and a publication that weigh all nine.
            lambda: published() and reported() == every and owners() == weighted_now(),
            WAIT,
            "the members holding what the published weights give them",
            lambda: (
                f"owners: {owners()}\nweighted: {weighted_now()}\n"
                f"errors: {[r.error for r in readers]}"
            ),
        )
        settled, weights = owners(), table.publication.weights
        weights_item, load_items = table.weights_item, table.load_items
    except BaseException:
        await close_all()
        raise
    finally:
        stop.set()
        await producer

    try:
        for _ in range(4):  # and some after it
            places.round()
        # (1) The load reports and the weights are keyed by each stream's state key: the ARN for
        # A's eu-west-1 and B's stream, the plain name for the home one; each key parses back to
        # a stream and a shard it has (no key cut at a ':' or a '/' of the ARN).
        names = {f"{stream}/{sid}" for stream, sid in every}
        assert raw_names(weights_item, "weights") == names
        assert {split_name(name) for name in names} == every
        assert set(weights) == set(STREAMS.values())
        assert load_items
        for item in load_items:
            assert raw_names(item, "rates") <= names, item["sk"]
            assert set(decode_numbers(item, "rates")) <= set(STREAMS.values()), item["sk"]

        # (2) The documented bound, with the published weights: the heaviest member's total is
        # within the largest single weight of a perfect split ...
        fallback = default_weight(weights)

        def weight(shard: Shard) -> float:
            return weights.get(shard[0], {}).get(shard[1], fallback)

        loads = {m: sum(weight(s) for s in held) for m, held in settled.items()}
        total = sum(weight(s) for s in every)
        assert max(loads.values()) <= total / len(MEMBERS) + max(weight(s) for s in every)
        # ... and the weights moved shards across accounts: B's heavy shard's owner holds fewer
        # shards than equal counts (range) would give the member holding it.
        (heavy_owner,) = (m for m, held in settled.items() if heavy in held)
        by_range = assign(
            {m: set(STREAMS.values()) for m in MEMBERS},
            {stream: list(ids) for stream, ids in places.shards.items()},
        )
        (range_owner,) = (m for m, by in by_range.items() if heavy[1] in by.get(heavy[0], ()))
        range_count = sum(len(ids) for ids in by_range[range_owner].values())
        assert len(settled[heavy_owner]) < range_count, (settled, by_range)

        # (3) Every record put before, during and after the weighted rebalance is read, once
        # (a rebalance hands a shard over with its checkpoint: no duplicate).
        await eventually(
            lambda: set(sink) >= set(places.put),
            WAIT,
            "every record put",
            lambda: f"{len(set(places.put) - set(sink))} of {len(places.put)} missing",
        )
    finally:
        await close_all()
    assert all(r.error is None for r in readers), [r.error for r in readers]
    twice = [ident for ident, n in Counter(sink).items() if n > 1]
    assert not twice, f"{len(twice)} records read twice, e.g. {twice[:5]}"
    assert set(sink) == set(places.put)
