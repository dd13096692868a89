"""The state store's contract: the same behaviour tests against every implementation, so that
the in-memory one (kinesumer.testing.MemoryState) cannot drift from the DynamoDB one.

Each test runs on MemoryState, on DynamoDBStateStore over dynalite, and on DynamoDBStateStore
over moto in server mode. ``stores.of(app)`` is a store of app ``app`` on the test's table, a
new instance each call (as another process would hold).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.group import make_config, setup_table

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.models import Checkpoint, ClientInfo, Position, Shard
from kinesumer.statestore.base import MembershipView, PublishedMembers, SavedPosition, ShardCache
from kinesumer.statestore.dynamodb import DynamoDBStateStore
from kinesumer.statestore.spark import LedgerEntry
from kinesumer.testing import MemoryState

SEQ = "49590338271490256608559692538361571095921575989136588898"
LATER = "49590338271490256608559692538361571095921575989136588999"


class Stores:
    """Stores of any app over one table of one implementation."""

    def __init__(self, make: Callable[[str], Any]) -> None:
        self._make = make

    def of(self, app: str = "app") -> Any:
        return self._make(app)


@pytest.fixture(params=["memory", "dynalite", "moto"])
async def stores(request: Any, unique_name: Any) -> AsyncIterator[Stores]:
    if request.param == "memory":
        root = MemoryState()
        yield Stores(root.for_app)
        return
    url = (
        request.getfixturevalue("dynalite").url
        if request.param == "dynalite"
        else request.getfixturevalue("moto_url")
    )
    config = make_config(url, url, "app", unique_name("state"))
    setup_table(config)
    clients = AwsClients(config, RequestStats())
    await clients.open()
    try:
        yield Stores(
            lambda app: DynamoDBStateStore(
                clients.dynamodb, config.dynamodb_table, app, RequestStats()
            )
        )
    finally:
        await clients.close()


def client(client_id: str, last_update_ms: int, beat: int = 0, **fields: Any) -> ClientInfo:
    return ClientInfo(client_id, last_update_ms, beat=beat, **fields)


# -- clients ----------------------------------------------------------------------------------
async def test_heartbeats_are_listed_and_read_back(stores: Stores) -> None:
    store = stores.of()
    a = client("a", 1000, 1, streams=frozenset({"s2", "s1"}), host="h", pid=7, version="v")
    await store.heartbeat(a, 60)
    await store.heartbeat(client("b", 2000, 1, host="h", version="v"), 60)
    await stores.of("other").heartbeat(client("c", 3000, 1), 60)
    listed = {c.client_id: c for c in await store.list_clients()}
    assert sorted(listed) == ["a", "b"]
    got = await store.get_client("a")
    assert got is not None and got.token == (1000, 1)
    assert (got.streams, got.host, got.pid, got.version) == (frozenset({"s1", "s2"}), "h", 7, "v")
    assert await store.get_client("c") is None  # another app's
    await store.heartbeat(client("a", 1500, 2, host="h", version="v"), 60)
    again = await store.get_client("a")
    assert again is not None and again.token == (1500, 2)


async def test_what_a_read_returns_is_a_copy(stores: Stores) -> None:
    store = stores.of()
    await store.heartbeat(client("a", 1000, 1, owned={"s/shard-1": 5}), 60)
    got = await store.get_client("a")
    assert got is not None
    got.owned["s/shard-1"] = 999
    got.owned["s/shard-2"] = 1
    listed = await store.list_clients()
    listed[0].owned.clear()
    after = await store.get_client("a")
    assert after is not None and after.owned == {"s/shard-1": 5}


async def test_a_client_is_pruned_only_while_its_token_is_the_one_read(stores: Stores) -> None:
    store = stores.of()
    await store.heartbeat(client("a", 1000, 1), 60)
    seen = await store.get_client("a")
    assert seen is not None
    await store.heartbeat(client("a", 1000, 2), 60)  # it revived: same stamp, next beat
    assert not await store.prune_client(seen)
    assert await store.get_client("a") is not None
    assert not await store.prune_client(client("a", 999, 2))
    assert await store.prune_client(client("a", 1000, 2))
    assert await store.get_client("a") is None
    assert not await store.prune_client(client("a", 1000, 2))  # gone: nothing to prune


async def test_a_prune_by_stamp_alone_ignores_the_beat(stores: Stores) -> None:
    store = stores.of()
    await store.heartbeat(client("a", 1000, 5), 60)
    assert not await store.prune_client(client("a", 1001))
    assert await store.prune_client(client("a", 1000))  # beat unknown: the stamp decides


async def test_deregister_removes_the_client_and_counts_a_change(stores: Stores) -> None:
    store = stores.of()
    await store.heartbeat(client("a", 1000, 1), 60)
    await store.deregister("a")
    assert await store.get_client("a") is None
    head = await store.read_view_head(consistent=True)
    assert head is not None and head.changes == 1 and head.members_key == ""


# -- claims and checkpoints -------------------------------------------------------------------
async def test_a_fresh_shard_is_claimed_once(stores: Stores) -> None:
    a, b = stores.of(), stores.of()
    claimed = await a.claim("s", "shard-1", "a", None)
    assert claimed is not None and (claimed.owner, claimed.lease) == ("a", 1)
    assert await b.claim("s", "shard-1", "b", None) is None  # someone got there first
    held = (await b.get_checkpoints("s"))["shard-1"]
    assert (held.owner, held.lease) == ("a", 1)


async def test_concurrent_claims_of_one_shard_have_one_winner(stores: Stores) -> None:
    won = await asyncio.gather(
        *(stores.of().claim("s", "shard-1", f"m{i}", None) for i in range(6))
    )
    winners = [c for c in won if c is not None]
    assert len(winners) == 1
    assert (await stores.of().get_checkpoints("s"))["shard-1"].owner == winners[0].owner


async def test_a_takeover_is_fenced_by_owner_and_lease(stores: Stores) -> None:
    store = stores.of()
    first = await store.claim("s", "shard-1", "a", None)
    assert first is not None
    taken = await store.claim("s", "shard-1", "b", first)  # a judged dead: b takes it over
    assert taken is not None and (taken.owner, taken.lease) == ("b", 2)
    assert await store.claim("s", "shard-1", "c", first) is None  # stale: the lease moved on
    assert await store.claim("s", "shard-1", "c", Checkpoint("s", "shard-1", None, lease=2)) is None
    assert await store.write_checkpoint(taken, None, release=True)
    released = (await store.get_checkpoints("s"))["shard-1"]
    assert released.owner is None and released.lease == 2
    again = await store.claim("s", "shard-1", "c", released)
    assert again is not None and (again.owner, again.lease) == ("c", 3)
    assert await store.write_checkpoint(again, None, release=True)
    assert await store.claim("s", "shard-1", "d", released) is None  # unowned, but lease 3 now


async def test_a_checkpoint_write_is_refused_once_the_lease_moved_on(stores: Stores) -> None:
    store = stores.of()
    a = await store.claim("s", "shard-1", "a", None)
    assert a is not None
    assert await store.write_checkpoint(a, Position(SEQ, 2), done=b"\x01\x02")
    held = (await store.get_checkpoints("s"))["shard-1"]
    assert (held.sequence_number, held.sub_sequence_number, held.done) == (SEQ, 2, b"\x01\x02")
    b = await store.claim("s", "shard-1", "b", held)
    assert b is not None
    assert not await store.write_checkpoint(a, Position(LATER, 0))  # a stale owner
    assert await store.write_checkpoint(b, Position(LATER, 0), finished=True, done=b"")
    final = await store.get_checkpoints("s", ["shard-1", "shard-9"])
    assert list(final) == ["shard-1"]
    assert (final["shard-1"].sequence_number, final["shard-1"].finished) == (LATER, True)
    assert final["shard-1"].done == b""
    assert not await store.write_checkpoint(Checkpoint("s", "shard-2", owner="a", lease=1), None)


async def test_a_released_shard_takes_no_more_writes_from_its_last_owner(stores: Stores) -> None:
    store = stores.of()
    a = await store.claim("s", "shard-1", "a", None)
    assert a is not None
    assert await store.write_checkpoint(a, Position(SEQ), release=True)
    assert not await store.write_checkpoint(a, Position(LATER))
    assert (await store.get_checkpoints("s"))["shard-1"].sequence_number == SEQ


async def test_the_same_owner_under_an_older_lease_is_fenced(stores: Stores) -> None:
    """A member that released a shard and claimed it again holds a new lease: what it still
    holds of the first claim (a slow write in flight) is refused."""
    store = stores.of()
    first = await store.claim("s", "shard-1", "a", None)
    assert first is not None
    assert await store.write_checkpoint(first, Position(SEQ), release=True)
    second = await store.claim("s", "shard-1", "a", (await store.get_checkpoints("s"))["shard-1"])
    assert second is not None and (second.owner, second.lease) == ("a", 2)
    assert not await store.write_checkpoint(first, Position(LATER))
    assert not await store.record_start(first, 1000)
    held = (await store.get_checkpoints("s"))["shard-1"]
    assert (held.sequence_number, held.started_at_ms) == (SEQ, None)
    assert await store.write_checkpoint(second, Position(LATER))


async def test_record_start_keeps_the_first_start_and_is_fenced(stores: Stores) -> None:
    store = stores.of()
    a = await store.claim("s", "shard-1", "a", None)
    assert a is not None
    assert await store.record_start(a, 5000)
    assert await store.record_start(a, 9000)  # written, but the first start stays
    assert (await store.get_checkpoints("s"))["shard-1"].started_at_ms == 5000
    b = await store.claim("s", "shard-1", "b", (await store.get_checkpoints("s"))["shard-1"])
    assert b is not None and b.started_at_ms == 5000
    assert not await store.record_start(a, 1000)
    assert (await store.get_checkpoints("s"))["shard-1"].started_at_ms == 5000


async def test_an_operator_move_bumps_the_lease_and_fences_the_owner(stores: Stores) -> None:
    store = stores.of()
    assert await store.move_checkpoint("s", "shard-0", None, Position(SEQ, 1))  # where none was
    assert not await store.move_checkpoint("s", "shard-0", None, Position(SEQ, 2))
    made = (await store.get_checkpoints("s"))["shard-0"]
    assert (made.sequence_number, made.sub_sequence_number, made.lease) == (SEQ, 1, 1)
    assert made.owner is None
    a = await store.claim("s", "shard-1", "a", None)
    assert a is not None
    assert await store.record_start(a, 5000)
    assert await store.write_checkpoint(a, Position(SEQ), finished=True, done=b"\x07")
    seen = (await store.get_checkpoints("s"))["shard-1"]
    assert await store.move_checkpoint("s", "shard-1", seen, Position(LATER, 3))
    moved = (await store.get_checkpoints("s"))["shard-1"]
    assert (moved.sequence_number, moved.sub_sequence_number) == (LATER, 3)
    assert (moved.owner, moved.lease, moved.finished) == (None, 2, False)
    assert (moved.started_at_ms, moved.done) == (None, b"")
    assert not await store.write_checkpoint(a, Position(SEQ))  # the old owner is fenced off
    assert not await store.move_checkpoint("s", "shard-1", seen, None)  # stale: refused
    assert await store.move_checkpoint("s", "shard-1", moved, None)
    reset = (await store.get_checkpoints("s"))["shard-1"]
    assert (reset.sequence_number, reset.lease) == (None, 3)
    assert not await store.move_checkpoint("s", "shard-1", moved, Position(SEQ))  # lease 2: stale
    assert (await store.get_checkpoints("s"))["shard-1"].sequence_number is None


# -- shard cache ------------------------------------------------------------------------------
def cache(stream: str, *shards: str, finished: frozenset[str] = frozenset()) -> ShardCache:
    return ShardCache(stream, tuple(Shard(s, None, None, False) for s in shards), finished)


async def test_the_shard_cache_is_saved_on_the_digest_read(stores: Stores) -> None:
    leader, other = stores.of(), stores.of()
    first = cache("s", "shard-2", "shard-1")
    assert await leader.save_shard_cache(first, None)
    assert not await other.save_shard_cache(cache("s", "shard-1"), None)  # one exists already
    assert await other.shard_cache_digests(["s", "t"]) == {"s": first.digest}
    loaded = await other.load_shard_cache("s")
    assert loaded is not None and loaded.digest == first.digest
    assert [s.shard_id for s in loaded.shards] == ["shard-1", "shard-2"]
    second = cache("s", "shard-1", "shard-2", "shard-3", finished=frozenset({"shard-1"}))
    assert not await other.save_shard_cache(second, "stale-digest")
    assert await other.save_shard_cache(second, first.digest)
    assert not await leader.save_shard_cache(cache("s", "shard-9"), first.digest)  # overtaken
    loaded = await leader.load_shard_cache("s")
    assert loaded is not None and loaded.digest == second.digest
    assert loaded.finished == frozenset({"shard-1"})
    assert await leader.load_shard_cache("t") is None
    assert await leader.cached_streams() == ["s"]
    assert not leader.shard_cache_unreadable("s")


# -- the membership view ----------------------------------------------------------------------
def view(version: int, leader: str, read_at: int) -> MembershipView:
    key = f"members#{leader}#{read_at}"
    return MembershipView(version, key, read_at, read_at + 1, leader, 0, timeout_ms=10_000)


async def test_a_view_is_published_on_the_head_read(stores: Stores) -> None:
    leader, rival, follower = stores.of(), stores.of(), stores.of()
    await follower.announce_change()  # a join before any publication
    members = PublishedMembers(
        [client("b", 5, streams=frozenset({"s"})), client("a", 7, streams=frozenset({"s"}))],
        {"x": (100, 3)},
    )
    first = view(1, "a", 1000)
    assert await leader.publish_view(None, first, members)
    head = await follower.read_view_head(consistent=True)
    assert head is not None and (head.version, head.members_key) == (1, first.members_key)
    assert head.changes == 1 and head.timeout_ms == 10_000
    listed = await follower.read_view_members(first.members_key)
    assert listed is not None and [c.client_id for c in listed.live] == ["a", "b"]
    assert listed.live[0].streams == frozenset({"s"}) and listed.dead == {"x": (100, 3)}
    lost = view(1, "r", 1001)
    assert not await rival.publish_view(None, lost, members)  # the head is taken
    assert await follower.read_view_members(lost.members_key) is None  # its list is not left
    same_key = PublishedMembers([client("r", 0)], {})
    assert not await rival.publish_view(head, view(2, "a", 1000), same_key)  # the list exists
    kept = await follower.read_view_members(first.members_key)
    assert kept is not None and [c.client_id for c in kept.live] == ["a", "b"]
    second = view(2, "a", 2000)
    assert await leader.publish_view(head, second, PublishedMembers([client("a", 0)], {}))
    assert await follower.read_view_members(first.members_key) is None  # replaced: deleted
    assert not await rival.publish_view(head, view(2, "r", 2001), None)  # stale head
    await follower.announce_change()
    now = await follower.read_view_head(consistent=False)
    assert now is not None and (now.version, now.changes) == (2, 2)


async def test_a_head_hands_its_digests_to_followers(stores: Stores) -> None:
    leader, follower = stores.of(), stores.of()
    saved = cache("s", "shard-1")
    assert await leader.save_shard_cache(saved, None)
    assert await leader.publish_view(None, view(1, "a", 1000), None)
    head = await follower.read_view_head(consistent=True)
    assert head is not None and head.digests == (("s", saved.digest),)
    assert await leader.save_shard_cache(cache("s", "shard-1", "shard-2"), saved.digest)
    follower.follow_digests(head)
    assert await follower.shard_cache_digests(["s"]) == {"s": saved.digest}  # from the head
    fresh = await follower.shard_cache_digests(["s"])  # once only: then from the table
    assert fresh == {"s": cache("s", "shard-1", "shard-2").digest}


# -- broadcast positions ----------------------------------------------------------------------
async def test_broadcast_positions_refuse_an_older_session(stores: Stores) -> None:
    old, new = stores.of(), stores.of()
    s1 = await old.open_broadcast_session("c")
    s2 = await new.open_broadcast_session("c")
    assert s2 == s1 + 1
    assert await old.save_broadcast_position("c", s1, SavedPosition("s", "shard-1", None, 4000))
    assert await new.save_broadcast_position("c", s2, SavedPosition("s", "shard-1", Position(SEQ)))
    assert not await old.save_broadcast_position(
        "c", s1, SavedPosition("s", "shard-1", Position(LATER))
    )
    assert await new.save_broadcast_position(
        "c", s2, SavedPosition("s", "shard-2", None, 5000, finished=True)
    )
    assert await new.save_broadcast_position("c", s2, SavedPosition("s", "shard-2", None, 6000))
    saved = await old.broadcast_positions("c")
    assert saved[("s", "shard-1")] == SavedPosition("s", "shard-1", Position(SEQ), None)
    assert saved[("s", "shard-2")] == SavedPosition("s", "shard-2", None, 6000, finished=True)
    assert await new.broadcast_positions("someone-else") == {}


# -- the Spark source's items -----------------------------------------------------------------
async def test_the_first_ledger_entry_of_a_batch_and_shard_holds(stores: Stores) -> None:
    store = stores.of()
    entry = LedgerEntry(1, "s", "shard-1", Position(SEQ, 1), 4, True, False, 123, "a", 2, 50)
    assert await store.add_ledger_entry("q", entry, 600) == entry
    other = LedgerEntry(1, "s", "shard-1", None, 0, True, False)
    assert await store.add_ledger_entry("q", other, 600) == entry  # the first attempt wins
    assert await store.ledger_entry("q", 1, "s", "shard-1") == entry
    assert await store.ledger_entry("other-query", 1, "s", "shard-1") is None
    empty = LedgerEntry(2, "s", "shard-1", None, 0, True, True)
    assert await store.add_ledger_entry("q", empty, 600) == empty
    read = await store.ledger_entry("q", 2, "s", "shard-1")
    assert read is not None and (read.end, read.owner, read.shard_end) == (None, "-", True)
    await store.add_ledger_entry("q", LedgerEntry(2, "s", "shard-2", None, 0, True, False), 600)
    await store.add_ledger_entry("q", LedgerEntry(3, "s", "shard-1", None, 0, True, False), 600)
    assert sorted(await store.ledger_batch("q", 2)) == [("s", "shard-1"), ("s", "shard-2")]
    assert await store.delete_ledger_before("q", 3) == 3
    assert await store.ledger_batch("q", 2) == {}
    assert list(await store.ledger_batch("q", 3)) == [("s", "shard-1")]
    assert await store.forget_ledger("q") == 1
    assert await store.ledger_batch("q", 3) == {}


async def test_the_first_latest_pin_holds(stores: Stores) -> None:
    store = stores.of()
    assert await store.latest_pin("s", "shard-1") is None
    assert await store.add_latest_pin("s", "shard-1", 5000, 5100) == 5000
    assert await store.add_latest_pin("s", "shard-1", 7000, 7100) == 5000
    await store.add_latest_pin("t", "shard-1", 8000, 8100)
    assert await store.latest_pin("s", "shard-1") == 5000
    assert await store.latest_pins("s") == {"shard-1": 5000}
    assert not await store.forget_latest_pin("s", "shard-1", 7000)  # not the pin it holds
    assert await store.forget_latest_pin("s", "shard-1", 5000)
    assert await store.forget_latest_pin("s", "shard-1", 5000)  # gone already
    assert await store.latest_pin("s", "shard-1") is None
    assert await stores.of("other").latest_pin("t", "shard-1") is None


async def test_client_marks_change_with_a_heartbeat_or_a_join(stores: Stores) -> None:
    store = stores.of()
    assert await store.client_marks() == frozenset()
    await store.heartbeat(client("a", 1000, 1), 60)
    before = await store.client_marks()
    assert before == frozenset({("a", "1000")})
    assert await store.client_marks() == before
    await store.heartbeat(client("a", 2000, 2), 60)
    await store.heartbeat(client("b", 2000, 1), 60)
    assert await store.client_marks() - before == {("a", "2000"), ("b", "2000")}


async def test_a_forgotten_group_leaves_no_item_and_others_untouched(stores: Stores) -> None:
    group, other = stores.of("g"), stores.of("keep")
    for store in (group, other):
        await store.heartbeat(client("a", 1000, 1), 60)
        assert await store.claim("s", "shard-1", "a", None) is not None
        assert await store.claim("t", "shard-1", "a", None) is not None
        assert await store.save_shard_cache(cache("s", "shard-1"), None)
        assert await store.publish_view(None, view(1, "a", 1000), PublishedMembers([], {}))
        await store.add_latest_pin("s", "shard-1", 5000, 5000)
    assert await group.forget_group(["s"]) >= 6
    assert await group.list_clients() == []
    assert await group.get_checkpoints("s") == {}
    assert list(await group.get_checkpoints("t")) == ["shard-1"]  # not a stream named
    assert await group.load_shard_cache("s") is None
    assert await group.read_view_head(consistent=True) is None
    assert await group.latest_pins("s") == {}
    assert [c.client_id for c in await other.list_clients()] == ["a"]
    assert list(await other.get_checkpoints("s")) == ["shard-1"]
    assert await other.load_shard_cache("s") is not None
    assert await other.latest_pins("s") == {"shard-1": 5000}


# -- MemoryState alone: what only an in-process store must also get right ----------------------
def test_memory_state_serves_threads_with_their_own_loops() -> None:
    """Claims and fenced writes from several threads, each on its own event loop (the
    heartbeat runs in a thread): one claim wins, and only the winner's writes land."""
    state = MemoryState()
    results: dict[str, tuple[bool, bool]] = {}
    start = threading.Barrier(8)

    def member(name: str) -> None:
        async def run() -> tuple[bool, bool]:
            start.wait()
            claimed = await state.claim("s", "shard-1", name, None)
            if claimed is None:
                stale = Checkpoint("s", "shard-1", owner=name, lease=1)
                return False, await state.write_checkpoint(stale, Position(LATER))
            wrote = await state.write_checkpoint(claimed, Position(SEQ))
            return True, wrote

        results[name] = asyncio.run(run())

    threads = [threading.Thread(target=member, args=(f"m{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values()).count((True, True)) == 1
    assert sorted(results.values()).count((False, False)) == 7
    assert asyncio.run(state.get_checkpoints("s"))["shard-1"].sequence_number == SEQ
