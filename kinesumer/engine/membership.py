"""Membership: who is live, who leads, and this member's own liveness (its fence).

Each tick learns the sorted live ids (index 0 leads); the leader prunes members past
``client_timeout``. How they are learnt keeps a follower's cost flat however large the group:

- The leader reads every client item (strongly consistent, as every member did before) and
  publishes a *view*: an immutable member list, and a tiny head pointing to it with the moment
  its read started (``read_at``) and when it was published (every tick).
- A follower reads only the head (eventually consistent: half a read unit), and the list only
  when the head points to a new one. A stale answer is safe: an older view calls *fewer*
  members dead (the leader judged each one dead on a strongly consistent read started at that
  view's ``read_at``, after its fence had passed: heartbeat.py), and a member missing from it
  because it joined later wrote its claims after ``read_at``, which the claim rule (leasing.py:
  an owner written to since ``read_at_ms`` is judged at the next tick) does not take over.
- Joins and graceful leaves count themselves on the head (an atomic ADD): while the head's
  count is ahead of the one its list covers, followers read the client items directly, so
  joins and leaves move shards as fast as before. So do followers whose head is older than
  ``client_timeout`` (the leader crashed: every member then finds the same new leader from the
  client items, and it publishes), and followers missing from the list.
- Members of older versions read the client items directly and never publish; a group whose
  leader is one of them has no fresh head, so the others read directly too.
 The regular heartbeats come from
:class:`~kinesumer.engine.heartbeat.Heartbeat`'s thread; :meth:`Membership.announce` writes one
from the loop (at the join, and when the streams change). When no heartbeat has landed for too
long, :meth:`Membership.fence_if_expired` loses every active lease before others take them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from ..core import is_leader, live_clients
from ..core.membership import stale_clients
from ..models import ClientInfo
from ..statestore.base import MembershipView, MembershipViewStore, StateStore
from ..statestore.dynamodb.view import members_sk
from .checkpointer import Checkpointer
from .heartbeat import Heartbeat
from .leases import Lease, LeaseStatus

log = logging.getLogger("kinesumer.coordinator")

#: ``1`` (every member) or a comma-separated list of client ids: those members read every client
#: item each tick and neither follow nor publish a view nor count their joins, as kinesumer did
#: before views (for the cost benchmark's "before" and the mixed-version tests).
LEGACY_ENV = "KINESUMER_LEGACY_MEMBERSHIP"


def legacy_membership(client_id: str) -> bool:
    """Whether :data:`LEGACY_ENV` makes ``client_id`` read its members the old way."""
    value = os.environ.get(LEGACY_ENV, "")
    return value == "1" or client_id in value.split(",")


def _published_form(members: list[ClientInfo]) -> list[tuple[str, frozenset[str], str]]:
    return [(c.client_id, c.streams, c.assignment) for c in members]


class Membership:
    def __init__(
        self,
        client_id: str,
        client_timeout: float,
        store: StateStore,
        heartbeat: Heartbeat,
        checkpointer: Checkpointer,
        leases: dict[tuple[str, str], Lease],
    ) -> None:
        self.client_id = client_id
        self._timeout_ms = int(client_timeout * 1000)
        self._store = store
        self._heartbeat = heartbeat
        self._checkpointer = checkpointer
        self._leases = leases
        #: Members whose last heartbeat is within ``client_timeout``, sorted.
        self.live_ids: list[str] = []
        #: Their items (streams included), as last read.
        self.live: list[ClientInfo] = []
        #: Wall clock (ms) just before ``live_ids`` was read.
        self.read_at_ms = 0
        self.leader = False
        self._views: MembershipViewStore | None = None
        if isinstance(store, MembershipViewStore) and not legacy_membership(client_id):
            self._views = store
        self._list: tuple[str, list[ClientInfo]] = ("", [])  # last member list read or written
        self._published = False  # we published the head as it stands
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
        leadership; publish the view when leading. Returns the stale members (past
        ``client_timeout``), for the leader to prune (only a direct read finds them)."""
        views = self._views
        if views is None:
            return await self._read_direct()
        if not self.leader:
            head = await views.read_view_head(consistent=False)
            live = await self._follow(views, head)
            self._followed = head if live is not None else None
            if live is not None and head is not None:
                self.view_reads += 1
                views.follow_digests(head)  # this tick's shard cache digests come with it
                self._set_live(live, head.read_at_ms)
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
        head = self._head if alone else await views.read_view_head(consistent=False)
        stale = await self._read_direct()
        if self.leader:
            await self._publish(views, head)
        elif self._published and head is not None and head.leader == self.client_id:
            # We stepped down: send the followers to the client items now, not in T.
            self._published = False
            await views.publish_view(head, dataclasses.replace(head, published_at_ms=0), None)
        return stale

    async def view_moved(self) -> bool:
        """Between ticks (half way), a follower reads the head: True when it points to another
        member list, counts a join or leave, or went stale, so the coordinator ticks at once
        (a crash the leader published reaches the followers within half an interval). Members
        that read the client items anyway answer False without a read."""
        views, followed = self._views, self._followed
        if views is None or self.leader or followed is None:
            return False
        head = await views.read_view_head(consistent=False)
        return head is None or (
            head.members_key != followed.members_key
            or head.changes != head.seen_changes
            or int(time.time() * 1000) - head.published_at_ms > self._timeout_ms
        )

    async def _follow(
        self, views: MembershipViewStore, head: MembershipView | None
    ) -> list[ClientInfo] | None:
        """The published live members, or None when this tick must read the client items."""
        if head is None or not head.members_key or head.changes != head.seen_changes:
            return None  # no view yet, or a join or leave it does not cover yet
        if int(time.time() * 1000) - head.published_at_ms > self._timeout_ms:
            return None  # the leader stopped publishing (crashed, or an older version leads)
        key, members = self._list
        if key != head.members_key:
            listed = await views.read_view_members(head.members_key)
            if listed is None:
                return None  # replaced since the head was read
            self._list = key, members = head.members_key, listed
        if self.client_id not in (c.client_id for c in members):
            return None  # we joined after it, or were dropped: judge for ourselves
        return members

    async def _publish(self, views: MembershipViewStore, seen: MembershipView | None) -> None:
        """Leader: publish the live members just read (a new list only when they changed)."""
        key, members = self._list
        unchanged = (
            seen is not None and seen.members_key == key and seen.changes == seen.seen_changes
        )
        if unchanged and _published_form(members) == _published_form(self.live):
            if self.live_ids == [self.client_id] and self._published:
                return  # alone: no follower needs a fresh head (a joiner reads directly)
            new_list = None
        else:
            key, new_list = members_sk(self.client_id, self.read_at_ms), self.live
        head = MembershipView(
            version=(seen.version if seen else 0) + (new_list is not None),
            members_key=key,
            read_at_ms=self.read_at_ms,
            published_at_ms=int(time.time() * 1000),
            leader=self.client_id,
            seen_changes=seen.changes if seen else 0,
        )
        self._published = await views.publish_view(seen, head, new_list)
        # As a seen head next tick, when alone: the count it covers is the count it knows.
        self._head = (
            dataclasses.replace(head, changes=head.seen_changes) if self._published else None
        )
        if self._published and new_list is not None:
            self._list = key, new_list

    async def _read_direct(self) -> list[ClientInfo]:
        """Read every client item (strongly consistent); the live ones as of the read's start."""
        self.direct_reads += 1
        read_at = int(time.time() * 1000)
        clients = await self._store.list_clients()
        # Judged at the moment the read started, not when it returned: a heartbeat that landed
        # during a slow read may be missing from it, and its member need not have fenced yet.
        # Every heartbeat acknowledged before ``read_at`` is in the answer, so a member called
        # dead here had passed its fence (heartbeat.py) before ``read_at``.
        self._set_live(live_clients(clients, read_at, self._timeout_ms), read_at)
        return stale_clients(clients, read_at, self._timeout_ms)

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
        """Leader: delete the items of dead members (conditional: a revived one is spared)."""
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
        active = [lease for lease in self._leases.values() if lease.status is LeaseStatus.ACTIVE]
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
