"""Fenced checkpoint writes: periodic flush, graceful handoff, finishing a drained shard.

Every write is conditional on the lease (owner and lease number). A refused write means the shard
was taken over: the lease is marked lost at once, which stops its fetcher and makes the delivery
side drop its buffered records. One exception: a release (handoff or finish) whose first attempt
landed but whose answer was lost is refused when retried (the owner is gone already); the item
is read back, and when it shows exactly what this release wrote, the release counts as done.

A lease whose shard had nothing to write at a periodic flush (an idle shard) is checked by a
read instead (:meth:`Checkpointer.flush` with ``check``): a lease number in the item other than
ours means the shard was moved under us (an operator's rewind or move, which bump the lease
and remove the owner, or a takeover) and the lease is lost as if a write had been refused. So a
member notices a move within one ``commit_interval`` (plus the flush's own calls) whether or
not the shard has records: at the first periodic flush that starts after the move, the lease
either writes (refused) or is read. It costs one strongly consistent BatchGetItem per 100 idle
shards per ``commit_interval``; shards that write are confirmed by their writes' conditions.

With the position goes the ``done`` attribute: the runs of records done above it
(:mod:`kinesumer.core.done_ranges`), so the next owner skips them. It is bounded; runs that do
not fit are left out (delivered again, at-least-once) and counted in :attr:`done_truncated`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from ..core import done_ranges
from ..errors import TransientAWSError
from ..models import Position
from ..observability.metrics import Metrics
from ..observability.telemetry import Tracing, written
from ..runtime.supervisor import wait_done
from ..statestore.base import StateStore
from .hooks import RebalanceHooks
from .leases import Lease, LeaseStatus, ProgressT, ReadProgress

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
        on_lost: Callable[[Lease[ReadProgress]], None] | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        #: Spans of the writes (kinesumer.observability.telemetry); none by default.
        self._tracing = tracing or Tracing()
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
        #: Leases found moved under us by a lease check (not by a refused write).
        self.moves_seen = 0
        #: Landed writes, counted, and the count at each lease's last one: a flush checks
        #: the leases none of whose writes landed since it began.
        self._landed_count = 0
        self._landed_at: dict[tuple[str, str], int] = {}
        #: Writes whose done runs did not all fit in the budget (the rest is delivered again).
        self.done_truncated = 0

    def _lock(self, lease: Lease[ReadProgress]) -> asyncio.Lock:
        # Writes of one lease are serialized, so an older position can never land after a newer.
        return self._locks.setdefault(lease.key, asyncio.Lock())

    async def write(
        self, lease: Lease[ReadProgress], *, finished: bool = False, release: bool = False
    ) -> bool:
        """Write the lease's processed position (if it moved, and no sink writes positions),
        the finished flag and/or release ownership. False, with the lease marked lost, when the
        write was refused."""
        claim = lease.claim
        async with self._lock(lease):
            if claim.status is LeaseStatus.LOST:
                return False
            if self.positions_by_sink:
                position, done = lease.progress.processed, None
            else:
                position, runs = lease.progress.done_marks()
                done = self._encode(lease, position, runs)
            moved = position != claim.checkpointed and not self.positions_by_sink
            changed = done is not None and done != claim.done_written
            if not (moved or changed or finished or release):
                return True
            new = position if moved else None
            extra = {"done": done} if changed else {}
            kind = "finish" if finished else "release" if release else "flush"
            with self._tracing.checkpoint(lease.key, claim.checkpoint.lease, new, kind) as span:
                ok = await self._store.write_checkpoint(
                    claim.checkpoint, new, finished=finished, release=release, **extra
                )
                self.writes += 1
                if not ok and release:
                    ok = await self._landed(lease, new, finished, done if changed else None)
                written(span, ok)
            self._metrics.checkpoint(lease.key[0], conflict=not ok)
            if not ok:
                self.conflicts += 1
                self.lose(lease, "a checkpoint write was refused: another client owns the shard")
                return False
            self._landed_count += 1
            self._landed_at[lease.key] = self._landed_count
            if moved:
                claim.mark_checkpointed(position)
            if changed:
                claim.mark_done_written(done)  # type: ignore[arg-type]
            return True

    async def record_start(self, lease: Lease[ReadProgress], started_at_ms: int) -> bool:
        """Fetcher, before the first record of a ``LATEST`` read is buffered: record where the
        read began in the checkpoint item, so that every later owner starts there. Retried
        while DynamoDB has trouble; False (the lease marked lost) when the write was refused,
        or when the lease ended meanwhile."""
        delay = 0.2
        while lease.claim.deliverable:
            try:
                async with self._lock(lease):
                    with self._tracing.checkpoint(
                        lease.key, lease.claim.checkpoint.lease, None, "start"
                    ) as span:
                        ok = await self._store.record_start(lease.claim.checkpoint, started_at_ms)
                        written(span, ok)
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

    def _encode(
        self, lease: Lease[ReadProgress], position: Position | None, runs: list[done_ranges.Run]
    ) -> bytes:
        if not runs:
            return b""
        blob, kept = done_ranges.encode(position, runs)
        if kept < len(runs):
            self.done_truncated += 1
            # A WARNING the first time (it says the budget is too small for this load), then
            # only counted.
            log.log(
                logging.WARNING if self.done_truncated == 1 else logging.DEBUG,
                "[%s] %s/%s: %d of %d done runs fit in the checkpoint; the rest will be "
                "delivered again after a handoff or crash",
                self._client_id,
                *lease.key,
                kept,
                len(runs),
            )
        return blob

    async def _landed(
        self,
        lease: Lease[ReadProgress],
        position: Position | None,
        finished: bool,
        done: bytes | None,
    ) -> bool:
        """A release was refused: did an earlier attempt of it land (its answer lost)? Only
        this lease's release removes the owner and keeps the lease number (a claim or an
        operator's move bumps it), so the item shows exactly what it wrote if it did."""
        stream, shard_id = lease.key
        item = (await self._store.get_checkpoints(stream, [shard_id])).get(shard_id)
        if item is None or item.owner is not None or item.lease != lease.claim.checkpoint.lease:
            return False
        if finished and not item.finished:
            return False
        if position is not None and (item.sequence_number, item.sub_sequence_number) != position:
            return False
        if done is not None and item.done != done:
            return False
        log.info(
            "[%s] %s/%s: the release had landed (its answer was lost)", self._client_id, *lease.key
        )
        return True

    async def _release(self, lease: Lease[ReadProgress], finished: bool) -> bool:
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

    async def flush(self, leases: list[Lease[ReadProgress]], *, check: bool = False) -> None:
        """Write every active lease whose processed position moved since its last write. With
        ``check``, then read the items of the active leases that wrote nothing and lose those
        moved under us (see the module docstring)."""
        began = self._landed_count
        active = [lease for lease in leases if lease.claim.status is LeaseStatus.ACTIVE]
        await asyncio.gather(*(self.write(lease) for lease in active))
        if check:
            await self.check_leases(
                [lease for lease in active if self._landed_at.get(lease.key, 0) <= began]
            )

    async def check_leases(self, leases: list[Lease[ReadProgress]]) -> None:
        """Read the checkpoint items of ``leases`` (one BatchGetItem per stream and 100 shards)
        and lose every active one whose item holds another lease number: someone moved the
        shard (a claim or an operator's rewind or move bump it; our own release and finish
        keep it, so they never count). An item that cannot be read back is left alone (the
        store reports it); one that is gone was removed by an operator: lost too."""
        streams = sorted({lease.key[0] for lease in leases})
        for stream in streams:
            mine = [lease for lease in leases if lease.key[0] == stream]
            found = await self._store.get_checkpoints(stream, [lease.key[1] for lease in mine])
            for lease in mine:
                shard_id = lease.key[1]
                item = found.get(shard_id)
                if lease.claim.status is not LeaseStatus.ACTIVE:
                    continue
                if item is None and self._store.checkpoint_unreadable(stream, shard_id):
                    continue
                if item is not None and item.lease == lease.claim.checkpoint.lease:
                    continue
                self.moves_seen += 1
                self.lose(
                    lease,
                    "its checkpoint item was moved under it (an operator's rewind or move, or "
                    "another member's claim)",
                )

    async def flush_periodically(
        self,
        leases: Mapping[tuple[str, str], Lease[ReadProgress]],
        interval: float,
        stop: asyncio.Event,
    ) -> None:
        """Flush every ``interval`` seconds until ``stop`` is set; transient errors are logged
        and the next flush tries again."""
        while not stop.is_set():
            await wait_done(stop.wait(), interval)
            if stop.is_set():
                return
            try:
                await self.flush(list(leases.values()), check=True)
            except TransientAWSError as exc:
                log.warning("[%s] checkpoint flush failed, will retry: %s", self._client_id, exc)

    def lose(self, lease: Lease[ReadProgress], why: str) -> None:
        """Stop a lease at once: no more deliveries, fetcher cancelled, hook told. Idempotent;
        the status may already be LOST (the delivery side sets it the moment it drops records)."""
        if not lease.claim.lose():
            return
        lease.progress.stop_fetching()
        stream, shard_id = lease.key
        log.warning("[%s] lost %s/%s: %s", self._client_id, stream, shard_id, why)
        if self._on_lost is not None:
            self._on_lost(lease)

    async def handoff(self, lease: Lease[ReadProgress], timeout: float) -> bool:
        """Give a shard back: stop fetching and delivering, let what the application holds
        finish (a delivered record, or a batch read elsewhere; up to ``timeout``), write the
        checkpoint and release ownership."""
        stream, shard_id = lease.key
        started = time.monotonic()
        if not lease.claim.begin_handoff():
            return False
        progress = lease.progress
        progress.stop_fetching()
        deadline = started + timeout
        # Polling (rare: once per handoff) keeps all signalling off the delivery hot path.
        while progress.in_hand and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)
        if progress.in_hand:
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
        released = await self._release(lease, finished=progress.drained)
        if hook_error is not None:
            raise hook_error
        if released:
            lease.claim.release()
            self._metrics.handoff(time.monotonic() - started)
            log.info(
                "[%s] handed off %s/%s at %s in %.3fs",
                self._client_id,
                stream,
                shard_id,
                progress.processed.sequence_number if progress.processed else "the start",
                time.monotonic() - started,
            )
        return released

    async def give_back(self, lease: Lease[ReadProgress]) -> None:
        """Release a lease nothing was read under (the on_assigned hook failed): no wait, no
        on_revoked (the application never heard of it), the checkpoint as it was."""
        if not lease.claim.begin_handoff():
            return
        lease.progress.stop_fetching()
        if await self._release(lease, finished=False):
            lease.claim.release()
            log.info("[%s] gave %s/%s back unread", self._client_id, *lease.key)

    async def finish(
        self, lease: Lease[ProgressT], on_finished: Callable[[Lease[ProgressT]], None]
    ) -> None:
        """After SHARD_END: once every record of the shard was processed, checkpoint it finished
        and release it, so children (whose owners wait for this flag) can start."""
        claim = lease.claim
        while claim.status is LeaseStatus.ACTIVE and not lease.progress.drained:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)
        if claim.status is not LeaseStatus.ACTIVE:
            return
        if await self._release(lease, finished=True):
            claim.finish()
            log.info("[%s] finished %s/%s", self._client_id, *lease.key)
            on_finished(lease)
