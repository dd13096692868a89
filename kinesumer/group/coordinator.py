"""The group coordinator: the tick that keeps this member's leases matching the group.

Every ``heartbeat_interval`` a tick runs the protocol's phases in order:

1. read the members (:class:`~.membership.Membership`): live ids, leader;
2. leader only, every ``shard_sync_interval``: list the shards and prune dead members;
3. bring the shard caches up to date (:class:`~.shard_sync.ShardSync`);
4. compute this member's shards with the pure :func:`kinesumer.core.shards_of` (or, in
   ``assignment="sticky"`` mode, :func:`kinesumer.core.sticky_shards_of`) and move the leases to
   match (:class:`~.leasing.Leasing`: handoffs, claims).

Sticky assignment also needs the shards' current owners (the checkpoint items). They are read
only when the live members or the shard lists changed, or while a claim of ours is pending: a
rebalance's target is the same from every state it passes through (:mod:`kinesumer.core.sticky`),
so a member that reached its target has nothing new to learn from the owners.

Between ticks, pending claims are retried every ``CLAIM_RETRY`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Config
from ..core import active_shards, group_mode, shards_of, sticky_shards_of
from ..core.controls import merge
from ..core.weighted import Weights, weighted_shards_of
from ..errors import CorruptStateError, TransientAWSError
from ..observability.metrics import Metrics
from ..runtime.supervisor import wait_done
from .controls import GroupControls
from .leases import Lease, LeaseStatus, ReadProgress
from .leasing import Leasing
from .membership import Membership
from .shard_sync import ShardSync

log = logging.getLogger("kinesumer.coordinator")

#: Seconds between retries of refused claims, between ticks.
CLAIM_RETRY = 0.2


def keyed_weights(weights: Weights, key: Callable[[str], str]) -> dict[str, dict[str, float]]:
    """The load weights by state key (the load reports name streams as their members do)."""
    keyed: dict[str, dict[str, float]] = {}
    for stream, by_shard in weights.items():
        keyed.setdefault(key(stream), {}).update(by_shard)
    return keyed


class Coordinator:
    def __init__(
        self,
        config: Config,
        client_id: str,
        leases: Mapping[tuple[str, str], Lease[ReadProgress]],
        membership: Membership,
        shard_sync: ShardSync,
        leasing: Leasing[Any],  # the tick never touches the read progress
        metrics: Metrics,
    ) -> None:
        self._config = config
        self.client_id = client_id
        self._leases = leases
        self.membership = membership
        self.shard_sync = shard_sync
        self.leasing = leasing
        self._metrics = metrics
        self.streams: tuple[str, ...] = ()
        #: A stream's name in the state table (:func:`kinesumer.accounts.state_key`): the tick
        #: assigns over these, so that a member naming a stream ``orders`` and one naming it by
        #: its home ARN (in a rolling upgrade) compute the same assignment.
        self.stream_key: Callable[[str], str] = str
        self.ticks = 0
        #: The mode the group assigns with now (see :func:`kinesumer.core.group_mode`); starts
        #: as configured, so a sticky member that finds a range member at once says so.
        self.mode: str = config.assignment
        self._sticky_inputs: object = None  # (members, shards) of the last sticky computation
        self._sticky_mine: dict[str, tuple[str, ...]] = {}
        #: Operator controls and weights (group/controls.py); None: none applied (unit tests).
        self.controls: GroupControls | None = None
        self._raw_leader = False  # the leader by the design's rule, before step-downs
        self._controlled_leader = False
        self._controls_unreadable = ""  # the last unreadable controls error, logged once

    async def tick(self) -> None:
        """Read the members, do the leader's duties, and move shards to match the assignment.
        (Heartbeats run on their own thread.)"""
        self.ticks += 1
        config = self._config
        membership = self.membership
        membership.leader = self._raw_leader
        stale = await membership.read_members()  # 1
        forced = await self._apply_controls()
        to_sync: set[str] = set()
        if membership.leader and (forced or self.shard_sync.due(config.shard_sync_interval)):  # 2
            to_sync = set(self.streams)
            if self.controls is not None and not self._raw_leader:  # leader by a step-down
                stale = await self.controls.stale_members(config.client_timeout)
            await membership.prune(stale)
            if self.controls is not None:
                await self.controls.leader_duties(membership.live_ids)
            self.shard_sync.synced_all()
        await self.shard_sync.refresh(self.streams, to_sync)  # 3

        if not membership.is_live:  # 4
            # Our heartbeat did not land (or we were pruned): we own nothing until it does.
            log.warning("[%s] not in the live member list; releasing all shards", self.client_id)
            await self.leasing.rebalance({})
            self._report_membership()
            return
        # The assignment is computed over state keys (kinesumer.accounts.state_key), by every
        # member alike: the functions depend on the streams' text (range: their order; sticky:
        # a hash of the stream; pins: the stream), so a member naming ``orders`` and one naming
        # its home ARN must compute over one text, or each leaves a shard to the other.
        key = self.stream_key
        ours = {key(s): s for s in self.streams}
        members = {c.client_id: frozenset(map(key, c.streams)) for c in membership.live}
        shards = {
            key(stream): active_shards(cache.shards, cache.finished)
            for stream, cache in self.shard_sync.caches.items()
            if stream in self.streams
        }
        self._choose_mode()
        pinned: dict[str, tuple[str, ...]] = {}
        if self.controls is not None:  # pins and drains leave the automatic assignment
            split = self.controls.split(members, shards, key)
            members, shards = split.members, split.shards
            pinned = split.pinned.get(self.client_id, {})
        if self.mode == "sticky":
            mine = await self._sticky_shards(members, shards, ours)
        elif self.mode == "weighted" and self.controls is not None:
            weights = keyed_weights(self.controls.weights, key)
            mine = weighted_shards_of(self.client_id, members, shards, weights)
        else:
            mine = shards_of(self.client_id, members, shards)
        keyed = merge(mine, pinned)
        await self.leasing.rebalance({ours.get(k, k): ids for k, ids in keyed.items()})
        self._report_membership()

    async def _apply_controls(self) -> bool:
        """Read the controls when due; step-downs decide the leader. True: a forced rebalance
        was just seen (sticky mode then lays the shards out afresh, see group/controls.py)."""
        membership, controls = self.membership, self.controls
        self._raw_leader = membership.leader
        if controls is None:
            return False
        try:
            forced = await controls.refresh(self.leasing.active_keys())
        except CorruptStateError as exc:
            # Unreadable controls (any app with access to the table can write them): keep
            # the last good ones rather than stop the group; read them again next tick.
            if str(exc) != self._controls_unreadable:
                self._controls_unreadable = str(exc)
                log.warning("[%s] keeping the last controls read: %s", self.client_id, exc)
            forced = False
        if forced:
            self._sticky_inputs = None
        leader = membership.is_live and controls.leads(membership.live_ids)
        if leader != self._controlled_leader and leader != self._raw_leader:
            log.info("[%s] %s leader (step-downs)", self.client_id, "is" if leader else "not")
        membership.leader = self._controlled_leader = leader
        return forced

    def _choose_mode(self) -> None:
        live = self.membership.live
        mode = group_mode(self._config.assignment, (c.assignment for c in live))
        if mode != self.mode:
            self._sticky_inputs = None
            if mode == "range" and self._config.assignment == "sticky":
                others = sorted(c.client_id for c in live if c.assignment != "sticky")
                log.warning(
                    "[%s] assigning by range, not sticky: live members %s are not configured "
                    "assignment='sticky' (the whole group must agree on one mode)",
                    self.client_id,
                    ", ".join(others),
                )
            else:
                log.info("[%s] the group assigns by %s", self.client_id, mode)
        self.mode = mode

    async def _sticky_shards(
        self,
        members: dict[str, frozenset[str]],
        shards: dict[str, list[str]],
        ours: dict[str, str],
    ) -> dict[str, tuple[str, ...]]:
        """Sticky mode: our shards (by state key), from fresh owners when anything could have
        changed. ``ours``: state key -> our name of the stream (the owners are read by it)."""
        inputs = (members, shards)
        fresh = self.controls is not None and self.controls.fresh_layout
        if fresh and self._sticky_inputs is not None and inputs != self._sticky_inputs:
            fresh = self.controls.fresh_layout = False  # type: ignore[union-attr]
        if inputs != self._sticky_inputs or self.leasing.has_pending:
            owners: dict[str, dict[str, str]] = {}
            if not fresh:
                read = await self.leasing.read_owners(ours[k] for k in shards)
                owners = {k: read[ours[k]] for k in shards}
            self._sticky_mine = sticky_shards_of(self.client_id, members, shards, owners)
            self._sticky_inputs = inputs
        return self._sticky_mine

    def _report_membership(self) -> None:
        active = sum(
            1 for lease in self._leases.values() if lease.claim.status is LeaseStatus.ACTIVE
        )
        self._metrics.membership(active, self.membership.leader)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set. Transient AWS errors skip a tick (logged); anything else
        propagates and stops the engine."""
        interval = self._config.heartbeat_interval
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
            except TransientAWSError as exc:
                log.warning("[%s] coordinator tick failed: %s", self.client_id, exc)
            if await self._wait(started, started + interval / 2, stop):
                continue  # a verdict fell due: judge it now
            if await self._view_moved(stop):
                continue  # the membership view changed: tick now, not half an interval later
            await self._wait(started, started + interval, stop)

    async def _wait(self, started: float, next_tick: float, stop: asyncio.Event) -> bool:
        """Retry claims until ``next_tick``, or until a verdict falls due before it (True: tick
        now). Only a moment after this tick's start counts: a tick that could not read (a
        transient error) does not make the next one come at once again."""
        due = self.membership.verdict_due()
        if due is not None and started < due < next_tick:
            await self._retry_claims_until(due, stop)
            return not stop.is_set()
        await self._retry_claims_until(next_tick, stop)
        return False

    async def _view_moved(self, stop: asyncio.Event) -> bool:
        try:
            return not stop.is_set() and await self.membership.view_moved()
        except TransientAWSError as exc:
            log.warning("[%s] membership view read failed: %s", self.client_id, exc)
            return False

    async def _retry_claims_until(self, next_tick: float, stop: asyncio.Event) -> None:
        while not stop.is_set() and time.monotonic() < next_tick:
            pause = min(CLAIM_RETRY, max(0.0, next_tick - time.monotonic()))
            await wait_done(stop.wait(), pause)
            if self.leasing.has_pending and not stop.is_set():
                try:
                    await self.leasing.claim_pending()
                except TransientAWSError as exc:
                    log.warning("[%s] claim retry failed: %s", self.client_id, exc)
