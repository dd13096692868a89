"""The producer across a split it cannot list: with ListShards refused for longer than one
listing's retries, a partition key's records after the split are all on one child shard, in put
order, and nothing is lost. A reader reads sibling shards side by side (only a parent comes
before its children), so a key on two siblings could be read out of put order.

Also what a refused listing costs now: puts do not wait for it (a listing that never answers
does not hold a flush)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pytest
from _faultproxy import Fault, FaultProxy, OpKey
from _group import create_stream, kinesis
from _produced import read_all
from _standins import NodeStandIn
from _wait import wait_until

from kinesumer import Producer

KEYS = 30
ROUND = 100
#: Attempts of one listing (kinesumer.aws.retry.call_with_retry's default).
LISTING_ATTEMPTS = 6
LIST_SHARDS = OpKey("kinesis", "ListShards")


def put_round(producer: Producer, stream: str, start: int) -> int:
    """Put records numbered ``start`` .. ``start + ROUND - 1`` over ``KEYS`` keys and flush;
    the next number."""
    for i in range(start, start + ROUND):
        producer.put(stream, b"%d" % i, partition_key=f"key-{i % KEYS}")
    producer.flush()
    return start + ROUND


def split_in_two(url: str, stream: str) -> str:
    """Split the stream's one shard at the middle of its range; the parent's id."""
    client = kinesis(url)
    parent = client.list_shards(StreamName=stream)["Shards"][0]
    low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    return str(parent["ShardId"])


def listed(proxy: FaultProxy) -> int:
    """ListShards calls Kinesis answered (through the proxy)."""
    stats = proxy.stats().get(LIST_SHARDS)
    return 0 if stats is None else stats.forwarded


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
            number = put_round(producer, stream, number)
        parent = split_in_two(kinesalite.url, stream)
        refused = proxy.add_rule(Fault.throttle(), service="kinesis", operation="ListShards")
        for round_ in range(6):
            if round_ == 3:
                # Half the rounds while the first listing retries, half after it gave up.
                wait_until(
                    lambda: refused.fired > LISTING_ATTEMPTS,
                    what="a listing refused past its retries, and the next one refused",
                )
            number = put_round(producer, stream, number)
        assert listed(proxy) == 1  # only the first listing, before the split, was answered
        refused.remove()
        for _ in range(200):
            number = put_round(producer, stream, number)
            if listed(proxy) > 1:
                break
        else:
            pytest.fail("the producer did not list the shards again once it could")
        number = put_round(producer, stream, number)  # routed by the new map

    records = read_all(kinesalite.url, stream)
    assert sorted(int(r.data) for r in records) == list(range(number))  # each record once
    children: dict[str, set[str]] = {}
    for record in records:
        if record.shard_id != parent:
            children.setdefault(record.partition_key, set()).add(record.shard_id)
    assert len(children) == KEYS
    split_keys = sorted(key for key, shards in children.items() if len(shards) > 1)
    assert split_keys == [], f"{len(split_keys)} of {KEYS} keys on both children"
    # In the order a reader meets them: the parent, then each key's one child.
    per_key: dict[str, list[int]] = {}
    for record in records:
        per_key.setdefault(record.partition_key, []).append(int(record.data))
    for key, numbers in per_key.items():
        assert all(a < b for a, b in itertools.pairwise(numbers)), key
    if aggregate:
        assert any(r.sub_sequence_number > 0 for r in records)


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
    with Producer(
        kinesis_endpoint=proxy.url, region="us-east-1", aggregate=aggregate
    ) as producer:
        put_round(producer, stream, 0)
        parent = split_in_two(kinesalite.url, stream)
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
        number = 6 * ROUND
    records = read_all(kinesalite.url, stream)
    assert sorted(int(r.data) for r in records) == list(range(number))
    children: dict[str, set[str]] = {}
    for record in records:
        if record.shard_id != parent:
            children.setdefault(record.partition_key, set()).add(record.shard_id)
    assert all(len(shards) == 1 for shards in children.values()), children
