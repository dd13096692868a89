"""The engine: one asyncio implementation behind both the async and the sync API.

It owns the AWS clients, the shared lease table and buffer, and the background tasks
(coordinator, fetchers, checkpoint flusher, handoffs). Any background task that fails with
something other than a transient AWS error stops the engine, and the error is raised to the
application from its next ``consume()`` step, ``commit()`` or ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from ..aws import AwsClients, RetryStats
from ..config import Config, InitialPosition
from ..core import has_known_parent, parents_pending
from ..errors import ConsumerClosedError, KinesumerError, TransientAWSError
from ..kinesis.reader import KinesisReader
from ..metrics import metrics_for
from ..models import Position, Record, Shard
from ..statestore.base import ShardCache
from ..statestore.dynamodb.store import DynamoDBStateStore
from ..stats import ConsumerStats as ConsumerStats
from ..stats import ShardStatus as ShardStatus
from .checkpointer import Checkpointer
from .coordinator import Coordinator
from .fetcher import run_fetcher
from .heartbeat import Heartbeat
from .hooks import RebalanceHooks
from .leases import EngineFailed, Lease, LeaseStatus, RecordBuffer

log = logging.getLogger("kinesumer")


def default_client_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.\-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class _NoFence:
    """Before the engine starts there is nothing to deliver; no deadline applies."""

    deadline = float("inf")


class Cursor:
    """The delivery side: hands records out one at a time and moves the lease marks.

    Runs on whatever thread consumes (the sync generator's, or the event loop for the async
    iterator). In auto-commit mode the record in the application's hands becomes processed when
    the application asks for the next one.
    """

    def __init__(self, auto_commit: bool) -> None:
        self._auto = auto_commit
        self.fence: Any = _NoFence
        # Called (from whatever thread delivers) with a lease the fence made us drop records of.
        self.on_fenced: Callable[[Lease], object] = lambda lease: None
        self._records: list[Record] = []
        self._index = 0
        self._lease: Lease | None = None
        self._in_hand: tuple[Lease, Position] | None = None
        self._polled: dict[Lease, Position] = {}

    def finish_in_hand(self) -> None:
        """Auto-commit mode: what the application holds is processed once it asks for more."""
        if self._auto:
            if self._in_hand is not None:
                lease, position = self._in_hand
                lease.processed = position
            for lease, position in self._polled.items():
                lease.processed = position
        self._in_hand = None
        if self._polled:
            self._polled = {}

    def drop_in_hand(self) -> None:
        """Forget what the application holds without counting it as processed."""
        self._in_hand = None
        self._polled = {}

    def next_local(self) -> Record | None:
        """The next deliverable record of the current batch, or None when a new batch is needed."""
        self.finish_in_hand()
        lease = self._lease
        if lease is None:
            return None
        records = self._records
        fence = self.fence
        while self._index < len(records):
            record = records[self._index]
            self._index += 1
            # Past the fence the others may already be reading this shard: deliver nothing more.
            if time.monotonic() >= fence.deadline:
                self._fenced(lease)
                break
            if lease.try_deliver(record):
                self._in_hand = (lease, lease.delivered)  # type: ignore[assignment]
                return record
            break  # revoked or lost: the next owner reads the rest from the checkpoint
        self._lease = None
        return None

    def take(self, limit: int, out: list[Record]) -> None:
        """Deliver records of the current batch into ``out`` until it holds ``limit``."""
        lease = self._lease
        if lease is None:
            return
        records = self._records
        fence = self.fence
        while self._index < len(records) and len(out) < limit:
            record = records[self._index]
            self._index += 1
            if time.monotonic() >= fence.deadline:
                self._fenced(lease)
                self._lease = None
                return
            if lease.try_deliver(record):
                out.append(record)
                self._polled[lease] = lease.delivered  # type: ignore[assignment]
            else:
                self._lease = None
                return
        if self._index >= len(records):
            self._lease = None

    def _fenced(self, lease: Lease) -> None:
        """Records of ``lease`` are being dropped undelivered: the lease must end *now*. Left
        active, a heartbeat landing late would let it go on after the dropped records (its
        fetcher has read past them) and a later checkpoint would skip them: lost. Lost instead,
        the shard is claimed again and read from its checkpoint."""
        lease.stop_delivering(LeaseStatus.LOST)
        self.on_fenced(lease)

    def set_batch(self, lease: Lease, records: list[Record]) -> None:
        self._lease, self._records, self._index = lease, records, 0


class Engine:
    def __init__(self, config: Config, hooks: RebalanceHooks | None = None) -> None:
        self.config = config
        self.hooks = hooks or RebalanceHooks()
        self.client_id = config.client_id or default_client_id()
        # Built first: a missing extra or a busy metrics port is a named error now, not later.
        self.metrics = metrics_for(config, self.client_id)
        self.stats = RetryStats(self.metrics)
        self.leases: dict[tuple[str, str], Lease] = {}
        self.cursor = Cursor(config.auto_commit)
        self.failure: BaseException | None = None
        self.started = False
        self.closed = False
        # Set while start() runs: close() waits for it, or a start finishing after the close
        # would claim shards and leave the caller waiting for records that never come.
        self._starting: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._aws = AwsClients(config, self.stats)
        self.buffer: RecordBuffer
        self._stop: asyncio.Event
        self._coordinator: Coordinator
        self._checkpointer: Checkpointer
        self._reader: KinesisReader
        self._store: DynamoDBStateStore
        self._heartbeat: Heartbeat
        self._coordinator_task: asyncio.Task[Any]

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self, streams: tuple[str, ...]) -> None:
        """Connect, check the table and streams (named errors, now), join the group and claim
        this client's first shards before returning."""
        if self.closed:
            raise ConsumerClosedError("this consumer was closed; create a new one")
        if self._starting is not None:
            await self._starting.wait()
            self._raise_if_failed()
        if self.started:
            if streams != self._coordinator.streams:
                await self.refresh(streams)
            return
        self._starting = asyncio.Event()
        try:
            await self._start(streams)
        finally:
            self._starting.set()
            self._starting = None

    async def _start(self, streams: tuple[str, ...]) -> None:
        config = self.config
        self.buffer = RecordBuffer(config.max_buffered_records, config.max_buffered_bytes)
        self._stop = asyncio.Event()
        await self._aws.open()
        try:
            self._store = DynamoDBStateStore(
                self._aws.dynamodb, config.dynamodb_table, config.app, self.stats
            )
            self._reader = KinesisReader(
                self._aws.kinesis, self.stats, config.effective_kinesis_region
            )
            await self._store.check()
            for stream in streams:
                await self._reader.check_stream(stream)
            self._checkpointer = Checkpointer(
                self._store, self.client_id, self.hooks, self._on_lost, self.metrics
            )
            self._heartbeat = Heartbeat(
                config,
                self.client_id,
                lambda: self._coordinator.streams,
                self._owned_lag,
                self.stats,
            )
            self.cursor.fence = self._heartbeat
            loop = asyncio.get_running_loop()
            self.cursor.on_fenced = lambda lease: loop.call_soon_threadsafe(
                self._checkpointer.lose, lease, "the fence passed while delivering"
            )
            self._coordinator = Coordinator(
                config,
                self.client_id,
                self._store,
                self._reader,
                self._checkpointer,
                self.leases,
                self._start_fetcher,
                self._heartbeat,
                self._fail,
                self.hooks,
                self.metrics,
            )
            self._coordinator.streams = streams
            await self._coordinator.heartbeat()
            await self._coordinator.tick()
        except BaseException:
            await self._aws.close()
            raise
        self.started = True
        log.info("[%s] joined app %r on %s", self.client_id, config.app, ", ".join(streams))
        self._heartbeat.start()
        self._coordinator_task = self._spawn(self._coordinator.run(self._stop), "coordinator")
        self._spawn(self._flush_periodically(), "checkpoint-flusher")
        self._spawn(self._watchdog(), "lease-watchdog")

    async def refresh(self, streams: tuple[str, ...]) -> None:
        """Consume ``streams`` from now on; shards of dropped streams are handed off."""
        self._raise_if_failed()
        for stream in set(streams) - set(self._coordinator.streams):
            await self._reader.check_stream(stream)
        self._coordinator.streams = streams
        await self._coordinator.heartbeat()  # announce the new streams before rebalancing
        await self._coordinator.tick()

    async def close(self, in_hand_done: bool, discard: bool = False) -> None:
        """Hand every shard off (checkpoint, release), leave the group, close the clients.

        ``discard``: what was delivered but not processed never will be (the application failed
        on it): checkpoint only what was processed and release at once instead of waiting
        ``handoff_timeout`` for it. The next owner delivers it again.
        """
        if self.closed:
            return
        self.closed = True
        if self._starting is not None:
            try:
                await self._starting.wait()
            except asyncio.CancelledError:
                # Not closed after all: a later close() must still hand off what the join claims.
                self.closed = False
                raise
        if not self.started:
            return
        self._stop.set()
        # A tick in flight may still claim shards: let it finish before handing everything off,
        # or a shard claimed after the handoffs would stay owned by a member that has left.
        try:
            await asyncio.wait_for(asyncio.shield(self._coordinator_task), 30)
        except (asyncio.TimeoutError, Exception) as exc:  # reported by its done callback
            log.debug("[%s] coordinator stopped with %r", self.client_id, exc)
        if discard:
            self.cursor.drop_in_hand()
            for lease in list(self.leases.values()):
                with lease.lock:
                    lease.delivered = lease.processed
        elif in_hand_done:
            self.cursor.finish_in_hand()
        for lease in list(self.leases.values()):
            if lease.status is LeaseStatus.ACTIVE:
                self._coordinator.hand_off(lease, self.config.handoff_timeout)
        try:
            # Bounded: a handoff retries its final write while DynamoDB is unreachable.
            limit = self.config.handoff_timeout + 2 * self.config.client_timeout + 5
            try:
                await asyncio.wait_for(self._coordinator.wait_handoffs(), limit)
            except asyncio.TimeoutError:
                log.warning("[%s] handoffs did not finish in %.0fs", self.client_id, limit)
            # No heartbeat may land after the deregistration (it would bring the item back).
            await asyncio.get_running_loop().run_in_executor(None, self._heartbeat.stop)
            if self.failure is None:
                await self._store.deregister(self.client_id)
        except (KinesumerError, TransientAWSError) as exc:
            log.warning("[%s] close could not finish cleanly: %s", self.client_id, exc)
        finally:
            await self.buffer.fail(ConsumerClosedError("the consumer was closed"))
            tasks = [t for t in self._tasks if not t.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._aws.close()
            self.metrics.close()
        log.info("[%s] left app %r", self.client_id, self.config.app)

    # -- delivery -----------------------------------------------------------------------------
    async def next_batch(self) -> tuple[Lease, list[Record]]:
        try:
            lease, records, nbytes = await self.buffer.get()
        except EngineFailed as wrapped:
            raise wrapped.__cause__ from None  # type: ignore[misc]
        if lease.deliverable:  # leftovers of a dropped lease are discarded by the cursor
            self.metrics.delivered(*lease.key, len(records), nbytes)
        return lease, records

    async def poll(self, max_records: int, timeout: float) -> list[Record]:
        """Up to ``max_records`` records, waiting at most ``timeout`` seconds for the first ones.

        In auto-commit mode the records of one poll count as processed at the next poll."""
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        cursor = self.cursor
        cursor.finish_in_hand()
        out: list[Record] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            cursor.take(max_records, out)
            remaining = deadline - loop.time()
            if len(out) >= max_records or remaining <= 0:
                return out
            try:
                lease, records = await asyncio.wait_for(self.next_batch(), remaining)
            except (asyncio.TimeoutError, ConsumerClosedError):
                return out
            cursor.set_batch(lease, records)

    async def commit(self) -> None:
        """Everything delivered so far is processed: write the checkpoints now."""
        self._raise_if_failed()
        for lease in list(self.leases.values()):
            with lease.lock:
                if lease.delivered is not None:
                    lease.processed = lease.delivered
        self.cursor.finish_in_hand()
        await self._checkpointer.flush(list(self.leases.values()))
        self._raise_if_failed()

    def snapshot(self) -> ConsumerStats:
        """Safe from any thread (the sync API calls it from the application's): the containers
        the engine mutates are copied first, each in one C-level step that holds the GIL, then
        read from the copies."""
        leases = sorted(self.leases.items())
        retries = dict(self.stats.retries)
        shards = tuple(
            ShardStatus(
                stream,
                shard_id,
                lease.status.value,
                lease.checkpointed.sequence_number if lease.checkpointed else None,
                lease.millis_behind,
                lease.caught_up,
                ended=lease.reached_end,
                finished=lease.finished,
            )
            for (stream, shard_id), lease in leases
        )
        coordinator = getattr(self, "_coordinator", None)
        checkpointer = getattr(self, "_checkpointer", None)
        buffer = getattr(self, "buffer", None)
        buffered_records, buffered_bytes = buffer.size if buffer is not None else (0, 0)
        return ConsumerStats(
            client_id=self.client_id,
            leader=bool(coordinator and coordinator.leader),
            live_members=tuple(coordinator.live_ids) if coordinator else (),
            shards=shards,
            checkpoint_writes=checkpointer.writes if checkpointer else 0,
            checkpoint_conflicts=checkpointer.conflicts if checkpointer else 0,
            rebalances=coordinator.rebalances if coordinator else 0,
            retries={f"{op}:{code}": n for (op, code), n in retries.items()},
            last_error=repr(self.stats.last_error) if self.stats.last_error else None,
            **self.stats.counts(),
            state=self.state,
            claims_pending=bool(coordinator and coordinator.has_pending),
            coordinator_ticks=coordinator.ticks if coordinator else 0,
            buffered_records=buffered_records,
            buffered_bytes=buffered_bytes,
        )

    @property
    def state(self) -> str:
        if self.failure is not None:
            return "failed"
        if self.closed:
            return "closed" if not self._tasks else "closing"
        if self._starting is not None:
            return "joining"
        return "running" if self.started else "new"

    # -- background work ----------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                self._fail(exc, name)

        task.add_done_callback(done)
        return task

    def _fail(self, exc: BaseException, where: str) -> None:
        if self.failure is not None or self.closed:
            log.warning("[%s] %s failed after the engine stopped: %r", self.client_id, where, exc)
            return
        self.failure = exc
        log.error("[%s] %s failed, stopping: %r", self.client_id, where, exc, exc_info=exc)
        self._stop.set()
        self._heartbeat.halt()
        for lease in self.leases.values():
            if lease.fetcher is not None:
                lease.fetcher.cancel()
        self._spawn(self.buffer.fail(exc), "report failure")

    def _raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise ConsumerClosedError("this consumer was closed; create a new one")

    async def _watchdog(self) -> None:
        """Fence our leases when heartbeats stop landing, even while a DynamoDB call hangs."""
        step = min(0.1, self.config.heartbeat_interval / 4)
        while not self._stop.is_set():
            self._coordinator.fence_if_expired()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), step)

    async def _flush_periodically(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.config.commit_interval)
            if self._stop.is_set():
                return
            try:
                await self._checkpointer.flush(list(self.leases.values()))
            except TransientAWSError as exc:
                log.warning("[%s] checkpoint flush failed, will retry: %s", self.client_id, exc)

    def _start_fetcher(self, lease: Lease, shard: Shard, cache: ShardCache) -> None:
        stream = cache.stream
        listed = cache.by_id()
        initial: InitialPosition = (
            "TRIM_HORIZON" if has_known_parent(shard, listed) else self.config.initial_position
        )
        pending = parents_pending(shard, listed, cache.finished)

        async def parents_finished() -> bool:
            if not pending:
                return True
            try:
                checkpoints = await self._store.get_checkpoints(stream, pending)
            except TransientAWSError as exc:
                log.warning("[%s] checking parents of %s: %s", self.client_id, shard.shard_id, exc)
                return False
            return all(p in checkpoints and checkpoints[p].finished for p in pending)

        lease.fetcher = self._spawn(
            run_fetcher(
                lease,
                self._reader,
                self.buffer,
                self.config,
                initial,
                parents_finished,
                self._on_shard_end,
                self.client_id,
                self.metrics,
            ),
            f"fetcher {stream}/{shard.shard_id}",
        )

    def _on_lost(self, lease: Lease) -> None:
        self.metrics.shard_dropped(*lease.key)
        self._coordinator.reclaim(lease.key)
        self._spawn(self.hooks.revoked([lease.key]), "on_revoked hook")

    def lag(self) -> dict[tuple[str, str], int | None]:
        """MillisBehindLatest of every shard this member reads (None until its first read)."""
        return {
            key: lease.millis_behind
            for key, lease in sorted(self.leases.items())
            if lease.status is LeaseStatus.ACTIVE
        }

    def _owned_lag(self) -> dict[str, int]:
        """``stream/shard`` -> MillisBehindLatest (-1 when unknown) of every active lease, for the
        client item (``kinesumer status`` shows it for every member)."""
        return {
            f"{stream}/{shard_id}": -1 if lease.millis_behind is None else lease.millis_behind
            for (stream, shard_id), lease in list(self.leases.items())
            if lease.status is LeaseStatus.ACTIVE
        }

    def _on_shard_end(self, lease: Lease) -> None:
        self._spawn(self._checkpointer.finish(lease, self._on_finished), "finish")

    def _on_finished(self, lease: Lease) -> None:
        if self.leases.get(lease.key) is lease:
            del self.leases[lease.key]
        self.metrics.shard_dropped(*lease.key)
        self._coordinator.request_sync(lease.key[0])
