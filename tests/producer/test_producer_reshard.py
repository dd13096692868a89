"""The producer across splits it cannot list (ListShards refused past a listing's retries, or
answered before a later split): each partition key's records are on shards of one line of
descent (a shard, then one child of it), in put order as a reader meets them, and none is lost.
A reader finishes a parent before its children but reads siblings side by side, so a key on two
siblings could be read out of put order. With ``aggregate=True`` an aggregate lands, keys and
all, where its first record's hash key goes: the producer pins its keys there from the
PutRecords answer (``StreamWriter._pin``). Without aggregation every record goes by its own hash
key: the same tests hold it.

Also what a refused listing costs: puts do not wait for it (a listing that never answers does
not hold a flush)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from itertools import combinations, pairwise
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy, OpKey
from support.group import create_stream, kinesis
from support.produced import read_all
from support.standins import NodeStandIn
from support.wait import wait_until

from kinesumer import Producer, PutResult
from kinesumer.producer import stream as stream_writer
from kinesumer.producer.records import key_hash

KEYS = 30
ROUND = 100
#: Attempts of one listing (kinesumer.aws.retry.call_with_retry's default).
LISTING_ATTEMPTS = 6
LIST_SHARDS = OpKey("kinesis", "ListShards")


def put_round(producer: Producer, stream: str, start: int) -> list[PutResult]:
    """Put records numbered ``start`` .. ``start + ROUND - 1`` over ``KEYS`` keys and flush;
    where each landed."""
    futures = [
        producer.put(stream, b"%d" % i, partition_key=f"key-{i % KEYS}")
        for i in range(start, start + ROUND)
    ]
    producer.flush()
    return [future.result() for future in futures]


def split_in_two(url: str, stream: str, shard_id: str | None = None) -> str:
    """Split a shard (default: the stream's first) at the middle of its range; its id."""
    client = kinesis(url)
    shards = client.list_shards(StreamName=stream)["Shards"]
    shard = next(s for s in shards if shard_id in (None, s["ShardId"]))
    low, high = (int(shard["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    return str(shard["ShardId"])


def listed(proxy: FaultProxy) -> int:
    """ListShards calls Kinesis answered (through the proxy)."""
    stats = proxy.stats().get(LIST_SHARDS)
    return 0 if stats is None else stats.forwarded


def round_until_listed(producer: Producer, stream: str, start: int, proxy: FaultProxy) -> int:
    """Rounds of puts until the producer listed the shards again (it may list only once a put
    shows it the map is stale); the next number."""
    before = listed(proxy)
    numbers = [start]

    def another_round() -> bool:
        put_round(producer, stream, numbers[-1])
        numbers.append(numbers[-1] + ROUND)
        return listed(proxy) > before

    wait_until(another_round, timeout=60, what="the shards listed again", interval=0.1)
    return numbers[-1]


def check_each_key_on_one_line(url: str, stream: str, numbers: int) -> dict[str, set[str]]:
    """Every record once; no key on two shards of which neither descends from the other (a
    reader reads those side by side); each key's records in put order as a reader meets them
    (a parent before its children). Each key's shards."""
    shards = kinesis(url).list_shards(StreamName=stream)["Shards"]
    parents = {
        s["ShardId"]: {s.get("ParentShardId"), s.get("AdjacentParentShardId")} - {None}
        for s in shards
    }

    def ancestors(shard_id: str) -> set[str]:
        found: set[str] = set()
        todo = list(parents[shard_id])
        while todo:
            parent = todo.pop()
            if parent in parents and parent not in found:
                found.add(parent)
                todo.extend(parents[parent])
        return found

    order = [s["ShardId"] for s in shards]
    assert all(order.index(p) < order.index(c) for c in order for p in ancestors(c))
    records = read_all(url, stream)  # shard by shard as listed: parents first
    assert sorted(int(r.data) for r in records) == list(range(numbers))  # each record once
    on: dict[str, set[str]] = {}
    for record in records:
        on.setdefault(record.partition_key, set()).add(record.shard_id)
    apart = sorted(
        key
        for key, held in on.items()
        if any(a not in ancestors(b) and b not in ancestors(a) for a, b in combinations(held, 2))
    )
    assert apart == [], f"{len(apart)} of {len(on)} keys on sibling shards"
    per_key: dict[str, list[int]] = {}
    for record in records:
        per_key.setdefault(record.partition_key, []).append(int(record.data))
    for key, put_order in per_key.items():
        assert all(a < b for a, b in pairwise(put_order)), key
    return on


@pytest.mark.parametrize("aggregate", [True, False], ids=["aggregated", "plain"])
def test_each_key_stays_on_one_child_while_the_split_cannot_be_listed(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
    aggregate: bool,
) -> None:
    stream = unique_name("rs")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    with Producer(
        kinesis_endpoint=proxy.url, region="us-east-1", ordering="key", aggregate=aggregate
    ) as producer:
        number = 0
        for _ in range(3):
            put_round(producer, stream, number)
            number += ROUND
        parent = split_in_two(kinesalite.url, stream)
        refused = proxy.add_rule(Fault.throttle(), service="kinesis", operation="ListShards")
        landed: list[PutResult] = []
        for round_ in range(6):
            if round_ == 3:
                # Half the rounds while the first listing retries, half after it gave up.
                wait_until(
                    lambda: refused.fired > LISTING_ATTEMPTS,
                    what="a listing refused past its retries, and the next one refused",
                )
            landed += put_round(producer, stream, number)
            number += ROUND
        assert listed(proxy) == 1  # only the first listing, before the split, was answered
        refused.remove()
        number = round_until_listed(producer, stream, number, proxy)
        put_round(producer, stream, number)  # routed by the new map
        number += ROUND

    assert parent not in {result.shard_id for result in landed}
    if aggregate:
        assert any(result.sub_sequence_number > 0 for result in landed)
    on = check_each_key_on_one_line(kinesalite.url, stream, number)
    assert len(on) == KEYS and all(parent in held and len(held) == 2 for held in on.values())


@pytest.mark.parametrize("aggregate", [True, False], ids=["aggregated", "plain"])
def test_a_key_follows_its_shard_into_a_second_split_neither_listed(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
    aggregate: bool,
) -> None:
    """A split, then a split of the child holding most records, with ListShards refused
    throughout: each key moves only from a shard to a child of it."""
    stream = unique_name("r2")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    with Producer(kinesis_endpoint=proxy.url, region="us-east-1", aggregate=aggregate) as producer:
        number = 0
        for _ in range(2):
            put_round(producer, stream, number)
            number += ROUND
        split_in_two(kinesalite.url, stream)
        refused = proxy.add_rule(Fault.throttle(), service="kinesis", operation="ListShards")
        landed: list[PutResult] = []
        for _ in range(3):
            landed += put_round(producer, stream, number)
            number += ROUND
        busiest = Counter(result.shard_id for result in landed).most_common(1)[0][0]
        split_in_two(kinesalite.url, stream, busiest)
        for _ in range(3):
            put_round(producer, stream, number)
            number += ROUND
        assert listed(proxy) == 1
        refused.remove()
        number = round_until_listed(producer, stream, number, proxy)
        put_round(producer, stream, number)
        number += ROUND

    on = check_each_key_on_one_line(kinesalite.url, stream, number)
    grandchildren = {
        s["ShardId"]
        for s in kinesis(kinesalite.url).list_shards(StreamName=stream)["Shards"]
        if s.get("ParentShardId") == busiest
    }
    assert any(busiest in held and held & grandchildren for held in on.values())


@pytest.mark.parametrize("aggregate", [True, False], ids=["aggregated", "plain"])
def test_a_listing_that_never_answers_does_not_hold_the_puts(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
    aggregate: bool,
) -> None:
    """After a split, the map is listed again beside the puts: with ListShards held unanswered,
    rounds of puts still flush (each key's records still on one child)."""
    stream = unique_name("rh")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    with Producer(kinesis_endpoint=proxy.url, region="us-east-1", aggregate=aggregate) as producer:
        put_round(producer, stream, 0)
        split_in_two(kinesalite.url, stream)
        held = proxy.add_rule(Fault.blackhole(), service="kinesis", operation="ListShards")
        errors: list[BaseException] = []

        def five_rounds() -> None:
            try:
                for start in range(ROUND, 6 * ROUND, ROUND):
                    put_round(producer, stream, start)
            except BaseException as exc:  # the test reports it
                errors.append(exc)

        rounds = threading.Thread(target=five_rounds, daemon=True)
        rounds.start()
        try:
            # Bounded: a listing held this long would hold the flushes (the client's read
            # timeout is 10 s an attempt, six attempts a listing).
            wait_until(lambda: not rounds.is_alive(), timeout=30, what="5 rounds flushed")
            assert held.fired >= 1  # the producer did try to list the split
            assert errors == []
        finally:
            held.remove()
    check_each_key_on_one_line(kinesalite.url, stream, 6 * ROUND)


def test_a_listing_older_than_where_keys_landed_moves_none_of_them(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listing answered before a second split, applied after keys landed on that split's two
    children (one key set on each): the listing names neither child, and each set stays on its
    own. (By that listing's map both sets belong to their closed parent's lane, and one
    aggregate from there would take both to one child.) The next listing is held until the
    end, so that only the old one routes the last rounds."""
    stream = unique_name("ro")
    create_stream(kinesalite.url, stream, 1)
    answered = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    call_with_retry = stream_writer.call_with_retry
    holding = {"on": False}

    async def held_listing(operation: str, call: Any, stats: Any, **kwargs: Any) -> Any:
        answer = await call_with_retry(operation, call, stats, **kwargs)
        if operation == "kinesis.ListShards" and holding["on"]:
            which = 0 if not answered[0].is_set() else 1
            answered[which].set()
            await asyncio.to_thread(release[which].wait, 60)
        return answer

    monkeypatch.setattr(stream_writer, "call_with_retry", held_listing)
    producer = Producer(kinesis_endpoint=kinesalite.url, region="us-east-1", aggregate=True)
    try:
        number = 0
        for _ in range(2):
            put_round(producer, stream, number)
            number += ROUND
        holding["on"] = True
        split_in_two(kinesalite.url, stream)
        child = put_round(producer, stream, number)[0].shard_id  # the map is stale: listed
        number += ROUND
        wait_until(answered[0].is_set, what="the listing answered (and held)")
        split_in_two(kinesalite.url, stream, child)
        first_set = {result.shard_id for result in put_round(producer, stream, number)}
        number += ROUND
        assert len(first_set) == 1 and child not in first_set
        grandchildren = {
            s["ShardId"]: int(s["HashKeyRange"]["StartingHashKey"])
            for s in kinesis(kinesalite.url).list_shards(StreamName=stream)["Shards"]
            if s.get("ParentShardId") == child
        }
        (other,) = set(grandchildren) - first_set
        low, high = sorted(grandchildren.values())
        in_other = (
            (lambda h: h >= high) if grandchildren[other] == high else (lambda h: low <= h < high)
        )
        second_keys = [k for k in (f"new-{i}" for i in range(2000)) if in_other(key_hash(k))][:10]
        futures = [
            producer.put(stream, b"%d" % i, partition_key=second_keys[i % 10])
            for i in range(number, number + 50)
        ]
        producer.flush()
        number += 50
        assert {f.result().shard_id for f in futures} == {other}
        release[0].set()  # the listing from before the second split is applied now
        wait_until(answered[1].is_set, what="the next listing answered (and held)")
        for _ in range(3):
            for i in range(number, number + ROUND):
                key = f"key-{i % KEYS}" if i % 2 else second_keys[i % 10]
                producer.put(stream, b"%d" % i, partition_key=key)
            producer.flush()
            number += ROUND
    finally:
        for event in release:
            event.set()
        producer.close()
    check_each_key_on_one_line(kinesalite.url, stream, number)
