"""Property tests of the pure core: assignment, membership/leader, lineage."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from kinesumer.core import (
    active_shards,
    assign,
    has_known_parent,
    is_leader,
    leader_of,
    live_clients,
    parents_pending,
    shards_of,
)
from kinesumer.core.membership import stale_clients
from kinesumer.models import ClientInfo, Shard

client_ids = st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=8)
shard_ids = st.integers(0, 500).map(lambda i: f"shardId-{i:012d}")
streams = st.sampled_from(["orders", "payments", "clicks", "audit"])


@st.composite
def groups(draw: st.DrawFn) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    names = draw(st.lists(streams, min_size=1, max_size=4, unique=True))
    shards = {s: draw(st.lists(shard_ids, max_size=60, unique=True)) for s in names}
    ids = draw(st.lists(client_ids, min_size=1, max_size=12, unique=True))
    all_streams = draw(st.booleans())
    members = {
        c: set(names) if all_streams else set(draw(st.lists(st.sampled_from(names), unique=True)))
        for c in ids
    }
    return members, shards


@given(groups())
def test_every_shard_assigned_exactly_once_to_a_subscriber(group) -> None:  # type: ignore[no-untyped-def]
    members, shards = group
    result = assign(members, shards)
    for stream, ids in shards.items():
        owners = [c for c in result for sid in result[c].get(stream, ()) if True]
        assigned = [sid for c in result for sid in result[c].get(stream, ())]
        subscribers = [c for c in members if stream in members[c]]
        if subscribers:
            assert sorted(assigned) == sorted(ids)  # each shard once
            assert all(stream in members[c] for c in owners)
        else:
            assert assigned == []


@given(groups())
def test_range_sizes_differ_by_at_most_one_and_are_contiguous(group) -> None:  # type: ignore[no-untyped-def]
    members, shards = group
    result = assign(members, shards)
    for stream, ids in shards.items():
        subscribers = sorted(c for c in members if stream in members[c])
        if not subscribers:
            continue
        sizes = [len(result[c].get(stream, ())) for c in subscribers]
        assert max(sizes) - min(sizes) <= 1
        # Contiguous ranges in sorted-member order reproduce the sorted shard list.
        laid_out = [sid for c in subscribers for sid in result[c].get(stream, ())]
        assert laid_out == sorted(ids)


@given(groups(), st.randoms(use_true_random=False))
def test_result_does_not_depend_on_input_order(group, rnd: random.Random) -> None:  # type: ignore[no-untyped-def]
    members, shards = group
    shuffled_members = list(members.items())
    rnd.shuffle(shuffled_members)
    shuffled_shards = {}
    for stream in rnd.sample(list(shards), len(shards)):
        ids = list(shards[stream])
        rnd.shuffle(ids)
        shuffled_shards[stream] = ids
    assert assign(dict(shuffled_members), shuffled_shards) == assign(members, shards)


@given(groups())
def test_total_load_balanced_when_everyone_reads_everything(group) -> None:  # type: ignore[no-untyped-def]
    members, shards = group
    everything = {c: set(shards) for c in members}
    result = assign(everything, shards)
    loads = [sum(len(v) for v in result[c].values()) for c in everything]
    assert max(loads) - min(loads) <= 1


@given(groups(), client_ids)
def test_client_missing_from_live_list_owns_nothing(group, stranger: str) -> None:  # type: ignore[no-untyped-def]
    members, shards = group
    members.pop(stranger, None)
    assert shards_of(stranger, members, shards) == {}
    assert not is_leader(stranger, sorted(members))


@given(st.lists(client_ids, unique=True))
def test_leader_is_lowest_live_id(ids: list[str]) -> None:
    assert leader_of(ids) == (min(ids) if ids else None)
    leaders = [c for c in ids if is_leader(c, ids)]
    assert leaders == ([min(ids)] if ids else [])


def test_hot_standby_when_more_clients_than_shards() -> None:
    members = {f"c{i}": {"s"} for i in range(5)}
    result = assign(members, {"s": ["a", "b"]})
    owning = [c for c in result if result[c]]
    assert len(owning) == 2
    assert sorted(sid for c in owning for sid in result[c]["s"]) == ["a", "b"]


def test_contiguous_ranges_by_integer_arithmetic() -> None:
    ids = [f"s{i:02d}" for i in range(10)]
    result = assign({"a": {"x"}, "b": {"x"}, "c": {"x"}}, {"x": ids})
    assert [len(result[c]["x"]) for c in "abc"] == [4, 3, 3]
    assert result["a"]["x"] == tuple(ids[:4])
    assert result["b"]["x"] == tuple(ids[4:7])


@given(
    st.lists(st.tuples(client_ids, st.integers(0, 10_000)), unique_by=lambda t: t[0]),
    st.integers(0, 10_000),
    st.integers(1, 5_000),
)
def test_live_and_stale_partition_the_members(rows, now: int, timeout: int) -> None:  # type: ignore[no-untyped-def]
    clients = [ClientInfo(cid, ts) for cid, ts in rows]
    live = live_clients(clients, now, timeout)
    stale = stale_clients(clients, now, timeout)
    assert sorted(c.client_id for c in live + stale) == sorted(cid for cid, _ in rows)
    assert [c.client_id for c in live] == sorted(c.client_id for c in live)
    assert all(now - c.last_update_ms <= timeout for c in live)
    assert all(now - c.last_update_ms > timeout for c in stale)


def test_lineage_parents_before_children() -> None:
    parent = Shard("p", closed=True)
    left, right = Shard("l", parent_shard_id="p"), Shard("r", parent_shard_id="p")
    merged = Shard("m", parent_shard_id="l", adjacent_parent_shard_id="r")
    listed = {s.shard_id: s for s in (parent, left, right, merged)}
    assert parents_pending(left, listed, finished=set()) == ["p"]
    assert parents_pending(left, listed, finished={"p"}) == []
    assert parents_pending(merged, listed, finished={"l"}) == ["r"]
    assert has_known_parent(left, listed)
    assert not has_known_parent(parent, listed)
    # A parent that aged out of the stream is not waited for, and the orphan is a root.
    orphan = Shard("o", parent_shard_id="gone")
    assert parents_pending(orphan, listed, finished=set()) == []
    assert not has_known_parent(orphan, listed)
    assert active_shards(listed.values(), {"p"}) == ["l", "m", "r"]
