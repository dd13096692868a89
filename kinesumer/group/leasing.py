"""Leasing: claims and handoffs, moving this member's leases to match its assignment.

Shards that moved away are handed off gracefully (:meth:`Leasing.hand_off`); new ones are
claimed with a conditional write. A claim refused because the previous owner is still live (it
is handing off) stays pending and is retried on the coordinator's fast cadence until the next
tick, so a rebalance completes in a fraction of a tick after the previous owner lets go.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import Generic

from ..errors import TransientAWSError
from ..models import Checkpoint
from ..observability.metrics import Metrics
from ..runtime.supervisor import wait_done
from ..statestore.base import StateStore
from .checkpointer import Checkpointer
from .hooks import RebalanceHooks
from .leases import Claim, Lease, LeaseStatus, NewProgress, ProgressT
from .membership import Membership
from .shard_sync import ShardStart, ShardSync

log = logging.getLogger("kinesumer.coordinator")

#: Called with a newly claimed lease once the application heard about it: start reading it.
OnClaimed = Callable[[Lease[ProgressT], ShardStart], None]


class Leasing(Generic[ProgressT]):
    """This member's claims, made and handed off on the loop. A claim that succeeds gets its
    read progress from ``new_progress`` at once: the pair is the lease the others see."""

    def __init__(
        self,
        client_id: str,
        handoff_timeout: float,
        store: StateStore,
        checkpointer: Checkpointer,
        leases: dict[tuple[str, str], Lease[ProgressT]],
        membership: Membership,
        shard_sync: ShardSync,
        new_progress: NewProgress[ProgressT],
        on_claimed: OnClaimed[ProgressT],
        report: Callable[[BaseException, str], None],
        hooks: RebalanceHooks,
        metrics: Metrics,
        *,
        reset_command: str = "kinesumer checkpoints reset",
    ) -> None:
        self.client_id = client_id
        self._handoff_timeout = handoff_timeout
        self._store = store
        self._checkpointer = checkpointer
        self._leases = leases
        self._membership = membership
        self._shard_sync = shard_sync
        self._new_progress = new_progress
        self._on_claimed = on_claimed
        self._report = report
        self._hooks = hooks
        self._metrics = metrics
        self._pending: set[tuple[str, str]] = set()
        self._wanted: set[tuple[str, str]] = set()
        self._handoffs: set[asyncio.Task[bool]] = set()
        #: Leases of ours lost (fence, refused write) whose items may still name us: released
        #: (conditionally) once the shard is no longer ours by the assignment, or the live
        #: owner the others wait for would never hand it off.
        self._lost: dict[tuple[str, str], Checkpoint] = {}
        self.rebalances = 0
        #: The command an operator runs to forget a shard's recorded start (its group's
        #: ``--app`` and ``--table`` included), named by the warning below.
        self._reset_command = reset_command
        #: Shards whose recorded LATEST start this member warned about (once each).
        self._warned_starts: set[tuple[str, str]] = set()
        #: Awaited after an on_assigned hook failed and the member was failed (it leaves the
        #: group, so the others take the shards at once).
        self.on_hook_failed: Callable[[], Awaitable[None]] | None = None

    @property
    def has_pending(self) -> bool:
        """Wanted shards not claimed yet."""
        return bool(self._pending)

    def active_keys(self) -> set[tuple[str, str]]:
        return {k for k, lease in self._leases.items() if lease.claim.status is LeaseStatus.ACTIVE}

    async def rebalance(self, mine: dict[str, tuple[str, ...]]) -> None:
        """Hand off the shards no longer ours, claim the ones newly ours."""
        wanted = {(stream, sid) for stream, ids in mine.items() for sid in ids}
        if wanted != self._wanted:
            self.rebalances += 1
            self._metrics.rebalanced()
        self._wanted = wanted
        owned = self.active_keys()
        for key in sorted(owned - wanted):
            self.hand_off(self._leases[key])
        self._pending = wanted - owned
        await self._release_lost(wanted)
        await self.claim_pending()

    async def _release_lost(self, wanted: set[tuple[str, str]]) -> None:
        """Give back, in the table, the lost leases of shards no longer ours: conditional on our
        owner and lease (refused: someone took it over already). Otherwise a lapse (the fence
        passed, every lease lost) that coincides with a rebalance leaves items naming a live
        member that holds nothing, and the others wait for its handoff forever."""
        for key, checkpoint in sorted(self._lost.items()):
            if key in wanted:
                continue  # claimed again (as its owner) by claim_pending
            try:
                released = await self._store.write_checkpoint(checkpoint, None, release=True)
            except TransientAWSError as exc:
                log.warning("[%s] release of lost %s/%s: %s", self.client_id, *key, exc)
                continue
            del self._lost[key]
            if released:
                log.info("[%s] released %s/%s (its lease was lost)", self.client_id, *key)

    async def read_owners(self, streams: Iterable[str]) -> dict[str, dict[str, str]]:
        """stream -> shard id -> owner, from the checkpoint items (one strongly consistent
        Query per stream and MB): the input of sticky assignment."""
        owners: dict[str, dict[str, str]] = {}
        for stream in sorted(streams):
            found = await self._store.get_checkpoints(stream)
            owners[stream] = {sid: c.owner for sid, c in found.items() if c.owner is not None}
        return owners

    def hand_off(self, lease: Lease[ProgressT]) -> None:
        """Start a graceful handoff of ``lease`` (bounded by ``handoff_timeout``); the lease
        leaves the table once it is done."""
        task = asyncio.ensure_future(self._checkpointer.handoff(lease, self._handoff_timeout))
        self._handoffs.add(task)

        def done(t: asyncio.Task[bool]) -> None:
            self._handoffs.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self._report(t.exception(), f"handoff of {lease.key[0]}/{lease.key[1]}")  # type: ignore[arg-type]
            ended = lease.claim.status is not LeaseStatus.ACTIVE
            if self._leases.get(lease.key) is lease and ended:
                del self._leases[lease.key]
                self._metrics.shard_dropped(*lease.key)

        task.add_done_callback(done)

    async def wait_handoffs(self) -> None:
        while self._handoffs:
            # Errors were reported by each task's done callback; here we only wait.
            await asyncio.gather(*list(self._handoffs), return_exceptions=True)

    def reclaim(self, key: tuple[str, str]) -> None:
        """A lease of ours was lost (fence, refused write): if the shard is still ours by the
        assignment, claim it again on the fast retry cadence rather than at the next tick."""
        lease = self._leases.get(key)
        if lease is not None and lease.claim.status is LeaseStatus.LOST:
            self._lost[key] = lease.claim.checkpoint
        if key in self._wanted:
            self._pending.add(key)

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
        gone = await self._owners_gone(seen.values())
        owned_before = self.active_keys()
        results = await asyncio.gather(
            *(self._claim(k, seen[k], gone) for k in keys), return_exceptions=True
        )
        gained = sorted(self.active_keys() - owned_before)
        try:
            await self._hooks.assigned(gained)
        except Exception as exc:
            # The application never heard of these shards: give them back before the error
            # stops the member (FAILED), so the others take them at once, not after
            # client_timeout. The caller raises the error to the application.
            # Bounded: the release retries while DynamoDB fails (then the shards free up once
            # this member's heartbeat is client_timeout old, as after a crash).
            giving_back = asyncio.gather(
                *(self._give_back(self._leases[key]) for key in gained), return_exceptions=True
            )
            await wait_done(giving_back, self._handoff_timeout)
            self._report(exc, "on_assigned hook")
            if self.on_hook_failed is not None:
                await self.on_hook_failed()
            raise
        self._warn_recorded_starts(gained)
        for key in gained:  # read only once the application has heard about the shard
            self._on_claimed(self._leases[key], self._shard_sync.start_of(key))
        for key, result in zip(keys, results, strict=True):
            if result is True:
                self._pending.discard(key)
            elif isinstance(result, TransientAWSError):
                log.warning("[%s] claim of %s/%s: %s", self.client_id, *key, result)
            elif isinstance(result, BaseException):
                raise result

    def _warn_recorded_starts(self, keys: Iterable[tuple[str, str]]) -> None:
        """Once per shard, at WARNING: a shard with no position but a recorded LATEST start is
        read from that start, whatever this member's initial position (a backfill at
        TRIM_HORIZON after a LATEST run would otherwise read nothing, silently). Names the
        command that makes the group forget the start."""
        found: dict[str, list[tuple[str, int]]] = {}
        for key in keys:
            claim = self._leases[key].claim
            started = claim.checkpoint.started_at_ms
            if started is None or claim.checkpointed is not None or key in self._warned_starts:
                continue
            if started == 0:  # a rewind to the oldest record: what TRIM_HORIZON reads too
                continue
            initial = self._shard_sync.start_of(key).initial
            if initial == "LATEST":
                continue
            self._warned_starts.add(key)
            found.setdefault(key[0], []).append((key[1], started))
        for stream, shards in sorted(found.items()):
            initial = self._shard_sync.start_of((stream, shards[0][0])).initial
            wanted = initial if isinstance(initial, str) else initial.isoformat()
            ids = [shard_id for shard_id, _ in shards]
            command = f"{self._reset_command} --stream {shlex.quote(stream)}"
            if len(ids) == 1:
                how = f"`{command} --shard {ids[0]}`"
            else:
                how = f"`{command} --shard ID` for each (`--all-shards`: every shard of it)"
            log.warning(
                "[%s] %s: %s %s no checkpoint but a recorded LATEST start (%s; or a `checkpoints "
                "rewind` put it there): read from there, "
                "not from initial_position %s. To read from %s, stop the group and run %s",
                self.client_id,
                stream,
                ", ".join(ids),
                "has" if len(ids) == 1 else "have",
                ", ".join(sorted({_iso(ms) for _, ms in shards})),
                wanted,
                wanted,
                how,
            )

    async def _give_back(self, lease: Lease[ProgressT]) -> None:
        """Release a lease whose shard was never read (its checkpoint is unchanged)."""
        await self._checkpointer.give_back(lease)
        if self._leases.get(lease.key) is lease:
            del self._leases[lease.key]

    async def _owners_gone(self, seen: Iterable[Checkpoint | None]) -> set[str]:
        """The owners not live in our member list whose shards may be taken over (one strongly
        consistent read of each one's client item, after the checkpoints naming it were read:
        see :meth:`Membership.owner_gone`). No read while every owner is live or absent."""
        membership = self._membership
        owners = {
            c.owner
            for c in seen
            if c is not None
            and not c.finished
            and c.owner not in (None, self.client_id)
            and c.owner not in membership.live_ids
        }
        return {owner for owner in sorted(owners) if await membership.owner_gone(owner)}

    async def _claim(self, key: tuple[str, str], seen: Checkpoint | None, gone: set[str]) -> bool:
        """True when the shard needs nothing more from us (claimed, or already finished).
        ``seen`` is its checkpoint as just read (strongly consistent); ``gone``: the owners
        whose shards may be taken over."""
        stream, shard_id = key
        membership = self._membership
        if membership.fenced:
            return False  # fenced: claiming now would only be refused again at delivery
        existing = self._leases.get(key)
        if existing is not None and existing.claim.status is LeaseStatus.ACTIVE:
            return True
        if existing is not None and existing.claim.status is LeaseStatus.REVOKING:
            return False  # our own handoff is still running; claim again once it is done
        if seen is not None and seen.finished:
            return True
        if seen is None and self._store.checkpoint_unreadable(stream, shard_id):
            # Corrupt (another app may write this table): not read, never overwritten; the
            # next tick reads it again, so a repaired checkpoint is claimed then.
            return True
        if (
            seen is not None
            and seen.owner is not None
            and seen.owner != self.client_id
            and seen.owner in membership.live_ids
        ):
            return False  # a live owner: it will hand the shard off at its next tick
        if seen is not None and seen.owner not in (None, self.client_id, *gone):
            # Not live in our list, but not known dead with the token its item holds now: it
            # may have joined after our list was read, or heartbeated since it was judged.
            # No clock is compared (the checkpoint's stamp is another host's): the next
            # tick's list, or a verdict, decides.
            return False
        claimed = await self._store.claim(stream, shard_id, self.client_id, seen)
        if claimed is None:
            return False
        if seen is not None and seen.owner not in (None, self.client_id):
            log.info("[%s] took %s/%s over from %s", self.client_id, stream, shard_id, seen.owner)
        claim = Claim(claimed)
        self._leases[key] = Lease(claim, self._new_progress(claim))  # claim_pending reads it
        self._lost.pop(key, None)
        return True


def reset_command(
    app: str, table: str, region: str | None = None, dynamodb_endpoint: str | None = None
) -> str:
    """``kinesumer checkpoints reset`` for the group ``app`` in state table ``table`` (with the
    table's region and endpoint where the member was given them: the command reaches it)."""
    command = f"kinesumer checkpoints reset --app {shlex.quote(app)} --table {shlex.quote(table)}"
    if region:
        command += f" --region {shlex.quote(region)}"
    if dynamodb_endpoint:
        command += f" --dynamodb-endpoint {shlex.quote(dynamodb_endpoint)}"
    return command


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")
