"""Membership: who is live, who leads, and this member's own liveness (its fence).

Each tick reads the client items and keeps the sorted live ids (index 0 leads); the leader prunes
members past ``client_timeout``. The regular heartbeats come from
:class:`~kinesumer.engine.heartbeat.Heartbeat`'s thread; :meth:`Membership.announce` writes one
from the loop (at the join, and when the streams change). When no heartbeat has landed for too
long, :meth:`Membership.fence_if_expired` loses every active lease before others take them.
"""

from __future__ import annotations

import logging
import time

from ..core import is_leader, live_clients
from ..core.membership import stale_clients
from ..models import ClientInfo
from ..statestore.base import StateStore
from .checkpointer import Checkpointer
from .heartbeat import Heartbeat
from .leases import Lease, LeaseStatus

log = logging.getLogger("kinesumer.coordinator")


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

    async def read_members(self) -> list[ClientInfo]:
        """Read the client items; update the live ids and the leadership. Returns the stale
        members (past ``client_timeout``), for the leader to prune."""
        read_at = int(time.time() * 1000)
        clients = await self._store.list_clients()
        # Judged at the moment the read started, not when it returned: a heartbeat that landed
        # during a slow read may be missing from it, and its member need not have fenced yet.
        # Every heartbeat acknowledged before ``read_at`` is in the answer, so a member called
        # dead here had passed its fence (heartbeat.py) before ``read_at``.
        self.live = live_clients(clients, read_at, self._timeout_ms)
        self.live_ids = [c.client_id for c in self.live]
        self.read_at_ms = read_at
        was_leader, self.leader = self.leader, is_leader(self.client_id, self.live_ids)
        if self.leader != was_leader:
            log.info("[%s] %s leader", self.client_id, "became" if self.leader else "is no longer")
        return stale_clients(clients, read_at, self._timeout_ms)

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
