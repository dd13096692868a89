"""Fenced checkpoint writes: periodic flush, graceful handoff, finishing a drained shard.

Every write is conditional on the lease (owner and lease number). A refused write means the shard
was taken over: the lease is marked lost at once, which stops its fetcher and makes the delivery
side drop its buffered records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..errors import TransientAWSError
from ..metrics import Metrics
from ..statestore.base import StateStore
from .hooks import RebalanceHooks
from .leases import Lease, LeaseStatus
from .supervisor import wait_done

log = logging.getLogger("kinesumer.checkpoint")

#: How often a handoff or a finish re-checks whether the record in the application's hands is
#: done. Both are rare events; polling keeps the delivery hot path free of any signalling.
_POLL = 0.01


class Checkpointer:
    def __init__(
        self,
        store: StateStore,
        client_id: str,
        hooks: RebalanceHooks | None = None,
        on_lost: Callable[[Lease], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._store = store
        self._client_id = client_id
        self._hooks = hooks or RebalanceHooks()
        self._on_lost = on_lost
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        #: An exactly-once sink writes the positions, in the same transaction as its records
        #: (the engine sets this before the first claim). A position written here could then be
        #: older than the one the sink committed a moment before (this flush read it first) and
        #: move the checkpoint back: a crash would deliver a record the sink already holds. So
        #: only the finished flag and the release are written, never a position.
        self.positions_by_sink = False
        self.writes = 0
        self.conflicts = 0

    def _lock(self, lease: Lease) -> asyncio.Lock:
        # Writes of one lease are serialized, so an older position can never land after a newer.
        return self._locks.setdefault(lease.key, asyncio.Lock())

    async def write(self, lease: Lease, *, finished: bool = False, release: bool = False) -> bool:
        """Write the lease's processed position (if it moved, and no sink writes positions),
        the finished flag and/or release ownership. False, with the lease marked lost, when the
        write was refused."""
        async with self._lock(lease):
            if lease.status is LeaseStatus.LOST:
                return False
            position = lease.processed
            moved = position != lease.checkpointed and not self.positions_by_sink
            if not (moved or finished or release):
                return True
            ok = await self._store.write_checkpoint(
                lease.checkpoint, position if moved else None, finished=finished, release=release
            )
            self.writes += 1
            self._metrics.checkpoint(lease.key[0], conflict=not ok)
            if not ok:
                self.conflicts += 1
                self.lose(lease, "a checkpoint write was refused: another client owns the shard")
                return False
            if moved:
                lease.mark_checkpointed(position)
            return True

    async def record_start(self, lease: Lease, started_at_ms: int) -> bool:
        """Fetcher, before the first record of a ``LATEST`` read is buffered: record where the
        read began in the checkpoint item, so that every later owner starts there. Retried
        while DynamoDB has trouble; False (the lease marked lost) when the write was refused,
        or when the lease ended meanwhile."""
        delay = 0.2
        while lease.deliverable:
            try:
                async with self._lock(lease):
                    ok = await self._store.record_start(lease.checkpoint, started_at_ms)
            except TransientAWSError as exc:
                log.warning(
                    "[%s] recording where %s/%s starts failed, retrying in %.1fs: %s",
                    self._client_id,
                    *lease.key,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.writes += 1
            self._metrics.checkpoint(lease.key[0], conflict=not ok)
            if not ok:
                self.conflicts += 1
                self.lose(lease, "recording its start was refused: another client owns the shard")
            return ok
        return False

    async def _release(self, lease: Lease, finished: bool) -> bool:
        """The final write of a handoff or finish, retried until it lands or the lease is lost.

        Giving up is not an option: until this write lands the shard is owned by a live member
        (us), so nobody else may claim it. The caller bounds the wait when closing.
        """
        delay = 0.2
        while True:
            try:
                return await self.write(lease, finished=finished, release=True)
            except TransientAWSError as exc:
                log.warning(
                    "[%s] releasing %s/%s failed, retrying in %.1fs: %s",
                    self._client_id,
                    *lease.key,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def flush(self, leases: list[Lease]) -> None:
        """Write every active lease whose processed position moved since its last write."""
        await asyncio.gather(
            *(self.write(lease) for lease in leases if lease.status is LeaseStatus.ACTIVE)
        )

    async def flush_periodically(
        self, leases: dict[tuple[str, str], Lease], interval: float, stop: asyncio.Event
    ) -> None:
        """Flush every ``interval`` seconds until ``stop`` is set; transient errors are logged
        and the next flush tries again."""
        while not stop.is_set():
            await wait_done(stop.wait(), interval)
            if stop.is_set():
                return
            try:
                await self.flush(list(leases.values()))
            except TransientAWSError as exc:
                log.warning("[%s] checkpoint flush failed, will retry: %s", self._client_id, exc)

    def lose(self, lease: Lease, why: str) -> None:
        """Stop a lease at once: no more deliveries, fetcher cancelled, hook told. Idempotent;
        the status may already be LOST (the delivery side sets it the moment it drops records)."""
        if not lease.lose():
            return
        stream, shard_id = lease.key
        log.warning("[%s] lost %s/%s: %s", self._client_id, stream, shard_id, why)
        if self._on_lost is not None:
            self._on_lost(lease)

    async def handoff(self, lease: Lease, timeout: float) -> bool:
        """Give a shard back: stop fetching and delivering, let what the application holds
        finish (a delivered record, or a batch read elsewhere; up to ``timeout``), write the
        checkpoint and release ownership."""
        stream, shard_id = lease.key
        started = time.monotonic()
        if not lease.begin_handoff():
            return False
        deadline = started + timeout
        # Polling (rare: once per handoff) keeps all signalling off the delivery hot path.
        while lease.in_hand and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)
        if lease.in_hand:
            log.warning(
                "[%s] %s/%s: the application did not finish its record within "
                "handoff_timeout=%.1fs; the next owner will deliver it again",
                self._client_id,
                stream,
                shard_id,
                timeout,
            )
        hook_error: Exception | None = None
        try:
            await self._hooks.revoked([lease.key])  # the application flushes its own state
        except Exception as exc:  # raised below, after the release: never strand the shard
            hook_error = exc
        released = await self._release(lease, finished=lease.drained)
        if hook_error is not None:
            raise hook_error
        if released:
            lease.release()
            self._metrics.handoff(time.monotonic() - started)
            log.info(
                "[%s] handed off %s/%s at %s in %.3fs",
                self._client_id,
                stream,
                shard_id,
                lease.processed.sequence_number if lease.processed else "the start",
                time.monotonic() - started,
            )
        return released

    async def finish(self, lease: Lease, on_finished: Callable[[Lease], None]) -> None:
        """After SHARD_END: once every record of the shard was processed, checkpoint it finished
        and release it, so children (whose owners wait for this flag) can start."""
        while lease.status is LeaseStatus.ACTIVE and not lease.drained:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)
        if lease.status is not LeaseStatus.ACTIVE:
            return
        if await self._release(lease, finished=True):
            lease.finish()
            log.info("[%s] finished %s/%s", self._client_id, *lease.key)
            on_finished(lease)
