"""A broadcast member's checkpointer: its own positions, saved under its own key.

The group's :class:`~.checkpointer.Checkpointer` does the timing (periodic flush, the handoff
that waits for the record in hand at close, finishing a drained shard) and this subclass changes
only where a write goes: with ``Config.broadcast_resume`` to the member's own position items
(:mod:`kinesumer.statestore.dynamodb.positions`), never to the group's checkpoints; without it
nowhere (the positions are only marked, so ``commit()`` and ``close()`` behave the same).

A refused write means another process started with the same client id (a newer session wrote
the item): this one must not go on saving over it, so the write raises
:class:`~kinesumer.errors.StateStoreError` and the engine stops with it.
"""

from __future__ import annotations

import asyncio
import logging

from ..errors import StateStoreError, TransientAWSError
from ..group.checkpointer import Checkpointer
from ..group.hooks import RebalanceHooks
from ..group.leases import Lease, LeaseStatus, ReadProgress
from ..observability.metrics import Metrics
from ..statestore.base import BroadcastPositions, SavedPosition, StateStore
from .progress import ShardLease

log = logging.getLogger("kinesumer.checkpoint")

#: Pause between attempts to save where a shard starts, while DynamoDB has trouble.
RETRY_PAUSE = 1.0


class BroadcastCheckpointer(Checkpointer):
    """Saves ``lease.processed`` per shard as ``session`` of ``client_id``; ``session`` None
    (no resume): saves nothing."""

    def __init__(
        self,
        store: StateStore,
        positions: BroadcastPositions,
        client_id: str,
        session: int | None,
        hooks: RebalanceHooks,
        metrics: Metrics,
    ) -> None:
        super().__init__(store, client_id, hooks, None, metrics)
        self._positions = positions
        self._session = session

    async def check_leases(self, leases: list[Lease[ReadProgress]]) -> None:
        """Nothing to check: a broadcast member's shards have no group checkpoint items, no
        lease another member or an operator's move could take (its positions are its own
        session's items), so an idle shard is never moved under it."""

    async def write(
        self, lease: Lease[ReadProgress], *, finished: bool = False, release: bool = False
    ) -> bool:
        """Save the lease's processed position (if it moved) and/or the finished flag.
        ``release`` changes nothing here: nobody else reads this member's shards for it."""
        async with self._lock(lease):
            if lease.claim.status is LeaseStatus.LOST:
                return False
            position = lease.progress.processed
            moved = position != lease.claim.checkpointed
            if not (moved or finished):
                return True
            if self._session is not None:
                stream, shard_id = lease.key
                saved = SavedPosition(stream, shard_id, position if moved else None, None, finished)
                await self._save(saved)
            lease.claim.mark_checkpointed(position)
            return True

    async def save_start(self, lease: ShardLease, started_at_ms: int) -> bool:
        """Resume mode, a shard with nothing saved: save when the member began reading it,
        before reading, so a restart resumes from that instant. Retried while DynamoDB has
        trouble; False when the lease ended meanwhile."""
        if self._session is None:
            return True
        stream, shard_id = lease.key
        while lease.claim.deliverable:
            try:
                await self._save(SavedPosition(stream, shard_id, started_at_ms=started_at_ms))
                return True
            except TransientAWSError as exc:
                log.warning(
                    "[%s] saving where %s/%s starts failed, retrying: %s",
                    self._client_id,
                    stream,
                    shard_id,
                    exc,
                )
                await asyncio.sleep(RETRY_PAUSE)
        return False

    async def _save(self, saved: SavedPosition) -> None:
        assert self._session is not None
        ok = await self._positions.save_broadcast_position(self._client_id, self._session, saved)
        self.writes += 1
        self._metrics.checkpoint(saved.stream, conflict=not ok)
        if not ok:
            self.conflicts += 1
            raise StateStoreError(
                f"broadcast positions of client {self._client_id!r} were taken over by a newer "
                f"process with the same client_id (writing {saved.stream}/{saved.shard_id}); "
                f"give every broadcast member its own client_id"
            )
