"""Broadcast mode (``Config(broadcast=True)``): this member reads every shard of its streams.

For cache invalidation and the like, where every process must see every record. There is no
group: no claims, no fencing, no leader, no client item, and the group's checkpoints and shard
cache are never touched (a broadcast member and group members of the same app do not see each
other). What reads and delivers is the group engine's own (:class:`~.engine.Engine`): a
:class:`~.fetcher.ShardFetcher` per shard into the one bounded buffer, the same delivery cursor,
``next_batch()``, ``poll()``, ``commit()`` and ``close()``, so every face (``consume()``,
``poll()``, the async face, ``run()``) works unchanged. This module changes only who decides
what to read:

1. join: list each stream's shards (ListShards; no shard cache), decide every shard's start
   with the local :class:`~.broadcast_plan.ShardPlan` (parents before children, in this
   member's own reading), tell ``on_assigned``, start a fetcher per shard;
2. every ``shard_sync_interval``, and at once after a shard was read to its end: list again and
   start the shards not seen before (the children of a reshard);
3. positions: with ``broadcast_resume`` the :class:`~.broadcast_checkpointer.
   BroadcastCheckpointer` saves processed positions under the member's own key every
   ``commit_interval``, at ``commit()`` and at close; without it nothing is written anywhere;
4. close: stop fetching, let the record in hand finish (``handoff_timeout``), save, leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from functools import partial

from ..accounts import check_one_name_each, state_key
from ..config import Config
from ..errors import KinesumerError, TransientAWSError
from ..group.hooks import RebalanceHooks
from ..group.leases import LeaseStatus
from ..group.member import check_written_streams
from ..kinesis.transport import KinesisTransport
from ..models import Checkpoint
from ..runtime.lifecycle import run_to_the_end
from ..runtime.supervisor import Supervisor, wait_done
from ..statestore.base import BroadcastPositions, GroupState, SavedPosition
from .broadcast_checkpointer import BroadcastCheckpointer
from .broadcast_plan import ShardPlan, ShardStart
from .engine import Engine
from .fetcher import ShardFetcher
from .progress import ShardLease, shard_lease

log = logging.getLogger("kinesumer")


class BroadcastEngine(Engine):
    """An :class:`~.engine.Engine` whose shards are every shard of its streams."""

    def __init__(
        self,
        config: Config,
        hooks: RebalanceHooks | None = None,
        *,
        state: GroupState | None = None,
        kinesis: KinesisTransport | None = None,
    ) -> None:
        super().__init__(config, hooks, state=state, kinesis=kinesis)
        self.checkpointer: BroadcastCheckpointer
        self.positions: BroadcastPositions
        self._streams: tuple[str, ...] = ()
        self._plan: ShardPlan
        self._relist: asyncio.Event
        self._lister: asyncio.Task[None] | None = None

    # -- joining ------------------------------------------------------------------------------
    async def start(self, streams: tuple[str, ...], writes_to: tuple[str, ...] = ()) -> None:
        """Connect, check the streams, list their shards and start reading every one before
        returning. Joined already: change the streams."""
        lifecycle = self.lifecycle
        if lifecycle.joining and not lifecycle.closing_or_closed:
            await lifecycle.wait_joined()
            lifecycle.check()
        if lifecycle.joined and not lifecycle.closing_or_closed:
            lifecycle.check()
            if streams != self._streams:
                await self.refresh(streams)
            return
        await super().start(streams, writes_to)  # the lifecycle's checks, then _join below

    async def _join(self, streams: tuple[str, ...], writes_to: tuple[str, ...] = ()) -> None:
        config = self.config
        joined_at_ms = int(time.time() * 1000)
        self.supervisor = supervisor = Supervisor(self.client_id, self.lifecycle)
        supervisor.on_failure.append(self._stop_reading)
        self._relist = asyncio.Event()
        self.on_joining()
        self.loop = asyncio.get_running_loop()
        await self.open_clients()
        try:
            self.store = store = self.state_store()
            self.reader = self.kinesis_reader()
            await self.know_home(streams)  # the positions' keys of ARNs depend on it
            check_one_name_each(streams, self.home, "join")
            session, saved = None, {}
            if config.broadcast_resume:  # without it, DynamoDB is never called
                await store.check()
                session = await store.open_broadcast_session(self.client_id)
                saved = self._in_our_names(await store.broadcast_positions(self.client_id), streams)
            self.positions = store
            self.checkpointer = BroadcastCheckpointer(
                store, store, self.client_id, session, self.hooks, self.metrics
            )
            for stream in streams:
                await self.reader.check_stream(stream)
            await check_written_streams(self.reader, writes_to)
            self._plan = ShardPlan(
                config.initial_position, saved, joined_at_ms, config.broadcast_resume
            )
            self._streams = streams
            await self._list_and_read(streams)
        except BaseException:
            await supervisor.cancel_all()
            await self.aws.close()
            raise
        log.info("[%s] broadcast on %s", self.client_id, ", ".join(streams))
        self._lister = supervisor.spawn(self._keep_listing(), "shard lister")
        if config.broadcast_resume:
            supervisor.spawn(
                self.checkpointer.flush_periodically(
                    self.leases, config.commit_interval, supervisor.stop
                ),
                "position-flusher",
            )

    async def refresh(self, streams: tuple[str, ...]) -> None:
        """Read ``streams`` from now on: dropped streams' shards stop (their positions saved),
        new streams' shards start."""
        lifecycle = self.lifecycle
        lifecycle.check()
        added = tuple(s for s in streams if s not in self._streams)
        try:
            await self.know_home(added)
            check_one_name_each(streams, self.home, "refresh")
            for stream in added:
                await self.reader.check_stream(stream)
            saved = {}
            if added and self.config.broadcast_resume:
                found = await self.positions.broadcast_positions(self.client_id)
                saved = self._in_our_names(found, streams)
        except Exception:
            lifecycle.check()  # closed meanwhile (its clients with it): say that instead
            raise
        # Closed while AWS answered: start nothing (the close saved and stopped what it saw).
        lifecycle.check()
        # From here to the listing nothing awaits: the lister sees the new streams only with
        # their saved positions known, and never lists a dropped one again.
        dropped = set(self._streams) - set(streams)
        self._streams = streams
        for key, lease in list(self.leases.items()):
            if key[0] in dropped and lease.claim.status is LeaseStatus.ACTIVE:
                self.supervisor.spawn(self._stop_shard(lease), f"stop {key[0]}/{key[1]}")
        for stream in dropped:
            self._plan.forget(stream)
        self._plan.remember({k: v for k, v in saved.items() if k[0] in added})
        try:
            await self._list_and_read(added)
        except Exception:
            lifecycle.check()
            raise
        lifecycle.check()

    def _in_our_names(
        self, saved: dict[tuple[str, str], SavedPosition], streams: tuple[str, ...]
    ) -> dict[tuple[str, str], SavedPosition]:
        """Saved positions (kept under each stream's state key: ``orders`` for its home ARN
        too) by this member's names of ``streams``: a member that named ``orders`` and now
        names its home ARN resumes where it stood."""
        key = partial(state_key, home=self.home)
        ours = {key(s): s for s in streams}
        found: dict[tuple[str, str], SavedPosition] = {}
        for (stream, shard_id), position in sorted(saved.items()):
            name = ours.get(key(stream), stream)
            if (name, shard_id) not in found or stream == key(stream):  # the state key's first
                found[(name, shard_id)] = replace(position, stream=name)
        return found

    # -- reading ------------------------------------------------------------------------------
    async def _keep_listing(self) -> None:
        """List the shards every ``shard_sync_interval`` (sooner when a shard ended) until the
        engine stops; transient AWS errors wait for the next round."""
        stop, relist = self.supervisor.stop, self._relist
        while not stop.is_set():
            await wait_done(relist.wait(), self.config.shard_sync_interval)
            relist.clear()
            if stop.is_set():
                return
            try:
                await self._list_and_read(self._streams)
            except TransientAWSError as exc:
                log.warning("[%s] listing shards failed, will retry: %s", self.client_id, exc)

    async def _list_and_read(self, streams: tuple[str, ...]) -> None:
        """Start reading every shard of ``streams`` not seen before, one stream at a time (a
        failed listing leaves that stream's new shards for the next round)."""
        for stream in streams:
            shards = await self.reader.list_shards(stream)
            if self.supervisor.stop.is_set():  # closing or failed: start no more shards
                return
            if stream not in self._streams:  # dropped by a refresh during the listing
                continue
            starts = self._plan.new_shards(stream, shards)
            if not starts:
                continue
            leases = [self._lease_for(start) for start in starts]
            await self.hooks.assigned([start.key for start in starts])
            for lease, start in zip(leases, starts, strict=True):
                task = self.supervisor.spawn(self._read(lease, start), f"fetcher {start.key}")
                lease.progress.attach_fetcher(task)

    def _lease_for(self, start: ShardStart) -> ShardLease:
        stream, shard_id = start.key
        after = start.after
        lease = shard_lease(
            Checkpoint(
                stream,
                shard_id,
                after.sequence_number if after else None,
                after.sub_sequence_number if after else 0,
                owner=self.client_id,
                started_at_ms=start.since_ms,
            )
        )
        self.leases[start.key] = lease
        return lease

    async def _read(self, lease: ShardLease, start: ShardStart) -> None:
        # Resume mode, a LATEST read with nothing saved: the fetcher saves where it began (by
        # Kinesis's clock) before any record is read.
        record_start = self.checkpointer.save_start if start.started_at_ms is not None else None
        plan = self._plan

        async def parents_finished() -> bool:
            return plan.parents_finished(start)

        fetcher = ShardFetcher(
            lease,
            self.reader,
            self.buffer,
            self.config,
            start.initial,
            parents_finished,
            self._shard_ended,
            self.client_id,
            self.metrics,
            record_start,
        )
        await fetcher.run()

    def _shard_ended(self, lease: ShardLease) -> None:
        self.supervisor.spawn(self.checkpointer.finish(lease, self._shard_finished), "finish")

    def _shard_finished(self, lease: ShardLease) -> None:
        """Drained and saved finished: its children may start; list at once to find them."""
        self._plan.finish(lease.key)
        self._drop(lease)
        self._relist.set()

    async def _stop_shard(self, lease: ShardLease) -> None:
        await self.checkpointer.handoff(lease, self.config.handoff_timeout)
        self._drop(lease)

    def _drop(self, lease: ShardLease) -> None:
        if self.leases.get(lease.key) is lease:
            del self.leases[lease.key]
            self.metrics.shard_dropped(*lease.key)

    # -- leaving ------------------------------------------------------------------------------
    async def leave(self) -> None:
        """Stop fetching, let what the application holds finish (``handoff_timeout``), save the
        positions (resume mode), close the clients."""
        lifecycle = self.lifecycle
        if lifecycle.begin_close() is None:
            return
        if lifecycle.joining:
            try:
                await lifecycle.wait_joined()
            except asyncio.CancelledError:
                lifecycle.close_cancelled()
                raise
        if not lifecycle.joined:
            lifecycle.closed()
            return
        self.supervisor.stop.set()
        self._relist.set()
        try:
            await self._save_positions()
        finally:
            await run_to_the_end(self._shut_down())  # also when cancelled: never half closed
        log.info("[%s] left broadcast", self.client_id)

    async def _save_positions(self) -> None:
        if self._lister is not None:  # a listing in flight may still start shards
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._lister), 30)
        self.on_leaving()
        active = [
            lease for lease in self.leases.values() if lease.claim.status is LeaseStatus.ACTIVE
        ]
        timeout = self.config.handoff_timeout
        try:
            # Bounded: the final save retries while DynamoDB is unreachable.
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(self.checkpointer.handoff(lease, timeout) for lease in active),
                    return_exceptions=True,
                ),
                timeout + 2 * self.config.client_timeout + 5,
            )
            for result in results:
                if isinstance(result, (KinesumerError, TransientAWSError)):
                    log.warning("[%s] close could not save a position: %s", self.client_id, result)
                elif isinstance(result, BaseException):
                    raise result
        except asyncio.TimeoutError:
            log.warning("[%s] positions were not all saved at close", self.client_id)

    async def abort(self) -> None:
        """Stop like a killed process: nothing saved. (A test seam for crashes.)"""
        lifecycle = self.lifecycle
        if lifecycle.begin_close() is None:
            return
        if lifecycle.joining:
            await lifecycle.wait_joined()
        if not lifecycle.joined:
            lifecycle.closed()
            return
        self.supervisor.stop.set()
        await self.supervisor.cancel_all()
        await self.aws.close()
        lifecycle.closed()

    def _stop_reading(self, error: BaseException) -> None:
        for lease in self.leases.values():
            lease.progress.stop_fetching()
        self.on_failed(error)
