"""Load-aware (weighted) assignment: properties of the pure function, the quantized weights, and
a real two-member group on kinesalite + dynalite where one hot shard ends alone on a member."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.group import Member, create_stream, make_config, put, setup_table
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer.core import group_mode
from kinesumer.core.weighted import default_weight, quantize, weighted_assign
from kinesumer.group import controls as engine_controls

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


@given(weighted_groups())
def test_the_heaps_give_the_plain_greedy_answer(
    group: tuple[dict[str, set[str]], dict[str, list[str]], dict],
) -> None:
    """The lazy heaps only make it fast (1,000 x 20,000 in ~0.2 s): a plain scan of every
    subscriber for the least loaded gives the same answer."""
    members, shards, weights = group
    fallback = default_weight(weights)
    items = sorted(
        (-weights.get(s, {}).get(sid, fallback), s, sid) for s in shards for sid in set(shards[s])
    )
    load = dict.fromkeys(members, 0.0)
    count = dict.fromkeys(members, 0)
    expected: dict[str, dict[str, list[str]]] = {c: {} for c in members}
    for negative, stream, sid in items:
        subscribers = [c for c in members if stream in members[c]]
        client = min(subscribers, key=lambda c: (load[c], count[c], c))
        load[client] -= negative
        count[client] += 1
        expected[client].setdefault(stream, []).append(sid)
    result = weighted_assign(members, shards, weights)
    assert result == {c: {s: tuple(sorted(v)) for s, v in by.items()} for c, by in expected.items()}


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


@pytest.fixture
def quick_controls() -> Iterator[None]:
    """Members read the weights every 0.5 s instead of 5 s, so the test waits less."""
    saved = engine_controls.READ_EVERY
    engine_controls.READ_EVERY = 0.5
    yield
    engine_controls.READ_EVERY = saved


@pytest.mark.timeout(60)
async def test_hot_shard_ends_alone_on_one_member(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name, quick_controls: None
) -> None:
    stream, app, table = unique_name("weights"), unique_name("app"), unique_name("table")
    create_stream(kinesalite.url, stream, 4)
    config = make_config(
        kinesalite.url, dynalite.url, app, table, assignment="weighted", shard_sync_interval=1.0
    )
    setup_table(config)
    sink: list = []
    a = Member(config.replace(client_id="m-a"), [stream], sink).start()
    b = Member(config.replace(client_id="m-b"), [stream], sink).start()
    await eventually(lambda: len(a.owned()) == len(b.owned()) == 2, what="two shards each")
    # Find the shard one partition key hashes to, then keep that shard hot.
    await asyncio.to_thread(put, kinesalite.url, stream, 0, 1, lambda i: "hot")
    await eventually(lambda: len(sink) == 1, what="the first hot record")
    hot = (stream, sink[0][1].shard_id)
    stop = asyncio.Event()

    async def produce() -> None:
        n = 1
        while not stop.is_set():
            await asyncio.to_thread(put, kinesalite.url, stream, n, 200, lambda i: "hot")
            n += 200
            await asyncio.sleep(0.1)

    producer = asyncio.create_task(produce())
    try:
        await eventually(
            lambda: {hot} in (a.owned(), b.owned()) and len(a.owned() | b.owned()) == 4,
            timeout=40,
            what="the hot shard alone on one member",
            diagnose=lambda: f"a={sorted(a.owned())} b={sorted(b.owned())} hot={hot}",
        )
    finally:
        stop.set()
        await producer
    for member in (a, b):
        await member.close()
        assert member.error is None
