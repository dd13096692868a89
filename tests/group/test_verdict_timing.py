"""A death is judged when its verdict falls due, not on the next tick after it.

A verdict needs a read *started* ``client_timeout`` after the answer that first showed the dead
member's last token (``kinesumer.core.liveness``). On the coordinator's one-tick grid that read
came a whole tick late (the answer's moment is taken after the read, the next reads start a
whole number of ticks after the previous ones started): at the defaults a dead member was judged
about ``T`` + 1 s after the leader first saw its last token, and a dead leader's shards were taken
over ``T`` + 2.25 s after its SIGKILL. The coordinator now ticks at the moment the next verdict
falls due (:meth:`Membership.verdict_due`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.group import make_config, setup_table, state_store
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import Config
from kinesumer.core.liveness import Observer
from kinesumer.group.coordinator import Coordinator
from kinesumer.group.membership import Membership
from kinesumer.models import ClientInfo
from kinesumer.observability.metrics import Metrics
from kinesumer.statestore.base import MembershipView, PublishedMembers
from kinesumer.statestore.dynamodb import view

T = 3.0  # the default client_timeout


class Members:
    """The one store call a direct read makes: every client item."""

    def __init__(self, *clients: ClientInfo) -> None:
        self.clients = list(clients)

    async def list_clients(self) -> list[ClientInfo]:
        return list(self.clients)


def membership_over(store: Members) -> Membership:
    none: Any = None
    return Membership("a", T, store, none, none, {})  # type: ignore[arg-type]


async def test_the_next_verdict_falls_due_client_timeout_after_the_answer_that_showed_it() -> None:
    """Due ``T`` after the read that first returned a member's token (taken after the
    answer), moved on by a new token, never for ourselves; the read started then judges it."""
    store = Members(ClientInfo("a", 1, beat=1), ClientInfo("b", 1, beat=1))
    membership = membership_over(store)
    assert membership.verdict_due() is None  # nothing read yet
    before = time.monotonic()
    await membership.read_members()
    after = time.monotonic()
    due = membership.verdict_due()
    assert due is not None and before + T <= due <= after + T
    store.clients = [ClientInfo("a", 2, beat=2), ClientInfo("b", 2, beat=2)]  # b heartbeated
    await membership.read_members()
    moved = membership.verdict_due()
    assert moved is not None and moved > due
    store.clients = [ClientInfo("a", 3, beat=3), ClientInfo("b", 2, beat=2)]  # b went silent
    await asyncio.sleep(max(0.0, moved - time.monotonic()))
    stale = await membership.read_members()
    assert [c.client_id for c in stale] == ["b"] and membership.live_ids == ["a"]
    assert membership.verdict_due() is None  # we alone are live: nobody to judge


class DueMembership:
    """What the coordinator's loop asks of the membership between ticks."""

    def __init__(self) -> None:
        self.due: float | None = None

    def verdict_due(self) -> float | None:
        return self.due

    async def view_moved(self) -> bool:
        return False


async def test_the_coordinator_ticks_when_a_verdict_falls_due() -> None:
    """With an hour between ticks, a verdict due a fifth of a second after a tick brings the
    next tick then (before: an hour later). A moment before the tick's start does not bring
    ticks one after the other."""
    config = Config(app="a", dynamodb_table="state", heartbeat_interval=3600, client_timeout=7200)
    membership = DueMembership()
    leasing: Any = type("Leasing", (), {"has_pending": False})()
    none: Any = None
    coordinator = Coordinator(config, "a", {}, membership, none, leasing, Metrics())  # type: ignore[arg-type]
    starts: list[float] = []

    async def tick() -> None:
        starts.append(time.monotonic())
        # First tick: a verdict due in 0.2 s; later ones: a moment already past.
        membership.due = starts[0] + 0.2 if len(starts) == 1 else starts[0]

    coordinator.tick = tick  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(coordinator.run(stop))
    try:
        await eventually(
            lambda: len(starts) >= 2, timeout=30, what="a tick when the verdict fell due"
        )
        assert starts[1] >= starts[0] + 0.2
        await asyncio.sleep(0.5)
        assert len(starts) == 2  # a due moment before the tick's start: the regular cadence
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)


# -- the pure observer stays as large as the group it watches ----------------------------------
reads = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from([f"m{i}" for i in range(30)]), st.integers(0, 3)),
        st.booleans(),  # complete: the read returned every item there is
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(reads)
def test_the_observer_keeps_only_the_members_of_its_last_complete_read(
    history: list[tuple[dict[str, int], bool]],
) -> None:
    """Members that left are forgotten by the next read that returned every item; between two
    such reads it holds what they and the partial reads (a watched leader) returned. Every key
    it keeps is listed by ``dead`` at an infinite moment, so that is all it keeps."""
    observer = Observer(T)
    kept: set[str] = set()
    for moment, (tokens, complete) in enumerate(history):
        observer.observe(tokens, float(moment), complete=complete)
        kept = set(tokens) if complete else kept | set(tokens)
        assert set(observer.dead(float("inf"))) == kept
        for key in kept:
            due = observer.due(key)
            assert due is not None and due <= moment + T
            # Due exactly when a read started then would judge it dead.
            assert observer.is_dead(key, due) and not observer.is_dead(key, due - 0.001)


# -- a dead leader is judged T after its followers first saw its last token ---------------------
class FollowedGroup:
    """A group led by "a" as follower "f" sees it: a's client item, the view "a" publishes
    (each head carries a's token as its read found it), and f's own item."""

    def __init__(self) -> None:
        self.beats = 0
        self.leader = ClientInfo("a", 1, beat=1)
        self.head = self.publish(1)

    def publish(self, n: int) -> MembershipView:
        self.leader = ClientInfo("a", n, beat=n)
        self.head = MembershipView(
            version=1,
            members_key="k1",
            read_at_ms=n,
            published_at_ms=n,
            leader="a",
            seen_changes=0,
            leader_token=self.leader.token,
        )
        return self.head

    async def read_view_head(self, *, consistent: bool) -> MembershipView | None:
        return self.head

    async def read_view_members(self, members_key: str) -> PublishedMembers | None:
        live = [ClientInfo("a", 0), ClientInfo("f", 0)]
        return PublishedMembers(live, {}, True)

    def follow_digests(self, head: MembershipView | None) -> None:
        pass

    async def publish_view(self, *args: object) -> bool:
        return True  # f, once it finds "a" dead, leads and publishes

    async def announce_change(self) -> None:
        raise AssertionError("nobody joins or leaves here")

    async def list_clients(self) -> list[ClientInfo]:
        self.beats += 1  # f heartbeats
        return [self.leader, ClientInfo("f", self.beats, beat=self.beats)]

    async def get_client(self, client_id: str) -> ClientInfo | None:
        return self.leader if client_id == "a" else None


async def test_a_dead_leader_is_judged_when_its_head_goes_stale() -> None:
    """The leader "a" publishes a last head and dies (its item keeps the token that head
    carries). Its follower sees the head go stale ``T`` after it first read it, and judges
    "a" dead on that very read of the client items: it had seen a's last token with the head.
    Before, it first saw that token when it started watching a's item, over 1.25 heartbeat
    intervals later, and the dead leader's shards waited that much longer."""
    group = FollowedGroup()
    heartbeat: Any = SimpleNamespace(interval=1.0)
    none: Any = None
    follower = Membership("f", 2.0, group, heartbeat, none, {})  # type: ignore[arg-type]
    await follower.read_members()  # a head seen once only: f reads the client items
    group.publish(2)  # a's last publication, with its last token
    await follower.read_members()
    assert follower.view_reads == 1 and follower.live_ids == ["a", "f"]  # following
    direct = follower.direct_reads
    while follower.direct_reads == direct:  # the head goes stale after T: read directly
        await asyncio.sleep(0.05)
        await follower.read_members()
    assert follower.live_ids == ["f"] and "a" in follower.dead, follower.dead


async def test_a_dead_leader_whose_last_heartbeat_came_after_its_last_head_is_judged() -> None:
    """The leader's last heartbeat landed after the read behind its last head: the follower
    finds that newer token when it watches a's item, and judges "a" dead ``T`` after that.
    The head, read again and again, must not set a's token back to the older one it carries
    (each time a change: "a" would never be judged dead)."""
    group = FollowedGroup()
    heartbeat: Any = SimpleNamespace(interval=1.0)
    none: Any = None
    follower = Membership("f", 2.0, group, heartbeat, none, {})  # type: ignore[arg-type]
    await follower.read_members()
    group.publish(2)
    await follower.read_members()
    assert follower.view_reads == 1
    group.leader = ClientInfo("a", 3, beat=3)  # a heartbeat after its read, then death
    deadline = time.monotonic() + 30
    while "a" not in follower.dead:
        assert time.monotonic() < deadline, "the dead leader was never judged dead"
        await asyncio.sleep(0.05)
        await follower.read_members()
    assert follower.dead["a"] == (3, 3) and follower.live_ids == ["f"]


async def test_the_head_carries_the_leaders_token_through_the_table(
    dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """Written and read back through dynalite; a head without it (an older leader's) reads
    (0, 0), which followers ignore."""
    config = make_config("http://127.0.0.1:1", dynalite.url, unique_name("app"), unique_name("t"))
    setup_table(config)
    head = FollowedGroup().publish(7)
    async with state_store(config) as store:
        members = PublishedMembers([ClientInfo("a", 0)], {}, True)
        assert await store.publish_view(None, head, members)
        read = await store.read_view_head(consistent=True)
    assert read is not None and read.leader_token == (7, 7)
    older = {**view.head_key("app"), "version": {"N": "1"}, "leader": {"S": "a"}}
    assert view.decode_head(older).leader_token == (0, 0)
