"""A group member: what every member has, whoever reads its shards.

Wires the parts (AWS clients, the state store, the heartbeat thread, membership, shard sync,
leasing, the coordinator's tick, the checkpointer, the watchdog, the supervisor) around one
shared lease table, and runs the member's lifecycle: join, change streams, leave (hand every
shard off, deregister). What reads the records is not here: the :class:`~.engine.Engine` adds
fetchers, a buffer and the delivery cursor; an :class:`~.external.ExternalReadMember` lets
something else (Spark executors) read them.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Generic

from ..accounts import check_one_name_each, home_text, state_key
from ..aws import AwsClients, ClientFactory, RequestStats
from ..config import Config, default_client_id
from ..errors import (
    AccessDeniedError,
    ConfigError,
    ConsumerClosedError,
    KinesumerError,
    StreamNotFoundError,
    TransientAWSError,
)
from ..kinesis.places import AccountPlaces, home_of
from ..kinesis.reader import KinesisReader
from ..kinesis.routing import routing_over
from ..kinesis.transport import KinesisTransport
from ..kinesis.transport_clients import RoutedClientFactory, TransportClientFactory
from ..observability.metrics import metrics_for
from ..observability.telemetry import Tracing
from ..runtime.lifecycle import EngineState, Lifecycle, run_to_the_end
from ..runtime.supervisor import Supervisor
from ..statestore.base import GroupState, StateStore
from ..statestore.dynamodb.store import DynamoDBStateStore
from ..stats import ConsumerStats, ShardStatus
from .checkpointer import Checkpointer
from .checkpoints_kept import check_checkpoints_kept
from .controls import GroupControls, metered
from .coordinator import Coordinator
from .heartbeat import Heartbeat
from .hooks import RebalanceHooks
from .leases import Claim, Lease, LeaseStatus, ProgressT, ReadProgress
from .leasing import Leasing, reset_command
from .membership import Membership
from .shard_sync import ShardStart, ShardSync

log = logging.getLogger("kinesumer")


async def check_written_streams(reader: KinesisReader, streams: tuple[str, ...]) -> None:
    """The streams a failure policy writes failed records to exist: a missing dead-letter
    stream is a :class:`~kinesumer.errors.ConfigError` of ``run()`` at the join, not a write
    that fails when the first record fails, long after. A principal that may write to the
    stream but not describe it (a policy of an earlier release grants PutRecord alone) is not
    refused: the check is skipped, as the write will tell."""
    for stream in streams:
        try:
            await reader.check_stream(stream)
        except AccessDeniedError as exc:
            log.info("not checking dead-letter stream %r at the start: %s", stream, exc)
        except StreamNotFoundError as exc:
            raise ConfigError(
                "on_failure",
                f"failed records are written to stream {stream!r}, which does not exist "
                f"({exc}): create it before run(), or name another",
                "run",
            ) from exc


class GroupMember(Generic[ProgressT]):
    """Subclasses say how claimed shards are read: :meth:`new_progress` (the read progress
    each claim carries), :meth:`on_claimed`, :meth:`on_failed`, :meth:`on_leaving`,
    :meth:`on_closed`, :meth:`buffered`."""

    def __init__(
        self,
        config: Config,
        hooks: RebalanceHooks | None = None,
        *,
        state: GroupState | None = None,
        kinesis: KinesisTransport | None = None,
    ) -> None:
        self.config = config
        #: The Kinesis transport when one was given (``Kinesumer(config, kinesis=...)``); None:
        #: AWS's (or ``config.kinesis_endpoint``'s), through an aiobotocore client the join opens.
        self.kinesis_transport = kinesis
        #: The loop the member runs on, set by the join (blocking writers submit to it).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The state table when one was given (``Kinesumer(config, state=...)``); None: the
        #: DynamoDB table of ``config``, opened by the join.
        self.state_table = state
        self.hooks = hooks or RebalanceHooks()
        self.client_id = config.client_id or default_client_id()
        # Built first: a missing extra or a busy metrics port is a named error now, not later.
        self.metrics = metered(config, metrics_for(config, self.client_id))
        self.requests = RequestStats(self.metrics)
        #: The shared state: this member's leases by (stream, shard id).
        self.leases: dict[tuple[str, str], Lease[ProgressT]] = {}
        self.lifecycle = Lifecycle()
        self.aws = AwsClients(config, self.requests, self.client_id)
        #: The config's own Kinesis account and region (:mod:`kinesumer.accounts`): a stream
        #: ARN of these is kept in the state table under its plain name.
        self.home = home_of(config)
        #: Who reads each account and region's streams (None with a Kinesis given).
        self.places: AccountPlaces | None = None
        #: The transport over AWS the join built (None before it, and with a Kinesis given).
        self.routing: KinesisTransport | None = None
        # Built by the join:
        self.store: StateStore
        self.reader: KinesisReader
        self.checkpointer: Checkpointer
        self.heartbeat: Heartbeat
        self.coordinator: Coordinator
        self.leasing: Leasing[ProgressT]
        self.shard_sync: ShardSync
        self.supervisor: Supervisor
        self._coordinator_task: asyncio.Task[None]

    # -- for subclasses -----------------------------------------------------------------------
    def on_joining(self) -> None:
        """A join starts (nothing is built yet): prepare what reading needs."""

    def on_parts_built(self) -> None:
        """The parts (store, reader, checkpointer, heartbeat, coordinator) exist, on the loop;
        nothing was claimed yet."""

    async def on_streams_checked(self, streams: tuple[str, ...]) -> None:
        """``streams`` exist and will be read (at the join, or added by a refresh); nothing of
        them was claimed yet: prepare what reading them needs (enhanced fan-out registers)."""

    def new_progress(self, claim: Claim) -> ProgressT:
        """The read progress of ``claim``, just made (created with it, on the loop)."""
        raise NotImplementedError(f"{type(self).__name__} must say how its claims are read")

    def on_claimed(self, lease: Lease[ProgressT], start: ShardStart) -> None:
        """A shard was claimed (and the application told): start reading it."""

    def on_failed(self, error: BaseException) -> None:
        """The engine failed with ``error`` (the supervisor stopped everything else already)."""

    async def on_closed(self) -> None:
        """Closed: wake whoever waits for records (they end)."""

    def on_leaving(self) -> None:
        """Closing: claims are over, the handoffs start next."""

    def buffered(self) -> tuple[int, int]:
        """Records and bytes fetched and not delivered yet."""
        return (0, 0)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self.lifecycle.state

    @property
    def started(self) -> bool:
        """Whether a join succeeded (still True once closing, closed or failed)."""
        return self.lifecycle.joined

    @property
    def failure(self) -> BaseException | None:
        return self.lifecycle.failure

    async def start(self, streams: tuple[str, ...], writes_to: tuple[str, ...] = ()) -> None:
        """Connect, check the table and streams (named errors, now), join the group and claim
        this client's first shards before returning. Joined already: change the streams.
        ``writes_to``: streams a handler's failure policy writes to (dead letters), checked
        at the join like the streams read (:func:`check_written_streams`)."""
        lifecycle = self.lifecycle
        if lifecycle.closing_or_closed:
            raise ConsumerClosedError(EngineState.CLOSED.message)
        if lifecycle.joining:
            await lifecycle.wait_joined()
            lifecycle.check()
        if lifecycle.joined:
            if streams != self.coordinator.streams:
                await self.refresh(streams)
            return
        lifecycle.begin_join()
        ok = False
        try:
            await self._join(streams, writes_to)
            ok = True
        finally:
            lifecycle.end_join(ok)

    async def _join(self, streams: tuple[str, ...], writes_to: tuple[str, ...] = ()) -> None:
        config = self.config
        self.supervisor = Supervisor(self.client_id, self.lifecycle)
        self.supervisor.on_failure.append(self._stop_everything)
        self.on_joining()
        self.loop = asyncio.get_running_loop()
        await self.open_clients()
        try:
            self._build_parts()
            self.on_parts_built()
            await self.store.check()
            await self.know_home(streams)
            check_one_name_each(streams, self.home, "join")
            await check_checkpoints_kept(self.store, streams, streams, self.home, "join")
            for stream in streams:
                await self.reader.check_stream(stream)
            await check_written_streams(self.reader, writes_to)
            await self.on_streams_checked(streams)
            self.coordinator.streams = streams
            await self.coordinator.membership.announce()
            await self.coordinator.tick()
        except BaseException:
            await self.aws.close()
            raise
        log.info("[%s] joined app %r on %s", self.client_id, config.app, ", ".join(streams))
        self.heartbeat.start()
        supervisor = self.supervisor
        self._coordinator_task = supervisor.spawn(
            self.coordinator.run(supervisor.stop), "coordinator"
        )
        supervisor.spawn(
            self.checkpointer.flush_periodically(
                self.leases, config.commit_interval, supervisor.stop
            ),
            "checkpoint-flusher",
        )
        membership = self.coordinator.membership
        step = min(0.1, config.heartbeat_interval / 4)
        supervisor.spawn(supervisor.watch(membership.fence_if_expired, step), "lease-watchdog")

    def _build_parts(self) -> None:
        config, client_id, metrics = self.config, self.client_id, self.metrics
        self.store = self.state_store()
        self.reader = self.kinesis_reader()
        tracing = Tracing.for_config(config)  # checkpoint spans (kinesumer.observability.telemetry)
        self.checkpointer = Checkpointer(
            self.store, client_id, self.hooks, self._on_lost, metrics, tracing
        )
        streams, lag = self.announced_streams, self.owned_lag
        stalls = self.efo_stall_counts  # the client item's EFO stall report
        given = self.state_table
        write = given.for_app(config.app).write_client_blocking if given is not None else None
        self.heartbeat = Heartbeat(
            config,
            client_id,
            streams,
            lag,
            self.requests,
            stalls,
            write,
            partial(home_text, self.home),
        )
        membership = Membership(
            client_id,
            config.client_timeout,
            self.store,
            self.heartbeat,
            self.checkpointer,
            self.leases,
        )
        self.shard_sync = ShardSync(client_id, config.initial_position, self.store, self.reader)
        self.leasing = Leasing(
            client_id,
            config.handoff_timeout,
            self.store,
            self.checkpointer,
            self.leases,
            membership,
            self.shard_sync,
            self.new_progress,
            self.on_claimed,
            self.supervisor.fail,
            self.hooks,
            metrics,
            reset_command=reset_command(
                config.app,
                config.dynamodb_table,
                config.effective_dynamodb_region,
                config.dynamodb_endpoint,
            ),
        )
        self.leasing.on_hook_failed = self._leave_quietly
        self.coordinator = Coordinator(
            config, client_id, self.leases, membership, self.shard_sync, self.leasing, metrics
        )
        self.coordinator.stream_key = partial(state_key, home=self.home)
        if self.state_table is None:  # operator controls are items of the DynamoDB table
            self.coordinator.controls = GroupControls.for_member(
                self.aws.dynamodb, config, client_id, self.requests, metrics
            )
        elif config.assignment == "weighted":
            # The load reports and weights are items of the DynamoDB table, as the controls
            # are: a given state store has neither, so the group splits shards by count.
            log.warning(
                "assignment='weighted' needs the DynamoDB state table (its load and weights "
                "items): with the state store given (%s) this member assigns by range",
                type(self.state_table).__name__,
            )

    async def open_clients(self) -> None:
        """Open the AWS clients this member needs: none for a state table or a Kinesis given."""
        await self.aws.open(
            dynamodb=self.state_table is None, kinesis=self.kinesis_transport is None
        )

    def kinesis_reader(self) -> KinesisReader:
        """The reader over the Kinesis given, or over AWS's: the join's aiobotocore Kinesis
        client, and DynamoDB Streams' for the streams given by a table's stream ARN
        (:class:`~kinesumer.kinesis.routing.RoutingTransport`; its clients open at first use)."""
        if self.kinesis_transport is not None:
            kinesis: KinesisTransport = self.kinesis_transport
        else:
            self.places = AccountPlaces(self.config, self.aws, self.home)
            kinesis = self.routing = routing_over(self.aws, self.places)
        return KinesisReader(kinesis, self.requests, self.config.effective_kinesis_region)

    def client_factory(self) -> ClientFactory:
        """The clients handlers write through (dead letters, retries): over the Kinesis given,
        or AWS's for ``config``."""
        if self.kinesis_transport is None:
            return RoutedClientFactory(
                self.config,
                self.routing_transport,
                self.running_loop,
                self.requests,
                self.client_id,
            )
        return TransportClientFactory(
            self.config, self.kinesis_transport, self.running_loop, self.requests, self.client_id
        )

    def routing_transport(self) -> KinesisTransport:
        """The transport over AWS the join built (ConsumerClosedError before the join)."""
        if self.routing is None:
            raise ConsumerClosedError("the consumer has not joined: nothing to write with")
        return self.routing

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this member runs on (ConsumerClosedError before its join)."""
        if self.loop is None:
            raise ConsumerClosedError("the consumer has not started: nothing can be written yet")
        return self.loop

    def state_store(self) -> GroupState | DynamoDBStateStore:
        """The state table as this member's app sees it: the one given, or DynamoDB's."""
        config = self.config
        if self.state_table is not None:
            return self.state_table.for_app(config.app)
        return DynamoDBStateStore(
            self.aws.dynamodb,
            config.dynamodb_table,
            config.app,
            self.requests,
            keys=partial(state_key, home=self.home),
        )

    def announced_streams(self) -> tuple[str, ...]:
        """The streams the client item says this member reads: as the application named them,
        plus the state-table name of each that is kept under another (a home ARN's plain
        name), so that members naming the stream by name (older ones in a rolling upgrade
        among them) count this one as reading it, and share its shards."""
        streams = self.coordinator.streams
        keys = {state_key(s, self.home) for s in streams if s.startswith("arn:")}
        return tuple(sorted(keys | set(streams))) if keys - set(streams) else streams

    async def know_home(self, streams: tuple[str, ...]) -> None:
        """Before the first Kinesis stream ARN is read, learn the home account (the state
        keys of ARNs depend on it): ``role_arn``'s, else STS GetCallerIdentity's, once. For
        subclasses' joins too (broadcast)."""
        if self.places is not None and any(
            s.startswith("arn:") and ":kinesis:" in s for s in streams
        ):
            await self.places.resolve_home()

    async def refresh(self, streams: tuple[str, ...]) -> None:
        """Read ``streams`` from now on; shards of dropped streams are handed off."""
        self.lifecycle.check()
        added = sorted(set(streams) - set(self.coordinator.streams))
        await self.know_home(tuple(added))
        check_one_name_each(streams, self.home, "refresh")
        await check_checkpoints_kept(self.store, added, streams, self.home, "refresh")
        for stream in added:
            await self.reader.check_stream(stream)
        await self.on_streams_checked(tuple(added))
        self.coordinator.streams = streams
        await self.coordinator.membership.announce()  # the new streams, before rebalancing
        await self.coordinator.tick()

    async def leave(self) -> None:
        """Hand every shard off (checkpoint, release), leave the group, close the clients."""
        lifecycle = self.lifecycle
        if lifecycle.begin_close() is None:
            return
        if lifecycle.joining:
            try:
                await lifecycle.wait_joined()
            except asyncio.CancelledError:
                # Not closed after all: a later close() must still hand off what the join claims.
                lifecycle.close_cancelled()
                raise
        if not lifecycle.joined:
            lifecycle.closed()
            return
        self.supervisor.stop.set()
        try:
            await self._hand_off_and_deregister()
        finally:
            # Also when the close is cancelled: the member ends, never half closed (heartbeating
            # with its shards unread); the others take them over after client_timeout.
            self.heartbeat.halt()
            await run_to_the_end(self._shut_down())
        log.info("[%s] left app %r", self.client_id, self.config.app)

    async def _hand_off_and_deregister(self) -> None:
        # A tick in flight may still claim shards: let it finish before handing everything off,
        # or a shard claimed after the handoffs would stay owned by a member that has left.
        try:
            await asyncio.wait_for(asyncio.shield(self._coordinator_task), 30)
        except (asyncio.TimeoutError, Exception) as exc:  # reported by its done callback
            log.debug("[%s] coordinator stopped with %r", self.client_id, exc)
        self.on_leaving()
        for lease in list(self.leases.values()):
            if lease.claim.status is LeaseStatus.ACTIVE:
                self.leasing.hand_off(lease)
        try:
            # Bounded: a handoff retries its final write while DynamoDB is unreachable.
            limit = self.config.handoff_timeout + 2 * self.config.client_timeout + 5
            try:
                await asyncio.wait_for(self.leasing.wait_handoffs(), limit)
            except asyncio.TimeoutError:
                log.warning("[%s] handoffs did not finish in %.0fs", self.client_id, limit)
            # No heartbeat may land after the deregistration (it would bring the item back).
            await asyncio.get_running_loop().run_in_executor(None, self.heartbeat.stop)
            if self.lifecycle.failure is None:
                await self.store.deregister(self.client_id)
        except (KinesumerError, TransientAWSError) as exc:
            log.warning("[%s] close could not finish cleanly: %s", self.client_id, exc)

    async def _leave_quietly(self) -> None:
        """The on_assigned hook failed (the member is FAILED, the shards it had just claimed
        given back): remove its item, so the others rebalance now rather than once it is
        ``client_timeout`` old (best effort). No heartbeat may land after the deletion."""
        await asyncio.get_running_loop().run_in_executor(None, self.heartbeat.stop)
        try:
            await self.store.deregister(self.client_id)
        except (KinesumerError, TransientAWSError) as exc:
            log.warning("[%s] could not leave the group: %s", self.client_id, exc)

    async def _shut_down(self) -> None:
        await self.on_closed()
        await self.supervisor.cancel_all()
        await self.aws.close()
        self.metrics.close()
        self.lifecycle.closed()

    def mark_closed(self) -> None:
        """Close a member that never joined and never will (the sync face never started its
        loop): there is nothing to hand off; later calls raise ConsumerClosedError."""
        if not self.lifecycle.joining and not self.lifecycle.joined:
            self.lifecycle.begin_close()
            self.lifecycle.closed()

    async def abort(self) -> None:
        """Stop like a killed process: no handoff, no final checkpoint, no deregistration; the
        others take the shards over once this member's heartbeat is ``client_timeout`` old.
        (A test seam for crashes.)"""
        lifecycle = self.lifecycle
        if lifecycle.begin_close() is None:
            return
        if lifecycle.joining:
            await lifecycle.wait_joined()
        if not lifecycle.joined:
            lifecycle.closed()
            return
        self.heartbeat.stop()
        self.supervisor.stop.set()
        await self.supervisor.cancel_all()
        await self.aws.close()
        lifecycle.closed()

    # -- failures and lease events ------------------------------------------------------------
    def _stop_everything(self, error: BaseException) -> None:
        self.heartbeat.halt()  # a failed member must look dead to the others
        for lease in self.leases.values():
            lease.progress.stop_fetching()
        self.on_failed(error)

    def _on_lost(self, lease: Lease[ReadProgress]) -> None:
        self.metrics.shard_dropped(*lease.key)
        self.leasing.reclaim(lease.key)
        self.supervisor.spawn(self.hooks.revoked([lease.key]), "on_revoked hook")

    async def finish_shard(self, lease: Lease[ProgressT]) -> None:
        """After SHARD_END: once drained, checkpoint the shard finished, release it, and sync
        the stream's shards so the children can be claimed."""
        await self.checkpointer.finish(lease, self._on_finished)

    def _on_finished(self, lease: Lease[ReadProgress]) -> None:
        if self.leases.get(lease.key) is lease:
            del self.leases[lease.key]
        self.metrics.shard_dropped(*lease.key)
        self.shard_sync.request(lease.key[0])

    # -- what callers read --------------------------------------------------------------------
    def lag(self) -> dict[tuple[str, str], int | None]:
        """MillisBehindLatest of every shard this member reads (None until its first read)."""
        return {
            key: lease.progress.millis_behind
            for key, lease in sorted(self.leases.items())
            if lease.claim.status is LeaseStatus.ACTIVE
        }

    def efo_stall_counts(self) -> dict[str, int]:
        """``stream/shard`` -> EFO stalls of the active leases that stalled (client item)."""
        leases = list(self.leases.items())
        return {f"{s}/{i}": x.progress.efo_stalls for (s, i), x in leases if x.progress.efo_stalls}

    def owned_lag(self) -> dict[str, int]:
        """``stream/shard`` -> MillisBehindLatest (-1 when unknown) of every active lease, for the
        client item (``kinesumer status`` shows it for every member)."""
        return {
            f"{stream}/{shard_id}": -1
            if x.progress.millis_behind is None
            else x.progress.millis_behind
            for (stream, shard_id), x in list(self.leases.items())
            if x.claim.status is LeaseStatus.ACTIVE
        }

    def snapshot(self) -> ConsumerStats:
        """Safe from any thread (the sync API calls it from the application's): the containers
        the engine mutates are copied first, each in one C-level step that holds the GIL, then
        read from the copies."""
        leases = sorted(self.leases.items())
        retries = dict(self.requests.retries)
        shards = tuple(
            ShardStatus(
                stream,
                shard_id,
                lease.claim.status.value,
                lease.claim.checkpointed.sequence_number if lease.claim.checkpointed else None,
                lease.progress.millis_behind,
                lease.progress.caught_up,
                ended=lease.progress.reached_end,
                finished=lease.claim.finished,
                efo_stalls=lease.progress.efo_stalls,
                efo_polling=lease.progress.efo_polling,
            )
            for (stream, shard_id), lease in leases
        )
        coordinator: Coordinator | None = getattr(self, "coordinator", None)
        checkpointer: Checkpointer | None = getattr(self, "checkpointer", None)
        buffered_records, buffered_bytes = self.buffered()
        last_error = self.requests.last_error
        return ConsumerStats(
            client_id=self.client_id,
            leader=bool(coordinator and coordinator.membership.leader),
            live_members=tuple(coordinator.membership.live_ids) if coordinator else (),
            shards=shards,
            checkpoint_writes=checkpointer.writes if checkpointer else 0,
            checkpoint_conflicts=checkpointer.conflicts if checkpointer else 0,
            rebalances=coordinator.leasing.rebalances if coordinator else 0,
            retries={f"{op}:{code}": n for (op, code), n in retries.items()},
            last_error=repr(last_error) if last_error else None,
            **self.requests.counts(),
            state=self.lifecycle.state.value,
            claims_pending=bool(coordinator and coordinator.leasing.has_pending),
            coordinator_ticks=coordinator.ticks if coordinator else 0,
            buffered_records=buffered_records,
            buffered_bytes=buffered_bytes,
        )
