"""The group coordinator: heartbeat, membership, leader duties, assignment and claims.

Every ``heartbeat_interval`` it reads the live members, and computes this client's
shards with the pure :func:`kinesumer.core.assign`. Shards that moved away are handed off
gracefully; new ones are claimed with a conditional write. A claim refused because the previous
owner is still live (it is handing off) is retried every ``_CLAIM_RETRY`` seconds until the next
tick, so a rebalance completes in a fraction of a tick after the previous owner lets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from ..config import Config
from ..core import active_shards, is_leader, live_clients, shards_of
from ..core.membership import stale_clients
from ..errors import TransientAWSError
from ..kinesis.reader import KinesisReader
from ..metrics import Metrics
from ..models import Checkpoint, ClientInfo, Shard
from ..statestore.base import ShardCache, StateStore
from .checkpointer import Checkpointer
from .heartbeat import Heartbeat
from .hooks import RebalanceHooks
from .leases import Lease, LeaseStatus

log = logging.getLogger("kinesumer.coordinator")

_CLAIM_RETRY = 0.2

StartFetcher = Callable[[Lease, Shard, ShardCache], None]


class Coordinator:
    def __init__(
        self,
        config: Config,
        client_id: str,
        store: StateStore,
        reader: KinesisReader,
        checkpointer: Checkpointer,
        leases: dict[tuple[str, str], Lease],
        start_fetcher: StartFetcher,
        heartbeat: Heartbeat,
        report: Callable[[BaseException, str], None],
        hooks: RebalanceHooks,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._config = config
        self.client_id = client_id
        self._store = store
        self._reader = reader
        self._checkpointer = checkpointer
        self._leases = leases
        self._start_fetcher = start_fetcher
        self._heartbeat = heartbeat
        self._report = report
        self._hooks = hooks
        self.streams: tuple[str, ...] = ()
        self.caches: dict[str, ShardCache] = {}
        self._digests: dict[str, str] = {}
        self.live_ids: list[str] = []
        self._members_read_ms = 0  # wall clock just before live_ids was read
        self.leader = False
        self._last_sync = float("-inf")
        self._pending: set[tuple[str, str]] = set()
        self._wanted: set[tuple[str, str]] = set()
        self._handoffs: set[asyncio.Task[bool]] = set()
        self._sync_requests: set[str] = set()
        self.ticks = 0
        self.rebalances = 0

    # -- membership ---------------------------------------------------------------------------
    async def heartbeat(self) -> None:
        """Write our client item now, from the loop (at start and when streams change); the
        regular heartbeats come from :class:`~kinesumer._heartbeat.Heartbeat`'s thread."""
        sent = time.monotonic()
        await self._store.heartbeat(self._heartbeat.info(), self._heartbeat.ttl_seconds)
        self._heartbeat.landed(sent)

    def fence_if_expired(self) -> None:
        if time.monotonic() < self._heartbeat.deadline:
            return
        active = [lease for lease in self._leases.values() if lease.status is LeaseStatus.ACTIVE]
        if active:
            log.warning(
                "[%s] no heartbeat has landed for %.1fs: stopping %d shard(s) before others "
                "take them over",
                self.client_id,
                time.monotonic() - self._heartbeat.last_sent_ok,
                len(active),
            )
        for lease in active:
            self._checkpointer.lose(lease, "heartbeats are failing")

    def request_sync(self, stream: str) -> None:
        """Ask for a shard sync of ``stream`` at the next tick (after a SHARD_END, so children
        appear without waiting for the leader's periodic sync)."""
        self._sync_requests.add(stream)

    # -- the tick -----------------------------------------------------------------------------
    async def tick(self) -> None:
        """Read the members, do the leader's duties, and move shards to match the assignment.
        (Heartbeats run separately: :meth:`run_heartbeats`.)"""
        self.ticks += 1
        config = self._config
        read_at = int(time.time() * 1000)
        clients = await self._store.list_clients()
        now_ms = int(time.time() * 1000)
        live = live_clients(clients, now_ms, int(config.client_timeout * 1000))
        self.live_ids = [c.client_id for c in live]
        self._members_read_ms = read_at
        was_leader, self.leader = self.leader, is_leader(self.client_id, self.live_ids)
        if self.leader != was_leader:
            log.info("[%s] %s leader", self.client_id, "became" if self.leader else "is no longer")

        due = time.monotonic() - self._last_sync >= config.shard_sync_interval
        to_sync = set(self._sync_requests)
        if self.leader and due:
            to_sync |= set(self.streams)
            await self._prune(stale_clients(clients, now_ms, int(config.client_timeout * 1000)))
            self._last_sync = time.monotonic()
        await self._refresh_caches(to_sync)

        if self.client_id not in self.live_ids:
            # Our heartbeat did not land (or we were pruned): we own nothing until it does.
            log.warning("[%s] not in the live member list; releasing all shards", self.client_id)
            await self._rebalance({})
            self._report_membership()
            return
        members = {c.client_id: c.streams for c in live}
        shards = {
            stream: active_shards(cache.shards, cache.finished)
            for stream, cache in self.caches.items()
            if stream in self.streams
        }
        await self._rebalance(shards_of(self.client_id, members, shards))
        self._report_membership()

    def _report_membership(self) -> None:
        active = sum(1 for lease in self._leases.values() if lease.status is LeaseStatus.ACTIVE)
        self._metrics.membership(active, self.leader)

    async def _prune(self, stale: list[ClientInfo]) -> None:
        for client in stale:
            if client.client_id == self.client_id:
                continue
            if await self._store.prune_client(client):
                log.info("[%s] pruned dead client %s", self.client_id, client.client_id)

    async def _refresh_caches(self, to_sync: set[str]) -> None:
        """Bring the local shard caches up to date; write the cache of any stream in ``to_sync``
        (or without a cache at all) from ListShards."""
        for stream in sorted(to_sync):
            await self.sync_stream(stream)
            self._sync_requests.discard(stream)
        digests = await self._store.shard_cache_digests(self.streams)
        for stream in self.streams:
            digest = digests.get(stream)
            if digest is None:
                await self.sync_stream(stream)
                continue
            if self._digests.get(stream) != digest:
                cache = await self._store.load_shard_cache(stream)
                if cache is not None:
                    self.caches[stream] = cache
                    self._digests[stream] = cache.digest

    async def sync_stream(self, stream: str) -> None:
        """List the stream's shards, learn which closed ones the group finished, and write the
        cache if it changed. The write is conditional on the digest we started from, so two
        writers cannot overwrite each other's newer view."""
        shards = await self._reader.list_shards(stream)
        closed = [s.shard_id for s in shards if s.closed]
        checkpoints = await self._store.get_checkpoints(stream, closed) if closed else {}
        finished = frozenset(sid for sid, c in checkpoints.items() if c.finished)
        cache = ShardCache(stream, tuple(shards), finished)
        current = self._digests.get(stream)
        if current is None:
            digests = await self._store.shard_cache_digests([stream])
            current = digests.get(stream)
        if cache.digest != current:
            if await self._store.save_shard_cache(cache, current):
                log.info(
                    "[%s] shard cache of %s: %d shards, %d finished",
                    self.client_id,
                    stream,
                    len(shards),
                    len(finished),
                )
            else:
                return  # someone else wrote a newer one: load it at the next tick
        self.caches[stream] = cache
        self._digests[stream] = cache.digest

    # -- assignment ---------------------------------------------------------------------------
    async def _rebalance(self, mine: dict[str, tuple[str, ...]]) -> None:
        wanted = {(stream, sid) for stream, ids in mine.items() for sid in ids}
        if wanted != self._wanted:
            self.rebalances += 1
            self._metrics.rebalanced()
        self._wanted = wanted
        owned = {k for k, lease in self._leases.items() if lease.status is LeaseStatus.ACTIVE}
        for key in sorted(owned - wanted):
            self.hand_off(self._leases[key], self._config.handoff_timeout)
        self._pending = wanted - owned
        await self.claim_pending()

    def hand_off(self, lease: Lease, timeout: float, in_hand_done: bool = False) -> None:
        task = asyncio.ensure_future(self._checkpointer.handoff(lease, timeout, in_hand_done))
        self._handoffs.add(task)

        def done(t: asyncio.Task[bool]) -> None:
            self._handoffs.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self._report(t.exception(), f"handoff of {lease.key[0]}/{lease.key[1]}")  # type: ignore[arg-type]
            if self._leases.get(lease.key) is lease and lease.status is not LeaseStatus.ACTIVE:
                del self._leases[lease.key]
                self._metrics.shard_dropped(*lease.key)

        task.add_done_callback(done)

    async def wait_handoffs(self) -> None:
        while self._handoffs:
            # Errors were reported by each task's done callback; here we only wait.
            await asyncio.gather(*list(self._handoffs), return_exceptions=True)

    async def claim_pending(self) -> None:
        """Try to claim every wanted shard not owned yet (several can be in flight at once)."""
        if not self._pending:
            return
        keys = sorted(self._pending)
        seen: dict[tuple[str, str], Checkpoint | None] = {}
        for stream in sorted({s for s, _ in keys}):
            ids = [sid for s, sid in keys if s == stream]
            found = await self._store.get_checkpoints(stream, ids)  # one read per 100 shards
            seen.update({(stream, sid): found.get(sid) for sid in ids})
        owned_before = {
            k for k, lease in self._leases.items() if lease.status is LeaseStatus.ACTIVE
        }
        results = await asyncio.gather(
            *(self._claim(k, seen[k]) for k in keys), return_exceptions=True
        )
        gained = [
            k
            for k, lease in self._leases.items()
            if lease.status is LeaseStatus.ACTIVE and k not in owned_before
        ]
        await self._hooks.assigned(gained)
        for key in gained:  # fetch only once the application has heard about the shard
            lease = self._leases[key]
            cache = self.caches[key[0]]
            self._start_fetcher(lease, cache.by_id().get(key[1], Shard(key[1])), cache)
        for key, result in zip(keys, results, strict=True):
            if result is True:
                self._pending.discard(key)
            elif isinstance(result, TransientAWSError):
                log.warning("[%s] claim of %s/%s: %s", self.client_id, *key, result)
            elif isinstance(result, BaseException):
                raise result

    def reclaim(self, key: tuple[str, str]) -> None:
        """A lease of ours was lost (fence, refused write): if the shard is still ours by the
        assignment, claim it again on the fast retry cadence rather than at the next tick."""
        if key in self._wanted:
            self._pending.add(key)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    async def _claim(self, key: tuple[str, str], seen: Checkpoint | None) -> bool:
        """True when the shard needs nothing more from us (claimed, or already finished).
        ``seen`` is its checkpoint as just read (strongly consistent)."""
        stream, shard_id = key
        if time.monotonic() >= self._heartbeat.deadline:
            return False  # fenced: claiming now would only be refused again at delivery
        existing = self._leases.get(key)
        if existing is not None and existing.status is LeaseStatus.ACTIVE:
            return True
        if existing is not None and existing.status is LeaseStatus.REVOKING:
            return False  # our own handoff is still running; claim again once it is done
        if seen is not None and seen.finished:
            return True
        if (
            seen is not None
            and seen.owner is not None
            and seen.owner != self.client_id
            and seen.owner in self.live_ids
        ):
            return False  # a live owner: it will hand the shard off at its next tick
        if (
            seen is not None
            and seen.owner not in (None, self.client_id)
            and seen.last_update_ms >= self._members_read_ms
        ):
            # Written since we last read the members: the owner may have joined after that read
            # rather than died. Judge it with the next tick's fresh member list.
            return False
        claimed = await self._store.claim(stream, shard_id, self.client_id, seen)
        if claimed is None:
            return False
        if seen is not None and seen.owner not in (None, self.client_id):
            log.info("[%s] took %s/%s over from %s", self.client_id, stream, shard_id, seen.owner)
        self._leases[key] = Lease(claimed)  # claim_pending starts its fetcher
        return True

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
            next_tick = started + interval
            while not stop.is_set() and time.monotonic() < next_tick:
                pause = min(_CLAIM_RETRY, max(0.0, next_tick - time.monotonic()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
                if self.has_pending and not stop.is_set():
                    try:
                        await self.claim_pending()
                    except TransientAWSError as exc:
                        log.warning("[%s] claim retry failed: %s", self.client_id, exc)
