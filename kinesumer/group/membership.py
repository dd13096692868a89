"""Membership: who is live, who leads, and this member's own liveness (its fence).

Each tick learns the sorted live ids (index 0 leads); the leader prunes dead members. No
decision compares one host's clock with another's: a member is dead when its heartbeat item's
*token* has not changed for ``client_timeout`` on the observer's own monotonic clock
(:mod:`kinesumer.core.liveness`; heartbeat.py proves the member fenced itself first). How the
members are learnt keeps a follower's cost flat however large the group:

- The leader reads every client item (strongly consistent, as every member did before), judges
  them, and publishes a *view*: an immutable member list (the live members, and the dead ones
  not pruned yet with the token each died with), and a tiny head pointing to it, rewritten
  every tick (its token changes at every publication).
- A follower reads only the head (eventually consistent: half a read unit), and the list only
  when the head points to a new one. A stale answer is safe: an older view calls *fewer*
  members dead, and a takeover never trusts the view alone: the claimer first reads the
  owner's client item (strongly consistent) and takes the shard only when the item is gone
  (pruned, expired, deregistered) or still holds the very token a verdict judged dead: an owner
  that joined after the view, or heartbeated since, is left alone (leasing.py).
- Joins and graceful leaves count themselves on the head (an atomic ADD): while the head's
  count is ahead of the one its list covers, followers read the client items directly, so
  joins and leaves move shards as fast as before. So do followers whose head has not changed
  for ``client_timeout`` on their own clock (the leader crashed: every member then finds the
  same new leader from the client items, and it publishes), and followers missing from the list.
  Each head carries the leader's own heartbeat token, so followers have seen a dead leader's
  last token by then (or see it watching its item) and judge it dead on that very read.
- Members of older versions read the client items directly, judge by their wall clock, and
  never publish; a group whose leader is one of them has no fresh head, so the others read
  directly too (docs/how-it-works/protocol.md: rolling upgrades).

The regular heartbeats come from
:class:`~kinesumer.group.heartbeat.Heartbeat`'s thread; :meth:`Membership.announce` writes one
from the loop (at the join, and when the streams change). When no heartbeat has landed for too
long, :meth:`Membership.fence_if_expired` loses every active lease before others take them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping

from ..core import is_leader
from ..core.liveness import Observer
from ..models import ClientInfo
from ..statestore.base import MembershipView, MembershipViewStore, PublishedMembers, StateStore
from ..statestore.dynamodb.view import members_sk
from .checkpointer import Checkpointer
from .heartbeat import Heartbeat
from .leases import Lease, LeaseStatus, ReadProgress

log = logging.getLogger("kinesumer.coordinator")

#: ``1`` (every member) or a comma-separated list of client ids: those members read every client
#: item each tick and neither follow nor publish a view nor count their joins, as kinesumer did
#: before views (for the cost benchmark's "before" and the mixed-version tests).
LEGACY_ENV = "KINESUMER_LEGACY_MEMBERSHIP"


def legacy_membership(client_id: str) -> bool:
    """Whether :data:`LEGACY_ENV` makes ``client_id`` read its members the old way."""
    value = os.environ.get(LEGACY_ENV, "")
    return value == "1" or client_id in value.split(",")


#: A dead member's heartbeat token, as judged by an observer (``ClientInfo.token``).
Token = tuple[int, int]


def _published_form(
    members: PublishedMembers,
) -> tuple[list[tuple[str, frozenset[str], str]], list[tuple[str, Token]]]:
    live = [(c.client_id, c.streams, c.assignment) for c in members.live]
    return live, sorted(members.dead.items())


class Membership:
    def __init__(
        self,
        client_id: str,
        client_timeout: float,
        store: StateStore,
        heartbeat: Heartbeat,
        checkpointer: Checkpointer,
        leases: Mapping[tuple[str, str], Lease[ReadProgress]],
    ) -> None:
        self.client_id = client_id
        self._timeout_ms = int(client_timeout * 1000)
        self._store = store
        self._heartbeat = heartbeat
        self._checkpointer = checkpointer
        self._leases = leases
        #: Members judged live (their token changed within ``client_timeout``), sorted.
        self.live_ids: list[str] = []
        #: Their items (streams included), as last read.
        self.live: list[ClientInfo] = []
        #: Members known dead (not pruned yet), with the token each died with: from our own
        #: verdicts when we read the client items, else from the view we follow.
        self.dead: dict[str, Token] = {}
        #: Wall clock (ms) of the read behind ``live_ids``: names a published list, and is
        #: shown; never compared with another host's clock.
        self.read_at_ms = 0
        self.leader = False
        #: Client items' tokens and when we first saw each (our monotonic clock).
        self._members = Observer(client_timeout)
        #: The view head's token, likewise: stale once unchanged for ``client_timeout``.
        self._heads = Observer(client_timeout)
        self._head_stale = True
        self._head_moved = False  # we saw the head's token change: someone publishes
        self._views: MembershipViewStore | None = None
        if isinstance(store, MembershipViewStore) and not legacy_membership(client_id):
            self._views = store
        # The last member list read or written.
        self._list: tuple[str, PublishedMembers] = ("", PublishedMembers([]))
        self._published = False  # we published the head as it stands
        self._published_at = 0  # the stamp of our last publication (each one a new token)
        self._head: MembershipView | None = None  # what we published, if we did
        self._followed: MembershipView | None = None  # the head this tick followed, if it did
        #: Ticks that read the client items / that followed the published view (for tests).
        self.direct_reads = 0
        self.view_reads = 0
        self._warned_at = float("nan")  # the fence deadline last warned about

    @property
    def fenced(self) -> bool:
        """No heartbeat landed for too long: this member must not claim or deliver."""
        return time.monotonic() >= self._heartbeat.deadline

    async def announce(self) -> None:
        """Write our client item now, from the loop (at the join and when streams change)."""
        sent = time.monotonic()
        await self._store.heartbeat(self._heartbeat.info(), self._heartbeat.ttl_seconds)
        self._heartbeat.landed(sent)
        if self._views is not None:
            await self._views.announce_change()  # after our item: whoever sees it, sees us

    async def read_members(self) -> list[ClientInfo]:
        """Learn the live members (from the view, or from the client items); update the
        leadership; publish the view when leading. Returns the members judged dead, for the
        leader to prune (only a direct read finds them)."""
        views = self._views
        if views is None:
            return await self._read_direct()
        if not self.leader:
            head = await self._read_head(views)
            if head is not None and self._head_usable(head):
                await self._watch_leader(head)
            followed = await self._follow(views, head)
            self._followed = head if followed is not None else None
            if followed is not None and head is not None:
                self.view_reads += 1
                views.follow_digests(head)  # this tick's shard cache digests come with it
                self._set_live(followed.live, head.read_at_ms)
                self.dead = dict(followed.dead)
                if not self.leader:
                    return []
                # The view names us leader: read the client items and publish from now on.
        # Read before the items, so the joins it counts are in them. Eventually consistent: a
        # stale head only makes our publication cover fewer joins (followers then read directly
        # one more tick) or be refused (its condition) and tried again next tick. Alone, our
        # own last publication serves: a joiner shows in the items, and is not following yet.
        self._followed = None
        views.follow_digests(None)
        alone = self._published and self.live_ids == [self.client_id]
        head = self._head if alone else await self._read_head(views)
        stale = await self._read_direct()
        if self.leader:
            await self._publish(views, head)
        elif self._published and head is not None and head.leader == self.client_id:
            # We stepped down: send the followers to the client items now, not in T.
            self._published = False
            await views.publish_view(head, dataclasses.replace(head, published_at_ms=0), None)
        return stale

    async def _read_head(self, views: MembershipViewStore) -> MembershipView | None:
        """Read the head and watch its token: stale once unchanged for ``client_timeout``
        on our clock (the leader stopped publishing), whatever its stamps say."""
        started = time.monotonic()
        head = await views.read_view_head(consistent=False)
        seen_at = time.monotonic()
        before = self._heads.token("")
        self._heads.observe({} if head is None else {"": head.token}, seen_at, complete=True)
        # The leader's token was in its item before it wrote this head: seen now, it is judged
        # as if read from the item (a dead leader: T after we first saw its last). Only from a
        # head new to us: a dead leader's last head, read again and again, must not undo the
        # newer token a read of its item found (that would reset its timer at every read).
        fresh = head is not None and head.token != before and head.leader != self.client_id
        if fresh and head is not None and any(head.leader_token):
            self._members.observe({head.leader: head.leader_token}, seen_at, complete=False)
        # A head seen once only may be the last one a leader wrote long ago (its stamps cannot
        # say): it is followed once it has been seen to change.
        self._head_moved = head is not None and (
            self._head_moved or (before is not None and before != head.token)
        )
        self._head_stale = not self._head_moved or self._heads.is_dead("", started)
        return head

    def _head_usable(self, head: MembershipView | None) -> bool:
        return (
            head is not None
            and bool(head.members_key)  # no view yet: only joins counted on it
            and head.changes == head.seen_changes  # a join or leave it does not cover yet
            and head.published_at_ms != 0  # its leader stepped down
            and not self._head_stale  # the leader stopped publishing
        )

    async def view_moved(self) -> bool:
        """Between ticks (half way), a follower reads the head: True when it points to another
        member list, counts a join or leave, or went stale, so the coordinator ticks at once
        (a crash the leader published reaches the followers within half an interval). Members
        that read the client items anyway answer False without a read."""
        views, followed = self._views, self._followed
        if views is None or self.leader or followed is None:
            return False
        head = await self._read_head(views)
        if head is None or not self._head_usable(head):
            return True
        await self._watch_leader(head)
        return head.members_key != followed.members_key

    async def _watch_leader(self, head: MembershipView) -> None:
        """A follower whose head missed a publication starts watching the leader's own client
        item (one strongly consistent GetItem per read of the head, only while the head lags):
        if the leader died, we saw its last token before its head went stale, so our verdict
        comes about ``client_timeout`` after its last heartbeat, not that plus the time the head
        took to go stale. Nothing is spent while the leader publishes on time."""
        lag = self._heads.unchanged_for("", time.monotonic())
        if self.leader or head.leader == self.client_id or lag <= 1.25 * self._heartbeat.interval:
            return
        client = await self._store.get_client(head.leader)
        if client is not None:
            self._members.observe(
                {client.client_id: client.token}, time.monotonic(), complete=False
            )

    async def _follow(
        self, views: MembershipViewStore, head: MembershipView | None
    ) -> PublishedMembers | None:
        """The published members, or None when this tick must read the client items."""
        if head is None or not self._head_usable(head):
            return None
        key, members = self._list
        if key != head.members_key:
            listed = await views.read_view_members(head.members_key)
            if listed is None:
                return None  # replaced since the head was read
            self._list = key, members = head.members_key, listed
        if self.client_id not in (c.client_id for c in members.live):
            return None  # we joined after it, or were dropped: judge for ourselves
        if not members.judged:
            return None  # an older version's list: it names nobody dead, so we could take over
            # from nobody until a prune; judge for ourselves (the old cost, during an upgrade)
        return members

    async def _publish(self, views: MembershipViewStore, seen: MembershipView | None) -> None:
        """Leader: publish the members just judged (a new list only when they changed)."""
        key, listed = self._list
        current = PublishedMembers(self.live, dict(self.dead))
        unchanged = (
            seen is not None and seen.members_key == key and seen.changes == seen.seen_changes
        )
        new_list: PublishedMembers | None = None
        if unchanged and _published_form(listed) == _published_form(current):
            if self.live_ids == [self.client_id] and self._published:
                return  # alone: no follower needs a fresh head (a joiner reads directly)
        else:
            key, new_list = members_sk(self.client_id, self.read_at_ms), current
        # A new stamp at every publication (its token changes even if our clock stood still).
        self._published_at = max(int(time.time() * 1000), self._published_at + 1)
        head = MembershipView(
            version=(seen.version if seen else 0) + (new_list is not None),
            members_key=key,
            read_at_ms=self.read_at_ms,
            published_at_ms=self._published_at,
            leader=self.client_id,
            seen_changes=seen.changes if seen else 0,
            timeout_ms=self._timeout_ms,
            leader_token=next(
                (c.token for c in self.live if c.client_id == self.client_id), (0, 0)
            ),
        )
        self._published = await views.publish_view(seen, head, new_list)
        # As a seen head next tick, when alone: the count it covers is the count it knows.
        self._head = (
            dataclasses.replace(head, changes=head.seen_changes) if self._published else None
        )
        if self._published and new_list is not None:
            self._list = key, new_list

    async def _read_direct(self) -> list[ClientInfo]:
        """Read every client item (strongly consistent) and judge each by its token: dead when
        unchanged for ``client_timeout`` since we first saw it, as of the read's *start* (every
        heartbeat acknowledged before then is in the answer; heartbeat.py has the proof)."""
        self.direct_reads += 1
        read_at = int(time.time() * 1000)
        started = time.monotonic()
        clients = await self._store.list_clients()
        self._members.observe(
            {c.client_id: c.token for c in clients}, time.monotonic(), complete=True
        )
        by_id = sorted(clients, key=lambda c: c.client_id)
        # A verdict stands while the token it judged is unchanged: one from the view we
        # followed counts too (a follower that becomes leader need not watch the dead anew).
        known = self.dead
        stale = [
            c
            for c in by_id
            if self._members.is_dead(c.client_id, started) or known.get(c.client_id) == c.token
        ]
        self.dead = {c.client_id: c.token for c in stale}
        self._set_live([c for c in by_id if c.client_id not in self.dead], read_at)
        return stale

    def verdict_due(self) -> float | None:
        """When (our monotonic clock) the next verdict falls due if nothing changes: a live
        member's token, or the followed head, unchanged for ``client_timeout`` by then (None:
        nothing watched). The coordinator ticks at that moment rather than at its next regular
        tick: the verdict needs a read *started* ``client_timeout`` after the answer that
        first showed the token, so on the tick grid it came a whole tick late (``T`` + 1 s
        after that answer at the defaults, and a dead leader's shards waited over ``T`` + 2 s)."""
        if self._followed is not None:  # following the view: its head going stale is due
            return self._heads.due("")
        moments = (self._members.due(c) for c in self.live_ids if c != self.client_id)
        return min((m for m in moments if m is not None), default=None)

    async def owner_gone(self, owner: str) -> bool:
        """Whether the shards ``owner`` holds may be taken over: its client item, read now
        (strongly consistent, after the checkpoint naming it was read), is gone, or still holds
        the token a verdict judged dead (so it has not heartbeated, and cannot have claimed,
        since it fenced itself). An owner that joined after our member list, or heartbeated
        since the verdict, is not: the next tick judges it."""
        client = await self._store.get_client(owner)
        if client is None:
            return True  # pruned (judged dead), expired, or deregistered
        return self.dead.get(owner) == client.token

    def _set_live(self, live: list[ClientInfo], read_at_ms: int) -> None:
        self.live = live
        self.live_ids = [c.client_id for c in live]
        self.read_at_ms = read_at_ms
        was_leader, self.leader = self.leader, is_leader(self.client_id, self.live_ids)
        if self.leader != was_leader:
            log.info("[%s] %s leader", self.client_id, "became" if self.leader else "is no longer")

    @property
    def is_live(self) -> bool:
        """Whether we found ourselves in the live list (else we own nothing until we do)."""
        return self.client_id in self.live_ids

    async def prune(self, stale: list[ClientInfo]) -> None:
        """Leader: delete the items of dead members, conditional on the token judged dead (one
        that heartbeated since is spared)."""
        for client in stale:
            if client.client_id == self.client_id:
                continue
            if await self._store.prune_client(client):
                log.info("[%s] pruned dead client %s", self.client_id, client.client_id)

    def fence_if_expired(self) -> None:
        """Watchdog: lose every active lease once heartbeats stopped landing. After a lapse
        (a heartbeat landed only after the fence), the fence opens again only from here, once
        every lease held across it is lost."""
        if not self.fenced:
            return
        heartbeat = self._heartbeat
        active = [
            lease for lease in self._leases.values() if lease.claim.status is LeaseStatus.ACTIVE
        ]
        deadline = heartbeat.deadline
        # Said once per lapse even when the delivery side fenced every lease first.
        if active or self._warned_at != deadline:
            self._warned_at = deadline
            why = (
                "a heartbeat landed only after the fence had passed"
                if heartbeat.lapsed
                else f"no heartbeat has landed for {time.monotonic() - heartbeat.last_sent_ok:.1f}s"
            )
            log.warning(
                "[%s] %s: stopping %d shard(s) before others take them over",
                self.client_id,
                why,
                len(active),
            )
        for lease in active:
            self._checkpointer.lose(lease, "heartbeats are failing")
        if heartbeat.lapsed:
            log.info("[%s] heartbeats land again: claiming shards anew", self.client_id)
            heartbeat.resume()
