"""Load-aware (weighted) assignment: properties of the pure function, the quantized weights, and
a real two-member group on kinesalite + dynalite where one hot shard ends alone on a member."""

from __future__ import annotations

import random

import pytest
from _group import create_stream, make_config, put, setup_table
from _standins import NodeStandIn
from _wait import eventually
from hypothesis import given
from hypothesis import strategies as st

from kinesumer import AsyncKinesumer
from kinesumer.core import group_mode
from kinesumer.core.weighted import default_weight, quantize, weighted_assign

client_ids = st.text(alphabet="abcdefgh0123", min_size=1, max_size=6)
stream_names = st.sampled_from(["orders", "payments", "clicks"])


@st.composite
def weighted_groups(
    draw: st.DrawFn,
) -> tuple[dict[str, set[str]], dict[str, list[str]], dict[str, dict[str, float]]]:
    names = draw(st.lists(stream_names, min_size=1, max_size=3, unique=True))
    shards = {
        s: [f"shardId-{i:04d}" for i in draw(st.lists(st.integers(0, 300), max_size=40))]
        for s in names
    }
    ids = draw(st.lists(client_ids, min_size=1, max_size=8, unique=True))
    members = {c: set(names) for c in ids}
    weights = {
        s: {sid: draw(st.sampled_from([0.0, 1.0, 2.0, 64.0, 1024.0])) for sid in ids_}
        for s, ids_ in shards.items()
        if draw(st.booleans())
    }
    return members, shards, weights


@given(weighted_groups())
def test_every_shard_once(group: tuple[dict[str, set[str]], dict[str, list[str]], dict]) -> None:
    members, shards, weights = group
    result = weighted_assign(members, shards, weights)
    for stream, ids in shards.items():
        assigned = [sid for c in result for sid in result[c].get(stream, ())]
        assert sorted(assigned) == sorted(set(ids))


@given(weighted_groups(), st.randoms(use_true_random=False))
def test_deterministic_under_input_order(
    group: tuple[dict[str, set[str]], dict[str, list[str]], dict], rnd: random.Random
) -> None:
    members, shards, weights = group
    expected = weighted_assign(members, shards, weights)
    ids = list(members)
    rnd.shuffle(ids)
    shuffled_members = {c: members[c] for c in ids}
    shuffled_shards = {s: rnd.sample(v, len(v)) for s, v in reversed(list(shards.items()))}
    assert weighted_assign(shuffled_members, shuffled_shards, weights) == expected


@given(weighted_groups())
def test_load_within_the_largest_weight_of_perfect(
    group: tuple[dict[str, set[str]], dict[str, list[str]], dict],
) -> None:
    members, shards, weights = group
    result = weighted_assign(members, shards, weights)
    fallback = default_weight(weights)

    def weight(stream: str, sid: str) -> float:
        return weights.get(stream, {}).get(sid, fallback)

    loads = {
        c: sum(weight(s, sid) for s, ids in by.items() for sid in ids) for c, by in result.items()
    }
    every = [weight(s, sid) for s, ids in shards.items() for sid in set(ids)]
    if not every:
        return
    perfect = sum(every) / len(members)
    assert max(loads.values()) <= perfect + max(every) + 1e-9


def test_worked_example_hot_shard_alone() -> None:
    weights = {"s": {"hot": 100.0, "c1": 1.0, "c2": 1.0, "c3": 1.0}}
    result = weighted_assign({"a": {"s"}, "b": {"s"}}, {"s": ["c1", "c2", "c3", "hot"]}, weights)
    assert result == {"a": {"s": ("hot",)}, "b": {"s": ("c1", "c2", "c3")}}


def test_unmeasured_shards_spread_by_count() -> None:
    result = weighted_assign({"a": {"s"}, "b": {"s"}}, {"s": ["1", "2", "3", "4"]}, {})
    assert sorted(len(by["s"]) for by in result.values()) == [2, 2]


def test_quantize_rounds_to_powers_of_two() -> None:
    assert quantize(0) == 0.0
    assert quantize(0.3) == 1.0
    assert quantize(1000) == 1024.0
    assert quantize(1100) == quantize(900) == 1024.0
    assert quantize(2500) == 2048.0
    assert quantize(3000) == 4096.0


def test_weighted_mode_needs_the_whole_group() -> None:
    assert group_mode("weighted", ["weighted", "weighted"]) == "weighted"
    assert group_mode("weighted", ["weighted", ""]) == "range"
    assert group_mode("weighted", ["weighted", "sticky"]) == "range"


@pytest.mark.timeout(60)
async def test_hot_shard_ends_alone_on_one_member(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name
) -> None:
    stream, app, table = unique_name("weights"), unique_name("app"), unique_name("table")
    create_stream(kinesalite.url, stream, 4)
    setup_table(dynalite.url, table)
    config = make_config(
        kinesalite.url, dynalite.url, app, table, assignment="weighted", shard_sync_interval=1.0
    )
    hot_key = "hot"
    a = AsyncKinesumer(config.replace(client_id="a"))
    b = AsyncKinesumer(config.replace(client_id="b"))
    async with a, b:
        await a.start([stream])
        await b.start([stream])
        # Find which shard "hot" hashes to: put one record and see where it lands.
        put(kinesalite.url, stream, 0, 1, key=lambda i: hot_key)
        hot_shard: list[str] = []

        async def drain(consumer: AsyncKinesumer) -> None:
            for record in await consumer.poll(max_records=500, timeout=0.2):
                if record.partition_key == hot_key and not hot_shard:
                    hot_shard.append(record.shard_id)

        async def found_hot() -> bool:
            await drain(a)
            await drain(b)
            return bool(hot_shard)

        await eventually(found_hot, timeout=20, what="the hot record delivered")
        produced = [0]

        async def hot_alone() -> bool:
            put(kinesalite.url, stream, produced[0], 300, key=lambda i: hot_key)
            produced[0] += 300
            await drain(a)
            await drain(b)
            owned = [set(x.stats().owned_shards.get(stream, ())) for x in (a, b)]
            return any(o == {hot_shard[0]} for o in owned) and sum(map(len, owned)) == 4

        await eventually(hot_alone, timeout=40, interval=0.3, what="the hot shard alone")
