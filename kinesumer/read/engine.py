"""The engine: one asyncio implementation behind both the async and the sync faces.

A :class:`~.member.GroupMember` that reads its shards itself: a fetcher per claimed shard fills
one bounded buffer, and the delivery cursor hands the records out. Any background task that
fails with something other than a transient AWS error stops the engine, and the error is raised
to the application from its next ``consume()`` step, ``commit()`` or ``close()``.

An exactly-once sink (:mod:`kinesumer.sinks`) plugs in through two seams set before the start:
:attr:`Engine.claim_hook`, awaited for every claimed shard before its fetcher starts (it may say
where reading resumes), and :attr:`Engine.sink_writes_positions` (the sink's commits write the
checkpoint position; the checkpointer then writes only the finished flag and releases).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..config import Config
from ..errors import ConsumerClosedError
from ..group.hooks import RebalanceHooks
from ..group.leases import Claim
from ..group.member import GroupMember
from ..group.shard_sync import ShardStart
from ..kinesis.transport import KinesisTransport
from ..models import Position, Record
from ..runtime.aio_timeout import await_within
from ..statestore.base import GroupState
from .buffer import EngineFailed, RecordBuffer
from .delivery import Cursor
from .efo_fetcher import EfoShardFetcher, EndCheck
from .efo_session import EfoSession, EfoTransport, aws_transport, given_transport
from .fetcher import ShardFetcher
from .progress import ShardLease, ShardProgress

#: Awaited with a newly claimed lease before its shard is read: a position to resume after
#: (overriding the checkpoint's), or None to start where the checkpoint says.
ClaimHook = Callable[[ShardLease], Awaitable[Position | None]]


class Engine(GroupMember[ShardProgress]):
    def __init__(
        self,
        config: Config,
        hooks: RebalanceHooks | None = None,
        *,
        state: GroupState | None = None,
        kinesis: KinesisTransport | None = None,
    ) -> None:
        super().__init__(config, hooks, state=state, kinesis=kinesis)
        self.cursor = Cursor(config.auto_commit)
        self.buffer: RecordBuffer
        #: Set by an exactly-once sink before the start (see the module docstring). A hook that
        #: raises stops the engine, as any background task does.
        self.claim_hook: ClaimHook | None = None
        #: Set by a sink whose commits write the checkpoint position (DynamoDB transactions).
        self.sink_writes_positions = False
        #: Enhanced fan-out (Config.enhanced_fan_out): a stand-in transport for tests, set
        #: before the start; None builds the real one (kinesumer.kinesis.efo).
        self.efo_transport: EfoTransport | None = None
        self.efo: EfoSession | None = None
        self._in_hand_done = False
        self._discard = False

    # -- lifecycle ----------------------------------------------------------------------------
    def on_joining(self) -> None:
        config = self.config
        self.buffer = RecordBuffer(config.max_buffered_records, config.max_buffered_bytes)

    def on_parts_built(self) -> None:
        self.cursor.fence = self.heartbeat
        self.checkpointer.positions_by_sink = self.sink_writes_positions
        loop = asyncio.get_running_loop()
        checkpointer = self.checkpointer
        self.cursor.on_fenced = lambda lease: loop.call_soon_threadsafe(
            checkpointer.lose, lease, "the fence passed while delivering"
        )

    async def close(self, in_hand_done: bool = False, discard: bool = False) -> None:
        """Hand every shard off (checkpoint, release), leave the group, close the clients.

        ``in_hand_done``: the application is done with what it holds (it closes from the
        consuming thread in auto-commit mode): it counts as processed. ``discard``: what was
        delivered but not processed never will be (the application failed on it): checkpoint
        only what was processed and release at once instead of waiting ``handoff_timeout`` for
        it. The next owner delivers it again.
        """
        self._in_hand_done, self._discard = in_hand_done, discard
        await self.leave()

    def on_leaving(self) -> None:
        if self._discard:
            self.cursor.drop_in_hand()
            for lease in list(self.leases.values()):
                lease.progress.discard_delivered()
        elif self._in_hand_done:
            self.cursor.finish_in_hand()

    async def on_streams_checked(self, streams: tuple[str, ...]) -> None:
        if not self.config.enhanced_fan_out:
            return
        if self.efo is None:
            kinesis = self.kinesis_transport
            # Over AWS, the consumer calls go through the routing transport: a stream given by
            # ARN has its consumer registered (and subscribed to) in its own account and region.
            client = kinesis or self.routing or self.aws.kinesis
            transport = self.efo_transport or (
                aws_transport(self.config, client, self.requests, self.places)
                if kinesis is None
                else given_transport(kinesis, self.requests)
            )
            self.efo = EfoSession(self.config, client, transport)
            await self.efo.open()
        await self.efo.register(streams)

    async def on_closed(self) -> None:
        await self.buffer.fail(ConsumerClosedError("the consumer was closed"))
        if self.efo is not None:  # the consumer stays registered: see efo_session
            await self.efo.close()

    def on_failed(self, error: BaseException) -> None:
        self.supervisor.spawn(self.buffer.fail(error), "report failure")

    # -- reading ------------------------------------------------------------------------------
    def new_progress(self, claim: Claim) -> ShardProgress:
        return ShardProgress(claim)

    def on_claimed(self, lease: ShardLease, start: ShardStart) -> None:
        stream, shard_id = lease.key
        hook = self.claim_hook
        if hook is None:
            reading = self._fetcher(lease, start).run()
        else:
            reading = self._hooked(lease, start, hook)
        lease.progress.attach_fetcher(
            self.supervisor.spawn(reading, f"fetcher {stream}/{shard_id}")
        )

    async def _hooked(self, lease: ShardLease, start: ShardStart, hook: ClaimHook) -> None:
        """The claim hook, then the fetcher: one task, so a handoff or a loss during the hook
        cancels it like a fetcher, and a hook that raises stops the engine."""
        position = await hook(lease)
        if position is not None:  # the sink's record of what it holds is the truth
            lease.progress.resume_after(position)
            lease.claim.mark_checkpointed(position)
        await self._fetcher(lease, start).run()

    def _fetcher(self, lease: ShardLease, start: ShardStart) -> ShardFetcher | EfoShardFetcher:
        if self.efo is not None:
            return EfoShardFetcher(
                lease,
                self.efo.subscriber,
                self.efo.consumer_arn,
                self.buffer,
                self.config,
                start.initial,
                self.shard_sync.parents_check(lease.key, start),
                self._on_shard_end,
                self.client_id,
                self.metrics,
                EndCheck(self.reader, lease.key[0], self._closed_in(lease.key[0])),
                self.reader,
                self.checkpointer.record_start,
                self.efo.forget,
                self.requests,
            )
        return ShardFetcher(
            lease,
            self.reader,
            self.buffer,
            self.config,
            start.initial,
            self.shard_sync.parents_check(lease.key, start),
            self._on_shard_end,
            self.client_id,
            self.metrics,
            self.checkpointer.record_start,
        )

    def _closed_in(self, stream: str) -> Callable[[str], bool]:
        """Whether the group's shard cache lists a shard of ``stream`` as closed (EFO's SHARD_END
        fallback; the cache follows a reshard within shard_sync_interval)."""

        def closed(shard_id: str) -> bool:
            cache = self.shard_sync.caches.get(stream)
            shard = cache.by_id().get(shard_id) if cache is not None else None
            return shard is not None and shard.closed

        return closed

    def _on_shard_end(self, lease: ShardLease) -> None:
        self.supervisor.spawn(self.finish_shard(lease), "finish")

    def buffered(self) -> tuple[int, int]:
        buffer: RecordBuffer | None = getattr(self, "buffer", None)
        return buffer.size if buffer is not None else (0, 0)

    # -- delivery -----------------------------------------------------------------------------
    async def next_batch(self) -> tuple[ShardLease, list[Record]]:
        try:
            lease, records, nbytes = await self.buffer.get()
        except EngineFailed as wrapped:
            raise wrapped.__cause__ from None  # type: ignore[misc]
        if lease.claim.deliverable:  # leftovers of a dropped lease are discarded by the cursor
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
                lease, records = await await_within(self.next_batch(), remaining)
            except (asyncio.TimeoutError, ConsumerClosedError):
                return out
            cursor.set_batch(lease, records)

    async def commit(self) -> None:
        """Everything delivered so far is processed: write the checkpoints now."""
        self.lifecycle.check()
        for lease in list(self.leases.values()):
            lease.progress.commit_delivered()
        self.cursor.finish_in_hand()
        await self.checkpointer.flush(list(self.leases.values()))
        self.lifecycle.check()
