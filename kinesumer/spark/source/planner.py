"""The driver side of the source: a group member that plans micro-batches, never reads records.

Spark builds the reader in several processes (SPARK-SOURCE.md); only the long-lived source
worker calls the planning methods, so ``__init__`` does no I/O and the member joins on the first
``initialOffset`` / ``latestOffset`` / ``commit``. What each call does:

- ``initialOffset()``: join; a new ledger id (``query``); batch 0 with no shards.
- ``latestOffset(start, limit)``: (1) *settle* batch ``start.batch`` (Spark committed it: it only
  asks for the next offset after the previous batch ran): per shard, ``complete()`` the member's
  fenced checkpoint at the ledger's end; (2) form the next starts: a shard of ``start`` still
  owned continues after its ledger end (or the group checkpoint, if that is later), a shard
  newly owned starts from its checkpoint or start position, a shard no longer owned is dropped
  (its handoff waited for the complete above), a shard at SHARD_END is never planned again;
  (3) decide: plan batch ``start.batch + 1`` when a shard is new here, or some shard was not
  caught up (availableNow: and not yet past the run's start), or (idle, at most every
  ``idle_poll_interval``) a probe found new records; else return ``start`` unchanged: no empty
  batches. availableNow then ends (the member leaves first: Spark kills the worker without
  ``stop()``); other triggers ask again. Every shard of a planned batch gets ``begin()``.
- ``partitions(start, end)``: one :class:`ShardPartition` per shard of ``end``.
- ``commit(end)``: settle ``end`` if not yet, and delete ledger items of older batches.

So the group's DynamoDB checkpoints trail Spark's own checkpoint by at most one micro-batch.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from ...config import Config
from ...models import Position
from .driverio import DriverIO
from .ledger import LedgerEntry
from .offsets import SourceOffset, Start, sequence_after
from .options import SourceOptions
from .partition import ShardPartition

log = logging.getLogger("kinesumer.spark.source")

Key = tuple[str, str]


class Owned(Protocol):
    """What the planner reads of :class:`~kinesumer.engine.external.OwnedShard`."""

    @property
    def key(self) -> Key: ...
    @property
    def lease(self) -> int: ...
    @property
    def position(self) -> Position | None: ...
    @property
    def start(self) -> Any: ...


class Member(Protocol):
    """The part of :class:`~kinesumer.engine.external.ExternalReadMember` the planner uses."""

    def start(self, streams: Any) -> None: ...
    def owned(self) -> Any: ...
    def begin(self, key: Key, lease: int | None = None) -> bool: ...
    def complete(self, key: Key, position: Position | None, *, finished: bool = False) -> bool: ...
    def abandon(self, key: Key) -> None: ...
    def stats(self) -> Any: ...
    def close(self) -> None: ...


MemberFactory = Callable[[Config], Member]


def external_member(config: Config) -> Member:
    from ...engine.external import ExternalReadMember

    member: Member = ExternalReadMember(config)
    return member


class Planner:
    """Plans batches for one query; see the module docstring. Not thread-safe (Spark calls it
    from one thread)."""

    def __init__(self, options: SourceOptions, member_factory: MemberFactory | None = None):
        self.options = options
        self._member_factory = member_factory or external_member
        self._member: Member | None = None
        self._io: DriverIO | None = None
        self._query: str | None = None
        self._planned: dict[int, set[Key]] = {}  # batches planned (and begun) here
        self._planned_here: set[int] = set()  # every batch this process planned
        self._settled: set[int] = set()
        self._ends: dict[int, dict[Key, LedgerEntry]] = {}
        self._target_ms: int | None = None  # availableNow: records after this are not awaited
        self._last_probe = 0.0
        self._latest: dict[str, Any] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def _join(self, query: str, previous_owner: str = "") -> Member:
        """The member, joined; ``previous_owner``: the member that planned the offset Spark
        resumes from (see :meth:`_forget_previous_run`)."""
        if self._query != query:
            if self._io is not None:
                self._io.close()
            self._io = DriverIO(self.options.config, query, self.options.ledger_ttl_seconds)
            self._query = query
        if self._member is None:
            member = self._member_factory(self.options.config)
            self._forget_previous_run(previous_owner)
            member.start(self.options.streams)  # named errors (table, streams) raised here
            self._member = member
        return self._member

    def _forget_previous_run(self, owner: str) -> None:
        """Deregister the member of this query's previous run before joining.

        Spark runs one query per checkpoint folder at a time and ends its source worker with
        SIGKILL (``stop()`` never runs), so the member that planned the offset we resume from is
        dead, but looks live for ``client_timeout``: the group would keep its shards unclaimed
        meanwhile, and an availableNow run would end without them. Its shards are then
        claimable at once (their owner is no longer live), from their checkpoints.
        """
        if owner and owner != self.options.config.client_id:
            self.io.remove_member(owner)
            log.info("member %s of this query's previous run deregistered", owner)

    @property
    def query(self) -> str | None:
        """The ledger id of the query once joined."""
        return self._query

    @property
    def io(self) -> DriverIO:
        assert self._io is not None, "joined first"
        return self._io

    def close(self) -> None:
        """Leave the group gracefully (best effort: Spark rarely calls stop())."""
        member, io = self._member, self._io
        self._member = self._io = None
        self._query = None
        try:
            if member is not None:
                member.close()
        finally:
            if io is not None:
                io.close()

    # -- Spark's calls ----------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        query = uuid.uuid4().hex
        member = self._join(query)
        return SourceOffset(query=query, batch=0, owner=str(member.stats().client_id)).to_json()

    def prepare_available_now(self) -> None:
        self._target_ms = int(time.time() * 1000)

    def latest_offset(self, start_json: dict[str, Any], max_rows: int | None) -> dict[str, Any]:
        start = SourceOffset.from_json(start_json)
        member = self._join(start.query, start.owner)
        self._settle(start)
        ends = self._ledger(start)
        starts = self._next_starts(start, ends, {o.key: o for o in member.owned()})
        reason = self._reason(start, ends, starts)
        if reason is None and self._target_ms is not None:
            # availableNow is about to end: first let pending claims settle (shards on their
            # way here from another member, children of a parent finished just now).
            self._await_claims(member)
            starts = self._next_starts(start, ends, {o.key: o for o in member.owned()})
            reason = self._reason(start, ends, starts)
        if reason is None:
            if self._target_ms is not None:
                # availableNow ends here, and Spark will kill this worker without calling
                # stop(): leave now, gracefully (the batch was settled above), so the group
                # need not wait client_timeout for this member's shards.
                self.close()
            return start_json
        client_id = str(member.stats().client_id)
        planned = self._plan(start, self._begin(member, starts), max_rows, client_id)
        if planned is None:
            return start_json  # every shard moved away meanwhile
        log.info(
            "[%s] batch %d planned (%s): %d shards", client_id, planned.batch, reason,
            len(planned.shards),
        )  # fmt: skip
        self._latest = planned.to_json()
        return self._latest

    def report_latest(self) -> dict[str, Any] | None:
        return self._latest

    def partitions(self, end_json: dict[str, Any]) -> list[ShardPartition]:
        end = SourceOffset.from_json(end_json)
        o = self.options
        return [
            ShardPartition(
                config=o.config,
                query=end.query,
                batch=end.batch,
                stream=stream,
                shard_id=shard_id,
                start=start,
                limit=end.limits.get((stream, shard_id), o.max_records_per_shard),
                owner=end.owner,
                max_read_seconds=o.max_read_seconds,
                ledger_ttl=o.ledger_ttl_seconds,
                fail_first_read_dir=o.test_fail_first_read_dir,
            )
            for (stream, shard_id), start in sorted(end.shards.items())
        ]

    def commit(self, end_json: dict[str, Any]) -> None:
        end = SourceOffset.from_json(end_json)
        self._join(end.query, end.owner)
        self._settle(end)
        deleted = self.io.delete_before(end.batch)
        if deleted:
            log.debug("ledger: %d items of batches before %d deleted", deleted, end.batch)
        for batch in [b for b in self._ends if b < end.batch]:
            del self._ends[batch]

    # -- the steps --------------------------------------------------------------------------------
    def _ledger(self, offset: SourceOffset) -> dict[Key, LedgerEntry]:
        """The ledger items of ``offset``'s batch (read once: they no longer change)."""
        if not offset.shards:
            return {}
        ends = self._ends.get(offset.batch)
        if ends is None:
            ends = self.io.batch(offset.batch)
            missing = set(offset.shards) - set(ends)
            if missing:
                log.warning(
                    "batch %d: no ledger item for %s: its DataFrame was not read (a sink that "
                    "never evaluates it?); those shards are planned again from the same start",
                    offset.batch, sorted(missing),
                )  # fmt: skip
            self._ends[offset.batch] = ends
        return ends

    def _settle(self, offset: SourceOffset) -> None:
        """Batch ``offset.batch`` is committed in Spark: write the group's checkpoints."""
        if not offset.shards or offset.batch in self._settled:
            return
        member = self._member
        assert member is not None
        ends = self._ledger(offset)
        began = self._planned.pop(offset.batch, None)
        owned: dict[Key, Owned] | None = None
        for key in sorted(offset.shards):
            entry = ends.get(key)
            if began is None:
                # Planned by an earlier run of the query (a restart): adopt the shard if this
                # member holds it now, never moving its checkpoint backwards.
                if owned is None:
                    owned = {o.key: o for o in member.owned()}
                holder = owned.get(key)
                if holder is None or entry is None or entry.end is None:
                    continue
                if holder.position is not None and not sequence_after(entry.end, holder.position):
                    continue
                if not member.begin(key, holder.lease):
                    member.abandon(key)  # moved meanwhile
                    continue
            elif key not in began:
                continue
            if entry is None:
                member.abandon(key)
            elif not member.complete(key, entry.end, finished=entry.shard_end):
                log.warning("%s/%s moved to another member before batch %d settled", *key,
                            offset.batch)  # fmt: skip
        self._settled.add(offset.batch)

    def _await_claims(self, member: Member) -> None:
        """No claim pending, and two coordinator ticks passed (bounded by a handoff)."""
        config = self.options.config
        deadline = time.monotonic() + config.handoff_timeout + 2 * config.client_timeout
        first = _ticks(member)
        while time.monotonic() < deadline:
            stats = member.stats()
            if not getattr(stats, "claims_pending", False) and _ticks(member) >= first + 2:
                return
            time.sleep(min(0.1, config.heartbeat_interval))

    def _next_starts(
        self, start: SourceOffset, ends: dict[Key, LedgerEntry], owned: dict[Key, Owned]
    ) -> dict[Key, Start]:
        starts: dict[Key, Start] = {}
        for key, holder in owned.items():
            entry = ends.get(key)
            if entry is not None and entry.shard_end:
                continue  # read to its end; complete(finished=True) releases its children
            previous = start.shards.get(key)
            if previous is not None:
                after = entry.end if entry is not None and entry.end else previous.after
                nxt = Start(after=after, lease=holder.lease) if after else previous
                if holder.position is not None and (
                    nxt.after is None or sequence_after(holder.position, nxt.after)
                ):
                    nxt = Start(after=holder.position)  # checkpointed further by another member
                starts[key] = replace(nxt, lease=holder.lease)
            elif holder.position is not None:
                starts[key] = Start(after=holder.position, lease=holder.lease)
            else:
                starts[key] = _initial(holder.start, holder.lease)
        return starts

    def _reason(
        self, start: SourceOffset, ends: dict[Key, LedgerEntry], starts: dict[Key, Start]
    ) -> str | None:
        """Why a new batch is needed, or None (return ``start`` unchanged)."""
        if not starts:
            return None
        if set(starts) - set(start.shards):
            return "new shards"  # (shards handed off or finished need no batch of their own)
        target = self._target_ms
        for key in starts:
            entry = ends.get(key)
            if entry is None:
                return "not read yet"
            if entry.caught_up:
                continue
            if target is not None and (entry.last_arrival_ms or 0) >= target:
                continue  # availableNow: past what existed when the run started
            return "more to read"
        if target is not None:
            # availableNow: every shard read to its tip. If that was found before this run
            # began (the batch was planned by an earlier run), look once for what came since.
            if start.batch in self._planned_here:
                return None
            return "new records" if self.io.any_new(starts) else None
        now = time.monotonic()
        if now - self._last_probe < self.options.idle_poll_interval:
            return None
        self._last_probe = now
        found = self.io.any_new(starts)
        log.debug("batch %d: idle; probe of %d shards found %s", start.batch, len(starts),
                  "records" if found else "nothing")  # fmt: skip
        return "new records" if found else None

    def _begin(self, member: Member, starts: dict[Key, Start]) -> dict[Key, Start]:
        """``begin()`` every shard to plan; those no longer held (under the lease seen) are
        abandoned at once and left out."""
        held: dict[Key, Start] = {}
        for key, start in sorted(starts.items()):
            if member.begin(key, start.lease):
                held[key] = start
            else:
                member.abandon(key)
        return held

    def _plan(
        self, start: SourceOffset, starts: dict[Key, Start], max_rows: int | None, owner: str
    ) -> SourceOffset | None:
        """The offset of batch ``start.batch + 1`` over ``starts`` (begun), or None."""
        if not starts:
            return None
        o = self.options
        bounds = [n for n in (o.max_records_per_trigger, max_rows) if n]
        per_shard = o.max_records_per_shard
        if bounds:
            per_shard = min(per_shard, max(1, min(bounds) // len(starts)))
        now_ms = int(time.time() * 1000)
        pinned = {
            # LATEST is pinned to the planning time, so a replay reads the same records.
            k: Start(at_timestamp_ms=now_ms, lease=s.lease) if s.at == "LATEST" else s
            for k, s in starts.items()
        }
        planned = SourceOffset(
            query=start.query,
            batch=start.batch + 1,
            owner=owner,
            shards=pinned,
            limits=dict.fromkeys(pinned, per_shard),
        )
        self._planned[planned.batch] = set(pinned)
        self._planned_here.add(planned.batch)
        return planned


def _initial(start: Any, lease: int) -> Start:
    if isinstance(start, str):
        return Start(at=start, lease=lease)
    return Start(at_timestamp_ms=int(start.timestamp() * 1000), lease=lease)


def _ticks(member: Member) -> int:
    return int(getattr(member.stats(), "coordinator_ticks", 0))
