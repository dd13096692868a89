"""Sticky assignment: properties of the pure function, and a real group that uses it.

Balance is checked per stream (range sizes within one of each other in every stream): the
module docstring of :mod:`kinesumer.core.sticky` says why not overall. Moves are bounded by the
newcomer's share (a join) or the leaver's (a leave), the least any balanced assignment moves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.group import Member, create_stream, datas, duplicates, make_config, put, setup_table
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import Record
from kinesumer.core import Assignment, assign, group_mode, sticky_assign

Members = dict[str, set[str]]
Shards = dict[str, list[str]]
Owners = dict[str, dict[str, str]]

client_ids = st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=8)
shard_ids = st.integers(0, 500).map(lambda i: f"shardId-{i:012d}")
stream_names = st.sampled_from(["orders", "payments", "clicks", "audit"])


@st.composite
def groups(draw: st.DrawFn) -> tuple[Members, Shards, Owners]:
    """Members (some on a subset of streams), shard lists, and arbitrary current owners
    (live members, dead ones, or none)."""
    names = draw(st.lists(stream_names, min_size=1, max_size=3, unique=True))
    shards = {s: draw(st.lists(shard_ids, max_size=60, unique=True)) for s in names}
    ids = draw(st.lists(client_ids, min_size=1, max_size=12, unique=True))
    everywhere = draw(st.booleans())
    members = {
        c: set(names) if everywhere else set(draw(st.lists(st.sampled_from(names), unique=True)))
        for c in ids
    }
    candidates = st.sampled_from([*ids, "dead-1", "dead-2"])
    owners = {
        s: {sid: draw(candidates) for sid in ids_ if draw(st.booleans())}
        for s, ids_ in shards.items()
    }
    return members, shards, owners


def owners_of(result: Assignment) -> Owners:
    owners: Owners = {}
    for client, streams in result.items():
        for stream, ids in streams.items():
            owners.setdefault(stream, {}).update(dict.fromkeys(ids, client))
    return owners


def moved(before: Assignment, after: Assignment, stream: str) -> int:
    old, new = owners_of(before).get(stream, {}), owners_of(after).get(stream, {})
    return sum(1 for sid, owner in new.items() if old.get(sid) != owner)


@given(groups())
def test_every_shard_goes_to_exactly_one_subscriber(group: tuple[Members, Shards, Owners]) -> None:
    members, shards, owners = group
    result = sticky_assign(members, shards, owners)
    for stream, ids in shards.items():
        assigned = [sid for c in result for sid in result[c].get(stream, ())]
        if any(stream in s for s in members.values()):
            assert sorted(assigned) == sorted(ids)
            assert all(stream in members[c] for c in result if result[c].get(stream))
        else:
            assert assigned == []


@given(groups())
def test_sizes_differ_by_at_most_one_within_each_stream(
    group: tuple[Members, Shards, Owners],
) -> None:
    members, shards, owners = group
    result = sticky_assign(members, shards, owners)
    for stream in shards:
        sizes = [len(result[c].get(stream, ())) for c in members if stream in members[c]]
        if sizes:
            assert max(sizes) - min(sizes) <= 1, (stream, sizes)


@given(groups(), st.randoms(use_true_random=False))
def test_same_answer_whatever_the_input_order(
    group: tuple[Members, Shards, Owners], rng: random.Random
) -> None:
    members, shards, owners = group

    def shuffled(mapping: dict[str, Any]) -> dict[str, Any]:
        items = list(mapping.items())
        rng.shuffle(items)
        return dict(items)

    permuted_shards = {s: rng.sample(ids, len(ids)) for s, ids in shuffled(shards).items()}
    permuted_owners = {s: shuffled(o) for s, o in shuffled(owners).items()}
    expected = sticky_assign(members, shards, owners)
    assert sticky_assign(shuffled(members), permuted_shards, permuted_owners) == expected


@given(groups())
def test_a_reached_target_is_kept(group: tuple[Members, Shards, Owners]) -> None:
    """Once every member holds its target, recomputing from those owners moves nothing."""
    members, shards, owners = group
    target = sticky_assign(members, shards, owners)
    assert sticky_assign(members, shards, owners_of(target)) == target


@given(groups(), client_ids)
def test_a_join_moves_at_most_the_newcomers_share(
    group: tuple[Members, Shards, Owners], newcomer: str
) -> None:
    members, shards, owners = group
    if newcomer in members:
        return
    before = sticky_assign(members, shards, owners)
    joined = {**members, newcomer: set(shards)}
    after = sticky_assign(joined, shards, owners_of(before))
    for stream, ids in shards.items():
        k = sum(1 for s in joined.values() if stream in s)
        share = len(after[newcomer].get(stream, ()))
        assert share <= math.ceil(len(ids) / k)
        if k > 1:  # with k == 1 the newcomer's shards were unowned before: nothing moved
            assert moved(before, after, stream) == share, stream


@given(groups(), st.data())
def test_a_leave_moves_only_the_leavers_shards(
    group: tuple[Members, Shards, Owners], data: st.DataObject
) -> None:
    members, shards, owners = group
    leaver = data.draw(st.sampled_from(sorted(members)))
    before = sticky_assign(members, shards, owners)
    rest = {c: s for c, s in members.items() if c != leaver}
    after = sticky_assign(rest, shards, owners_of(before))
    for stream, ids in shards.items():
        k = sum(1 for s in members.values() if stream in s)
        if k < 2 or stream not in members[leaver]:
            continue
        left_behind = len(before[leaver].get(stream, ()))
        assert left_behind <= math.ceil(len(ids) / k)
        assert moved(before, after, stream) == left_behind, stream


@given(groups(), client_ids, st.randoms(use_true_random=False))
def test_every_state_of_a_rebalance_yields_its_target(
    group: tuple[Members, Shards, Owners], newcomer: str, rng: random.Random
) -> None:
    """Members read the owners at different moments of a handoff: each moving shard may still
    be with its old owner, released (no owner), or claimed by its new one. All of them must
    compute the same target, or two members would wait on each other."""
    members, shards, owners = group
    if newcomer in members:
        return
    before = sticky_assign(members, shards, owners)
    joined = {**members, newcomer: set(shards)}
    start = owners_of(before)
    target = sticky_assign(joined, shards, start)
    goal = owners_of(target)
    midway: Owners = {}
    for stream, ids in shards.items():
        midway[stream] = {}
        for sid in ids:
            old, new = start.get(stream, {}).get(sid), goal.get(stream, {}).get(sid)
            here = rng.choice([old, None, new]) if old != new else old
            if here is not None:
                midway[stream][sid] = here
    assert sticky_assign(joined, shards, midway) == target


def test_the_worked_example_of_the_docstring() -> None:
    shards = {"orders": [f"s{i}" for i in range(10)]}
    owners = {"orders": {f"s{i}": "a" if i < 5 else "b" for i in range(10)}}
    members = {c: {"orders"} for c in "abc"}
    result = sticky_assign(members, shards, owners)
    assert result == {
        "a": {"orders": ("s0", "s1", "s2")},
        "b": {"orders": ("s5", "s6", "s7", "s8")},
        "c": {"orders": ("s3", "s4", "s9")},
    }
    two = assign({"a": {"orders"}, "b": {"orders"}}, shards)
    assert moved(two, assign(members, shards), "orders") == 4  # range moves one more


def test_the_group_is_sticky_only_when_every_live_member_says_so() -> None:
    assert group_mode("sticky", ["sticky", "sticky"]) == "sticky"
    assert group_mode("sticky", ["sticky", "range"]) == "range"
    assert group_mode("sticky", ["sticky", ""]) == "range"  # an older version: range
    assert group_mode("range", ["sticky", "sticky"]) == "range"
    assert group_mode("sticky", []) == "sticky"


# --- a real group on kinesalite + dynalite -------------------------------------------------------


async def test_sticky_group_reads_every_record_once_and_a_join_moves_only_what_it_must(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """Two members split 6 shards; a third joins and takes two, each old member keeping the rest
    of its own; every record is read exactly once (handoffs are graceful)."""
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        assignment="sticky",
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 6)
    sink: list[tuple[str, Record]] = []
    a, b = (Member(config.replace(client_id=c), [stream], sink).start() for c in ("m-a", "m-b"))
    await eventually(lambda: len(a.owned()) == len(b.owned()) == 3, what="three shards each")
    first = {m.client_id: m.owned() for m in (a, b)}
    produced = put(kinesalite.url, stream, 0, 300)
    await eventually(lambda: len(sink) >= 300, what="300 records")
    c = Member(config.replace(client_id="m-c"), [stream], sink).start()
    members = (a, b, c)
    await eventually(lambda: [len(m.owned()) for m in members] == [2, 2, 2], what="two each")
    assert a.owned() <= first["m-a"] and b.owned() <= first["m-b"], "an old member gained"
    produced += put(kinesalite.url, stream, 300, 300)
    await eventually(lambda: len(sink) >= 600, what="600 records")
    for member in members:
        await member.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}


async def test_a_sticky_member_beside_a_range_member_assigns_by_range(
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mixed modes would fight: here sticky would keep the sticky member's lowest shards while
    the range member wants them. The sticky member follows the range rule while a range member
    is live, so both end up with exactly their contiguous ranges."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 4)
    ids = [f"shardId-{i:012d}" for i in range(4)]
    sink: list[tuple[str, Record]] = []
    sticky = Member(config.replace(client_id="m-b", assignment="sticky"), [stream], sink).start()
    await eventually(lambda: len(sticky.owned()) == 4, what="the sticky member holds all")
    ranged = Member(config.replace(client_id="m-a"), [stream], sink).start()
    expected = assign({"m-a": {stream}, "m-b": {stream}}, {stream: ids})
    assert expected["m-a"][stream] == tuple(ids[:2])  # what sticky would have kept for m-b

    def as_range() -> bool:
        return all(
            m.owned() == {(stream, s) for s in expected[m.client_id][stream]}
            for m in (ranged, sticky)
        )

    await eventually(as_range, what="the range split")
    await ranged.close()
    await sticky.close()
    assert not sink
    warned = [r.getMessage() for r in caplog.records if "not sticky" in r.getMessage()]
    assert warned and "m-a" in warned[0], warned
