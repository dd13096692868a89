"""The driver side of the source: a group member that plans micro-batches, never reads records.

Spark builds the reader in several processes (SPARK-SOURCE.md); only the long-lived source
worker calls the planning methods, so ``__init__`` does no I/O and the member joins on the first
``initialOffset`` / ``latestOffset`` (``commit`` opens the ledger's clients only). What each
call does:

- ``initialOffset()``: join; a new ledger id (``query``); batch 0 with no shards.
- ``latestOffset(start, limit)``: (1) *settle* batch ``start.batch`` (Spark committed it: it only
  asks for the next offset after the previous batch ran): per shard, ``complete()`` the member's
  fenced checkpoint at the ledger's end (a batch of an earlier run is adopted, :mod:`.settle`);
  (2) form the next starts: a shard of ``start`` still owned continues after its ledger end
  (or the group checkpoint, if later), one newly owned from its checkpoint or start position
  (LATEST pinned, :mod:`.pins`), one no longer owned is dropped (its handoff waited for the
  complete above), one read to SHARD_END is finished if it was not yet, never planned again;
  (3) decide: plan batch ``start.batch + 1`` when a shard is new here, or some shard was not
  caught up (availableNow: and not yet past the run's start; or a closed shard not read to
  SHARD_END), or (idle, at most every ``idle_poll_interval``) a probe found new records; else
  return ``start`` unchanged: no empty batches. A batch planned here whose DataFrame was never
  read is no reason by itself. availableNow then ends (the member leaves first: Spark kills the
  worker without ``stop()``); other triggers ask again. With a records bound below the number
  of shards, a batch plans only some of them (:mod:`.rotation`). Every shard of a planned batch
  gets ``begin()``.
- ``partitions(start, end)``: one :class:`ShardPartition` per shard of ``end``.
- ``commit(end)``: settle ``end`` if not yet (and the member is here), delete ledger items of
  older batches, forget older batches.

So the group's checkpoints are at batch N-1 from Spark's commit of N until the next trigger's
``latestOffset`` (Spark calls nothing sooner; a stop in between leaves them there).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ....config import Config
from ..ledger import LedgerEntry
from ..offsets import SourceOffset, Start, sequence_after
from ..options import SourceOptions
from ..partition import ShardPartition, partitions_of
from .driverio import DriverIO
from .groups import group_config
from .pins import initial_start, local_now_ms, pinned
from .progress import log_read, read_report
from .rotation import Rotation, bound_of
from .settle import Key, Member, Owned, Settlement, await_claims

log = logging.getLogger("kinesumer.spark.source")

MemberFactory = Callable[[Config], Member]


def external_member(config: Config) -> Member:
    from ....group.external import ExternalReadMember

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
        self.settlement = Settlement()
        self.rotation = Rotation()  # shards left out of a batch by the records bound
        self._ends: dict[int, dict[Key, LedgerEntry]] = {}
        self._target_ms: int | None = None  # availableNow: records after this are not awaited
        self._last_probe = 0.0
        self._last_plan = 0.0  # when the last batch was planned (monotonic)
        self._latest: dict[str, Any] | None = None
        self._member_group = ""  # the group ``_member`` joined
        self.last_read: dict[str, Any] | None = None  # the batch read last (:mod:`.progress`)
        self._handed_over: dict[Key, int] = {}  # LATEST reads begun by plain members (epoch ms)
        self._confirmed: SourceOffset | None = None  # the last batch Spark said it committed

    # -- lifecycle ------------------------------------------------------------------------------
    def _open(self, offset: SourceOffset) -> DriverIO:
        """The driver's own clients for ``offset``'s ledger (no group member)."""
        if self._query != offset.query or self._io is None:
            if self._io is not None:
                self._io.close()
            o, group, self._query = self.options, self.group_config(offset).app, offset.query
            self._io = DriverIO(
                o.config, self._query, o.ledger_ttl_seconds, group, o.outage_timeout
            )
        return self._io

    def group_config(self, offset: SourceOffset) -> Config:
        """The member's Config for ``offset``'s query: ``app`` names its group (:mod:`.groups`)."""
        return group_config(self.options.config, offset, self.options.shared_group)

    def _join(self, offset: SourceOffset) -> Member:
        """The member, joined; ``offset.owner``: the member that planned the offset Spark
        resumes from (see :meth:`_forget_previous_run`)."""
        self._open(offset)
        config = self.group_config(offset)
        if self._member is not None and self._member_group != config.app:
            # A replay of batch 0 (crash before its commit) asks initialOffset() again: a fresh,
            # throw-away id, whose group this member joined. Leave it (nothing begun there).
            log.info("leaving group %s for the checkpoint's %s", self._member_group, config.app)
            self._member.close()
            self._member = None
        if self._member is None:
            member = self._member_factory(config)
            self._forget_previous_run(offset.owner)
            member.start(self.options.streams)  # named errors (table, streams) raised here
            log.info("query %s: a member of group %s", offset.query, config.app)
            self._member, self._member_group = member, config.app
        return self._member

    def _forget_previous_run(self, owner: str) -> None:
        """Deregister the member of this query's previous run before joining.

        Spark runs one query per checkpoint folder at a time. A stopped run left the group
        (SIGTERM to its source worker is a leave, see the reader), but one killed outright
        (SIGKILL, a crashed driver) left a member that is dead yet looks live for
        ``client_timeout``: the group would keep its shards unclaimed meanwhile, and an
        availableNow run would end without them. Its shards are then claimable at once (their
        owner is no longer live), from their checkpoints.
        """
        if owner and owner != self.options.config.client_id and self.io.remove_member(owner):
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
        """Leave the group gracefully: the batches Spark committed were settled at their
        commit (checkpoints written); those planned but not committed are abandoned first, or
        the leave would wait ``handoff_timeout`` for them (Spark replays them at the next start,
        from the ledger). Then every shard is released at once and the member deregisters.

        A SIGTERM (``query.stop()`` ends the source worker so) can cut a call short: a settle
        of a batch Spark committed is finished here (its remaining shards completed at their
        ledger ends, as Spark committed them), and every other begin the member holds is
        abandoned, not only the batches recorded as planned: one cut short after a shard's
        begin ran and before its batch was recorded would hold that shard's handoff for
        ``handoff_timeout``, for a batch nobody will complete."""
        member, io, confirmed = self._member, self._io, self._confirmed
        try:
            if member is not None:
                try:
                    if confirmed is not None and confirmed.batch in self.settlement.begun:
                        try:
                            self._settle(confirmed)
                        except Exception as exc:  # the leave goes on; the ledger keeps the ends
                            log.warning(
                                "batch %d not settled at the leave (the next run adopts its "
                                "ends from the ledger): %s", confirmed.batch, exc,
                            )  # fmt: skip
                finally:
                    self._member = None
                    self.settlement.begun.clear()
                    try:
                        member.abandon_all()
                    finally:
                        member.close()
        finally:
            self._member = self._io = None
            self._query = None
            self._confirmed = None
            if io is not None:
                io.close()

    # -- Spark's calls ----------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        offset = SourceOffset(uuid.uuid4().hex, 0)  # its group: as the option says (:mod:`.groups`)
        owner = str(self._join(offset).stats().client_id)
        return replace(offset, owner=owner, group=self._member_group).to_json()

    def prepare_available_now(self) -> None:
        self._target_ms = int(time.time() * 1000)

    def latest_offset(self, start_json: dict[str, Any], max_rows: int | None) -> dict[str, Any]:
        start = SourceOffset.from_json(start_json)
        member = self._join(start)
        self._settle(start)
        ends = self._ledger(start)
        starts = self._next_starts(start, ends, self._owned(member, ends))
        reason = self._reason(start, ends, starts)
        if reason is None and self._target_ms is not None:
            # availableNow is about to end: first let pending claims settle (shards on their
            # way here from another member, children of a parent finished just now, also by
            # this wait's own pass: an earlier run's SHARD_END adopted once its shard showed up).
            for _ in range(3):
                finished = self.settlement.finished
                await_claims(member, self.options.config)
                starts = self._next_starts(start, ends, self._owned(member, ends))
                reason = self._reason(start, ends, starts)
                if reason is not None or self.settlement.finished == finished:
                    break
        if reason is None:
            if self._target_ms is not None:
                # availableNow ends here, and Spark will kill this worker without calling
                # stop(): leave now, gracefully (the batch was settled above), so the group
                # need not wait client_timeout for this member's shards.
                self.close()
            return start_json
        client_id = str(member.stats().client_id)
        bound = bound_of(self.options.max_records_per_trigger, max_rows)
        chosen = self.rotation.choose(start, ends, self._pin(member, starts), bound)
        planned = self._plan(start, self._begin(member, chosen), max_rows, client_id)
        if planned is None:
            return start_json  # every shard moved away meanwhile
        log.info(
            "[%s] batch %d planned (%s): %d shards", client_id, planned.batch, reason,
            len(planned.shards),
        )  # fmt: skip
        self._latest = planned.to_json()
        return self._latest

    def report_latest(self) -> dict[str, Any] | None:
        """The last planned offset, with ``"read"``: the batch read last (:mod:`.progress`)."""
        if self._latest is None or self.last_read is None:
            return self._latest
        return {**self._latest, "read": self.last_read}

    def partitions(self, end_json: dict[str, Any]) -> list[ShardPartition]:
        return partitions_of(self.options, SourceOffset.from_json(end_json))

    def commit(self, end_json: dict[str, Any]) -> None:
        """Settle ``end`` (when the member is here) and clean the ledger up. Never joins: after
        an availableNow run left the group, a commit must not bring the member back (at the
        next start, the first ``latestOffset`` settles the batch instead)."""
        end = SourceOffset.from_json(end_json)
        io = self._open(end)
        if self._member is not None:
            self._settle(end)
        deleted = io.delete_before(end.batch)
        if deleted:
            log.debug("ledger: %d items of batches before %d deleted", deleted, end.batch)
        for batch in [b for b in self._ends if b < end.batch]:
            del self._ends[batch]
        self.settlement.prune(end.batch)

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
                    "never evaluates it?); those shards start there again in the next batch "
                    "(availableNow: the run ends; else at most every idle_poll_interval)",
                    offset.batch, sorted(missing),
                )  # fmt: skip
            self._ends[offset.batch] = ends
            self.last_read = read_report(offset.batch, ends)
            log_read(self.last_read)
        return ends

    def _settle(self, offset: SourceOffset) -> None:
        """Batch ``offset.batch`` is committed in Spark: write the group's checkpoints."""
        if not offset.shards or offset.batch in self.settlement.settled:
            return
        assert self._member is not None
        self._confirmed = offset
        self.settlement.settle(self._member, offset, self._ledger(offset))

    def _owned(self, member: Member, ends: dict[Key, LedgerEntry]) -> dict[Key, Owned]:
        """The shards held now, after adopting an earlier run's ends (see :mod:`.settle`).

        A shard still held although the last batch (``ends``) read it to SHARD_END was never
        finished in the group (its complete() was refused, or an earlier run died before its
        finish landed): it is finished now, or its children would wait for ever."""
        owned = {o.key: o for o in member.owned()}
        for key in sorted(owned):
            entry = ends.get(key)
            if entry is not None and entry.shard_end:
                self.settlement.keep(entry)
        return self.settlement.adopt(member, owned)

    def _next_starts(
        self, start: SourceOffset, ends: dict[Key, LedgerEntry], owned: dict[Key, Owned]
    ) -> dict[Key, Start]:
        starts: dict[Key, Start] = {}
        for key, holder in owned.items():
            entry = ends.get(key)
            if entry is not None and entry.shard_end:
                continue  # read to its end: finished (or pending a finish, see _owned)
            previous = start.shards.get(key)
            if previous is None and key in self.rotation.carried:
                previous = self.rotation.carried[key][0]  # left out of the last batch by the bound
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
                initial = initial_start(
                    holder.start, holder.lease, self.options.config.initial_position
                )
                recorded = holder.started_at_ms  # where the group's first LATEST read began
                if recorded is None:
                    starts[key] = initial
                    self._handed_over.pop(key, None)  # forgotten (a reset) since it was seen
                elif initial.at == "LATEST":
                    starts[key] = initial  # pinned from the earliest of the two (see _pin)
                    self._handed_over[key] = recorded
                else:
                    # The recorded start wins over this query's own initial position, as it
                    # does for every face of the group (``kinesumer checkpoints reset`` forgets
                    # it): a TRIM_HORIZON query would replay what the group read already, an
                    # AT_TIMESTAMP after it skip what its first reader never processed.
                    starts[key] = Start(at_timestamp_ms=recorded, lease=holder.lease)
        return starts

    def _pin(self, member: Member, starts: dict[Key, Start]) -> dict[Key, Start]:
        """LATEST starts as AT_TIMESTAMP of where reading of the shard began (:mod:`.pins`):
        a replay reads the same records, and no later LATEST open starts after the first. The
        instant is recorded in the group's checkpoint item too (fenced by the lease) before any
        batch of the shard is planned: whoever takes the shard over before a batch committed
        starts there. A shard whose record was refused (lost meanwhile) is left out."""
        now_ms = local_now_ms()
        out: dict[Key, Start] = {}
        for key, start in starts.items():
            if start.at != "LATEST":
                out[key] = start
                continue
            at = pinned(start, self.io.latest_pin(key, now_ms), self._handed_over.get(key))
            assert at.at_timestamp_ms is not None
            if member.record_start(key, start.lease, at.at_timestamp_ms):
                out[key] = at
            else:
                log.info("%s/%s moved to another member before its start was recorded", *key)
        return out

    def _reason(
        self, start: SourceOffset, ends: dict[Key, LedgerEntry], starts: dict[Key, Start]
    ) -> str | None:
        """Why a new batch is needed, or None (return ``start`` unchanged)."""
        if not starts:
            return None
        here = start.batch in self.settlement.planned_here
        target = self._target_ms
        last: dict[Key, LedgerEntry | None] = {}
        unread = False
        for key in starts:
            if key in start.shards:
                entry = ends.get(key)
                if entry is None and not here:
                    return "not read yet"  # planned by an earlier run, replayed since
                # (None, planned here: Spark ran the batch and never read its DataFrame. No
                # reason by itself, or a sink that ignores its input would loop for ever.)
                unread = unread or entry is None
            elif key in self.rotation.carried:
                entry = self.rotation.carried[key][1]
                if entry is None:
                    return "more to read"  # left out by the bound before its first read
            else:
                return "new shards"  # (shards handed off or finished need no batch of their own)
            last[key] = entry
            if entry is None or entry.caught_up:
                continue
            if target is not None and (entry.last_arrival_ms or 0) >= target:
                continue  # availableNow: past what existed when the run started
            return "more to read"
        if target is not None:
            # availableNow: every shard read to its tip. If that was found before this run
            # began (the batch was planned by an earlier run), look once for what came since;
            # else only closed shards not read to SHARD_END yet are looked at.
            if here:
                return "closed shard not drained" if self._undrained(starts, last) else None
            return "new records" if self.io.any_new(starts) else None
        now = time.monotonic()
        since = max(self._last_probe, self._last_plan if unread else 0.0)
        if now - since < self.options.idle_poll_interval:
            return None
        self._last_probe = now
        found = self.io.any_new(starts)
        log.debug("batch %d: idle; probe of %d shards found %s", start.batch, len(starts),
                  "records" if found else "nothing")  # fmt: skip
        return "new records" if found else None

    def _undrained(self, starts: dict[Key, Start], last: dict[Key, LedgerEntry | None]) -> bool:
        """availableNow: whether a closed shard, caught up but not at SHARD_END, still answers
        (records, or SHARD_END itself): its children must not wait for another run. An
        executor stops at the first empty answer once it read records, which a closed shard
        may give before it says SHARD_END."""
        tips = [k for k, e in last.items() if e is not None and e.caught_up and not e.shard_end]
        closed = self.io.closed_shards(tips) if tips else set()
        return bool(closed) and self.io.any_new({k: starts[k] for k in sorted(closed)})

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
        """The offset of batch ``start.batch + 1`` over ``starts`` (chosen, pinned, begun)."""
        if not starts:
            return None
        per_shard = self.options.max_records_per_shard
        bound = bound_of(self.options.max_records_per_trigger, max_rows)
        if bound is not None:
            per_shard = min(per_shard, max(1, bound // len(starts)))
        planned = SourceOffset(
            query=start.query,
            group=self._member_group,
            batch=start.batch + 1,
            owner=owner,
            shards=dict(starts),
            limits=dict.fromkeys(starts, per_shard),
        )
        self.settlement.planned(planned.batch, set(starts))
        self._last_plan = time.monotonic()
        return planned
