"""A group member whose records are read elsewhere (Spark executors).

The same member as every other (heartbeats on their own thread, membership, assignment, fenced
claims, shard sync, graceful handoffs), without fetchers or a buffer: whoever reads asks
:meth:`ExternalReadMember.owned` what it may read and from where, and brackets each batch with
:meth:`~ExternalReadMember.begin` and :meth:`~ExternalReadMember.complete` (or
:meth:`~ExternalReadMember.abandon`). A begun batch is what the progress calls "in hand": a handoff
waits for it (bounded by ``handoff_timeout``), exactly as it waits for a record in the hands of
a generator's caller, and then releases at the completed position, so the next owner starts
right after it. A batch completed ``finished`` (it reached SHARD_END) checkpoints the shard
finished, which makes its children readable after the next shard sync.

The API is blocking and thread-safe; the member runs on an event loop thread of its own.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..config import Config, InitialPosition
from ..core import done_ranges
from ..core.done_ranges import Run
from ..errors import ConsumerClosedError, TransientAWSError
from ..models import Position
from ..runtime.loop_thread import LoopThread
from ..stats import ConsumerStats
from .hooks import RebalanceHooks
from .leases import Claim, Lease, LeaseStatus, resumed_at, wait_for_parents
from .member import GroupMember
from .shard_sync import ShardStart

log = logging.getLogger("kinesumer.external")


@dataclass(frozen=True)
class OwnedShard:
    """A shard this member holds and may read now."""

    stream: str
    shard_id: str
    #: This member's client id.
    owner: str
    #: The lease number (fencing token) of the claim.
    lease: int
    #: Resume AFTER this (the checkpoint); None: no checkpoint yet.
    position: Position | None
    #: Where to start when ``position`` is None: "TRIM_HORIZON" for a child of a reshard, else
    #: ``Config.initial_position``.
    start: InitialPosition
    #: Where a plain member's ``LATEST`` read of the shard began (epoch ms, Kinesis's clock:
    #: the checkpoint item's ``started_at``), when it began one before any checkpoint.
    started_at_ms: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.shard_id)


def behind(position: Position, other: Position | None) -> bool:
    """Whether ``position`` is before ``other`` in the shard (sequence numbers compared as
    numbers: up to 56 digits, not zero-padded)."""
    if other is None:
        return False
    return (int(position.sequence_number), position.sub_sequence_number) < (
        int(other.sequence_number),
        other.sub_sequence_number,
    )


class BatchProgress:
    """The read progress of a shard whose records are read elsewhere: the batches begun and
    not yet completed or abandoned, and how far the completed ones got. Changed only by
    :class:`ReadElsewhereMember` on its loop (the reader's calls arrive there); the checkpointer
    reads it as any read progress. Nothing is fetched or delivered here, so there is no fetcher
    to stop, no lag and no skip of done records: the inherited done runs are written back
    (above the completed position) until the position passes them."""

    __slots__ = ("_inherited", "fetched", "open_batches", "processed", "reached_end")

    millis_behind: int | None = None
    caught_up = False
    efo_stalls = 0
    efo_polling = False

    def __init__(self, claim: Claim) -> None:
        #: The end of the last completed batch (where the claim resumed, at first).
        self.processed: Position | None = resumed_at(claim.checkpoint)
        #: The end of a completed batch that reached SHARD_END.
        self.fetched: Position | None = None
        #: A completed batch reached SHARD_END.
        self.reached_end = False
        #: Batches begun and not yet completed or abandoned.
        self.open_batches = 0
        self._inherited: tuple[Run, ...] = claim.inherited

    @property
    def in_hand(self) -> bool:
        """A begun batch not completed yet: a handoff waits for it."""
        return self.open_batches > 0

    @property
    def drained(self) -> bool:
        """At SHARD_END with no batch open and every read record completed."""
        return (
            self.reached_end
            and self.open_batches == 0
            and (self.fetched is None or self.processed == self.fetched)
        )

    def done_marks(self) -> tuple[Position | None, list[Run]]:
        position = self.processed
        if not self._inherited:
            return position, []
        return position, done_ranges.above(self._inherited, position)

    def stop_fetching(self) -> None:
        """Nothing is fetched here: the reader learns of the end from :meth:`owned`."""

    def begin_batch(self) -> None:
        """A batch reading this shard elsewhere was planned: a handoff waits for it."""
        self.open_batches += 1

    def end_batch(self) -> None:
        """That batch was completed (after its checkpoint write) or abandoned."""
        self.open_batches = max(0, self.open_batches - 1)

    def complete_batch(self, position: Position | None, finished: bool) -> None:
        """A batch ending at ``position`` committed (before its checkpoint write); ``finished``:
        it reached SHARD_END. ``processed`` never moves backwards (a late, older batch)."""
        if position is not None and not behind(position, self.processed):
            self.processed = position
        if finished:
            if position is not None:
                self.fetched = position
            self.reached_end = True


class ReadElsewhereMember(GroupMember[BatchProgress]):
    """The asyncio side of :class:`ExternalReadMember` (runs on its loop)."""

    def __init__(self, config: Config, hooks: RebalanceHooks | None = None) -> None:
        super().__init__(config, hooks)
        # Claimed leases whose parents are all finished, with where each starts.
        self._readable: dict[Lease[BatchProgress], InitialPosition] = {}
        # The leases begun batches were counted on, oldest first, by shard.
        self._begun: dict[tuple[str, str], list[Lease[BatchProgress] | None]] = {}
        #: The leases (claims) whose LATEST start this member recorded: the planner asks at
        #: every batch while the shard has no checkpoint, one write per claim is enough. By
        #: object, not by lease number: a claim made again (after a loss, an operator's move, a
        #: deleted item whose numbers start over) is a new object and records again.
        self._starts_recorded: weakref.WeakSet[Claim] = weakref.WeakSet()

    def new_progress(self, claim: Claim) -> BatchProgress:
        return BatchProgress(claim)

    def on_claimed(self, lease: Lease[BatchProgress], start: ShardStart) -> None:
        stream, shard_id = lease.key
        check = self.shard_sync.parents_check(lease.key, start)
        self.supervisor.spawn(
            self._readable_after_parents(lease, start, check), f"parents of {stream}/{shard_id}"
        )

    async def _readable_after_parents(
        self, lease: Lease[BatchProgress], start: ShardStart, check: Callable[[], Awaitable[bool]]
    ) -> None:
        """Parents before children: the lease becomes readable once every parent finished."""
        if await wait_for_parents(lease.claim, check, self.config.heartbeat_interval):
            self._readable[lease] = start.initial

    async def owned(self) -> list[OwnedShard]:
        failure = self.lifecycle.failure
        if failure is not None:
            raise failure
        ended = [lease for lease in self._readable if lease.claim.status is not LeaseStatus.ACTIVE]
        for lease in ended:
            del self._readable[lease]
        return [
            OwnedShard(
                *lease.key,
                owner=self.client_id,
                lease=lease.claim.checkpoint.lease,
                position=lease.claim.checkpointed,
                start=initial,
                started_at_ms=lease.claim.checkpoint.started_at_ms,
            )
            for lease, initial in sorted(self._readable.items(), key=lambda item: item[0].key)
            if not lease.progress.reached_end
        ]

    async def begin(self, key: tuple[str, str], lease_number: int | None) -> bool:
        lease = self.leases.get(key)
        held = (
            lease is not None
            and lease.claim.status is LeaseStatus.ACTIVE
            and lease in self._readable
            and (lease_number is None or lease.claim.checkpoint.lease == lease_number)
        )
        if held:
            assert lease is not None
            lease.progress.begin_batch()
        self._begun.setdefault(key, []).append(lease if held else None)
        return held

    async def record_start(
        self, key: tuple[str, str], lease_number: int, started_at_ms: int
    ) -> bool:
        lease = self.leases.get(key)
        if (
            lease is None
            or lease.claim.status is not LeaseStatus.ACTIVE
            or lease.claim.checkpoint.lease != lease_number
        ):
            return False
        if lease.claim.checkpointed is not None or lease.claim in self._starts_recorded:
            return True  # resumes after the checkpoint, or recorded already under this claim
        recorded = await self.checkpointer.record_start(lease, started_at_ms)
        if recorded:
            self._starts_recorded.add(lease.claim)
        return recorded

    def _end(self, key: tuple[str, str]) -> Lease[BatchProgress] | None:
        begun = self._begun.get(key)
        if not begun:
            return None
        lease = begun.pop(0)
        if not begun:
            del self._begun[key]
        return lease

    async def complete(
        self, key: tuple[str, str], position: Position | None, finished: bool
    ) -> bool:
        lease = self._end(key)
        if lease is None:
            return False
        try:
            if lease.claim.status in (LeaseStatus.LOST, LeaseStatus.RELEASED):
                return False
            lease.progress.complete_batch(position, finished)
            try:
                # The position only: ``finished`` is written by finish_shard once no other batch
                # of the shard is open, or children could start while a parent batch is open.
                written = await self.checkpointer.write(lease)
            except TransientAWSError as exc:
                # Not a lost lease: the position is marked processed, so the periodic flush (or
                # the handoff) writes it when DynamoDB answers again.
                log.warning(
                    "[%s] checkpoint of %s/%s not written yet: %s", self.client_id, *key, exc
                )
                written = True
        finally:
            lease.progress.end_batch()
        if written and finished and lease.claim.status is LeaseStatus.ACTIVE:
            # Retried until it lands or the lease is lost; never blocks the caller's thread.
            self.supervisor.spawn(self.finish_shard(lease), f"finish {key[0]}/{key[1]}")
        return written

    async def abandon(self, key: tuple[str, str]) -> None:
        lease = self._end(key)
        if lease is not None:
            lease.progress.end_batch()

    async def abandon_all(self) -> int:
        ended = 0
        for key in sorted(self._begun):
            for lease in self._begun.pop(key):
                ended += 1
                if lease is not None:
                    lease.progress.end_batch()
        return ended


class ExternalReadMember:
    """A member of ``config.app``'s group that reads nothing itself. Thread-safe, blocking."""

    def __init__(self, config: Config, hooks: RebalanceHooks | None = None) -> None:
        if not isinstance(config, Config):
            raise TypeError(
                f"ExternalReadMember needs a kinesumer.Config, got {type(config).__name__}"
            )
        self._member = ReadElsewhereMember(config, hooks)
        self._loop = LoopThread(f"kinesumer-{self._member.client_id}")
        self._closing = threading.Lock()

    @property
    def client_id(self) -> str:
        return self._member.client_id

    def start(self, streams: Sequence[str]) -> None:
        """Join (table and streams checked: named errors raised here), return once the first
        claims settled."""
        if isinstance(streams, str):
            raise TypeError("streams must be a list of stream names, not a string")
        self._loop.run(self._member.start(tuple(streams)))

    def owned(self) -> list[OwnedShard]:
        """Shards held now and readable now: claimed, parents finished (parents before
        children), not finished, not being handed off. Raises the engine's failure if it
        failed."""
        if not self._loop.started or self._loop.stopped:
            failure = self._member.failure
            if failure is not None:
                raise failure
            return []
        return self._loop.run(self._member.owned())

    def begin(self, key: tuple[str, str], lease: int | None = None) -> bool:
        """A batch that reads this shard was planned: a handoff of the shard now waits (bounded
        by ``Config.handoff_timeout``) until every begun batch was completed or abandoned.

        True when the shard is held and readable now (under lease number ``lease``, when given).
        False: it is not (it moved, is being handed off, or was re-claimed under another lease
        since the caller looked): the caller must not read it; the begin() still counts, and its
        complete() writes nothing and returns False."""
        return self._loop.run(self._member.begin((key[0], key[1]), lease))

    def record_start(self, key: tuple[str, str], lease: int, started_at_ms: int) -> bool:
        """Record where reading the shard at ``LATEST`` begins (epoch ms, Kinesis's clock) in
        its checkpoint item, before a batch of it is planned: every later owner of the shard
        (plain, fan-out, another query) starts there, also when no batch ever committed. Fenced
        on owner and lease number ``lease``, as a checkpoint; a start already recorded is kept,
        and a shard with a checkpoint records none. False: the shard is not held under
        ``lease`` (the lease is marked lost when the write was refused): do not read it."""
        try:
            return self._loop.run(self._member.record_start((key[0], key[1]), lease, started_at_ms))
        except ConsumerClosedError:
            return False

    def complete(
        self, key: tuple[str, str], position: Position | None, *, finished: bool = False
    ) -> bool:
        """The batch begun for this shard committed, ending at ``position`` (None: it read
        nothing; finished: it reached SHARD_END). Writes the fenced checkpoint (conditional on
        owner and lease) and ends one begin(). False: the lease was lost (the shard moved);
        nothing was written. May be called for a shard no longer in owned() (its handoff waits
        for it): that is how a handoff finishes."""
        try:
            return self._loop.run(self._member.complete((key[0], key[1]), position, finished))
        except ConsumerClosedError:
            return False

    def abandon(self, key: tuple[str, str]) -> None:
        """Ends one begin() without writing (the batch will be replayed elsewhere)."""
        try:
            self._loop.run(self._member.abandon((key[0], key[1])))
        except ConsumerClosedError:
            return

    def abandon_all(self) -> int:
        """Ends every begin() not completed or abandoned yet, without writing (those batches
        will be replayed elsewhere); how many. Before a close that must not wait for batches
        that will never complete, including one whose begin() the caller never saw return (its
        wait was cut short by a signal: the begin still ran)."""
        try:
            return self._loop.run(self._member.abandon_all())
        except ConsumerClosedError:
            return 0

    def stats(self) -> ConsumerStats:
        return self._member.snapshot()

    def close(self) -> None:
        """Graceful: wait for begun batches (bounded by handoff_timeout), write, release every
        shard, deregister. Idempotent; a second caller waits for the first one's close."""
        with self._closing:  # one close at a time: the loop stops only after leave() ran
            if not self._loop.started:
                self._member.mark_closed()
                return
            if self._loop.stopped:
                return
            try:
                self._loop.run(self._member.leave())
            finally:
                self._loop.stop()

    def __enter__(self) -> ExternalReadMember:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
