"""The member's side of the operator controls and the load weights.

:class:`GroupControls` is called by the coordinator's tick:

1. :meth:`~GroupControls.refresh`: write this member's load report when due (its first tick,
   then every ``REANNOUNCE`` s; weighted mode: every ``shard_sync_interval``, with its rates);
   read the ``controls#<app>`` item and the leader's publication (``weights#<app>``) in one
   eventually consistent BatchGetItem once per time slot of ``READ_EVERY`` seconds (or
   ``heartbeat_interval`` if longer). Slots are aligned on the wall clock, so every member reads
   within about one tick of the others: a control takes effect within one slot plus one tick, and
   members disagree about it for at most about one tick (as during any rebalance: a claim of a
   shard its owner has not handed off yet is refused and retried).
2. :meth:`~GroupControls.effective`: pins and step-downs apply only while a fresh publication
   names no live member as legacy (a version that ignores the controls: see leader duties);
   otherwise every new member ignores them too, as the old ones do, so they never fight.
3. :meth:`~GroupControls.leads`: the leader is index 0 of the live ids not stepped down
   (:mod:`kinesumer.core.controls`). While members disagree (one saw a step-down, another not
   yet), two members may act as leader for a tick: the leader's duties are safe twice (the shard
   cache write is conditional on its digest, a prune on the ``last_update`` read, the
   publication is the same aggregate of the same reports). The membership view (membership.py)
   stays with the lowest live id: a step-down moves the shard syncs, prunes and publications.
4. :meth:`~GroupControls.split`: pinned shards and drained members leave the automatic assignment;
   pins to dead members fall back (logged once per pin).
5. :meth:`~GroupControls.leader_duties`, every ``shard_sync_interval``: read the load reports,
   publish the quantized weights and the live members that wrote none (legacy).

Cost per member: one eventually consistent BatchGetItem of two small items per slot (6 calls
and 6 read units a minute at the default 10 s), one small write every 300 s (weighted mode:
every ``shard_sync_interval``); the leader adds one Query of the reports and one write per
``shard_sync_interval``. Flat in the size of the group, but for the leader's Query.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..aws import RequestStats
from ..config import Config
from ..core.controls import Controls, SplitInputs, StepDown, controlled_is_leader, split_pins
from ..core.liveness import Observer
from ..core.weighted import Weights, quantize
from ..models import ClientInfo
from ..observability.metrics import Metrics
from ..statestore.dynamodb.codecs import readable_clients
from ..statestore.dynamodb.controls import ControlsTable, Publication
from ..statestore.dynamodb.table import StateTable

log = logging.getLogger("kinesumer.coordinator")

#: Seconds between two reads of the controls (at least ``heartbeat_interval``).
READ_EVERY = 10.0

#: Seconds between two load reports of a member outside weighted mode (they say "this member
#: applies the controls"; weighted mode reports every ``shard_sync_interval``).
REANNOUNCE = 300.0

#: A comma-separated list of client ids that behave as a version without operator controls (for
#: the mixed-version tests).
LEGACY_ENV = "KINESUMER_LEGACY_CONTROLS"


class LoadMeter(Metrics):
    """The engine's metrics, forwarded unchanged, plus the bytes delivered per shard (the
    cheapest place that sees every delivered batch: one call per batch)."""

    def __init__(self, inner: Metrics) -> None:
        self.inner = inner
        self.times_handlers = inner.times_handlers
        self.bytes: dict[tuple[str, str], int] = {}
        #: Monotonic time each shard first delivered in the current window.
        self.since: dict[tuple[str, str], float] = {}
        self._window_start = time.monotonic()
        self._previous: set[tuple[str, str]] = set()  # shards that delivered last window

    def take(self) -> dict[tuple[str, str], float]:
        """Bytes per second per shard over the window since the last call, and start a new
        window. A shard that delivered in the last window too counts from the window's start;
        a new one (just claimed) from its first batch, so a takeover is not measured low."""
        now = time.monotonic()
        rates = {}
        for key, nbytes in self.bytes.items():
            start = self._window_start if key in self._previous else self.since[key]
            rates[key] = nbytes / max(now - start, 1.0)
        self._previous = set(self.bytes)
        self.bytes = {}
        self.since = {}
        self._window_start = now
        return rates

    def delivered(self, stream: str, shard_id: str, records: int, nbytes: int) -> None:
        key = (stream, shard_id)
        self.since.setdefault(key, time.monotonic())
        self.bytes[key] = self.bytes.get(key, 0) + nbytes
        self.inner.delivered(stream, shard_id, records, nbytes)

    def behind(self, stream: str, shard_id: str, millis: int | None) -> None:
        self.inner.behind(stream, shard_id, millis)

    def shard_dropped(self, stream: str, shard_id: str) -> None:
        self.inner.shard_dropped(stream, shard_id)

    def aws_call(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        self.inner.aws_call(service, operation, seconds, error, capacity)

    def throttled(self, service: str, operation: str) -> None:
        self.inner.throttled(service, operation)

    def checkpoint(self, stream: str, conflict: bool) -> None:
        self.inner.checkpoint(stream, conflict)

    def membership(self, owned: int, leader: bool) -> None:
        self.inner.membership(owned, leader)

    def rebalanced(self) -> None:
        self.inner.rebalanced()

    def handoff(self, seconds: float) -> None:
        self.inner.handoff(seconds)

    def handled(self, handler: str, outcome: str, records: int) -> None:
        self.inner.handled(handler, outcome, records)

    def handler_call(self, handler: str, seconds: float) -> None:
        self.inner.handler_call(handler, seconds)

    def efo_subscribed(self, stream: str, shard_id: str) -> None:
        self.inner.efo_subscribed(stream, shard_id)

    def efo_subscribe_failed(self, stream: str, error: str) -> None:
        self.inner.efo_subscribe_failed(stream, error)

    def efo_stalled(self, stream: str, shard_id: str) -> None:
        self.inner.efo_stalled(stream, shard_id)

    def unaggregated(self, stream: str, shard_id: str) -> None:
        self.inner.unaggregated(stream, shard_id)

    def corrupt_state_item(self, kind: str) -> None:
        self.inner.corrupt_state_item(kind)

    def produce_buffer_changed(self, records: int, nbytes: int) -> None:
        self.inner.produce_buffer_changed(records, nbytes)

    def close(self) -> None:
        self.inner.close()


def metered(config: Config, metrics: Metrics) -> Metrics:
    """The metrics a member reports to: wrapped in a :class:`LoadMeter` in weighted mode."""
    return LoadMeter(metrics) if config.assignment == "weighted" else metrics


class GroupControls:
    """What the operator and the leader published, as this member last read it."""

    def __init__(
        self, table: ControlsTable, client_id: str, config: Config, meter: Metrics
    ) -> None:
        self._table = table
        self.client_id = client_id
        self._config = config
        self._meter = meter if isinstance(meter, LoadMeter) else None
        self._every = max(READ_EVERY, config.heartbeat_interval)
        self._slot: int | None = None
        #: The controls as stored (see :meth:`effective` for those applied now).
        self.controls = Controls()
        self.publication = Publication()
        self._rebalance_seen: int | None = None
        #: A forced rebalance was seen and the inputs did not change since: sticky mode lays the
        #: shards out as if nobody owned any (every member alike: see the coordinator).
        self.fresh_layout = False
        self._fallen: set[tuple[str, str, str]] = set()
        self._next_report = float("-inf")
        self._suspended_for: frozenset[str] | None = None
        # No stamp written by another host is compared with our clock: the publication is
        # fresh while its token changed recently (on our monotonic clock), a step-down lasts
        # its length from when we first read it, a load report or a client item is judged by
        # whether it changed (core/liveness.py).
        fresh = config.shard_sync_interval * 3 + config.client_timeout + self._every
        self._publications = Observer(fresh)
        reporting = REANNOUNCE if self._meter is None else config.shard_sync_interval
        self._reports = Observer(reporting * 2 + config.shard_sync_interval + config.client_timeout)
        self._clients = Observer(config.client_timeout)
        #: Each step-down as stored -> the moment (our monotonic clock) it ends.
        self._step_ends: dict[tuple[str, StepDown], float] = {}
        self._read_before = False

    @classmethod
    def for_member(
        cls, dynamodb: Any, config: Config, client_id: str, stats: RequestStats, meter: Metrics
    ) -> GroupControls | None:
        """The member's controls; None for a client id that :data:`LEGACY_ENV` makes behave as
        a version without controls (the mixed-version tests)."""
        if client_id in os.environ.get(LEGACY_ENV, "").split(","):
            return None
        table = StateTable(dynamodb, config.dynamodb_table, stats)
        return cls(ControlsTable(table, config.app), client_id, config, meter)

    @property
    def weights(self) -> Weights:
        return self.publication.weights

    async def refresh(self, owned: set[tuple[str, str]]) -> bool:
        """Read the controls and the publication if this time slot's read is not done yet; write
        this member's load report when due. True when a forced rebalance (a new ``rebalance``
        counter) was seen by this read."""
        await self._report_load(owned)
        slot = int(time.time() // self._every)
        if slot == self._slot:
            return False
        controls, self.publication = await self._table.read_shared()
        seen = time.monotonic()
        stamp = self.publication.updated_ms
        self._publications.observe({"": stamp} if stamp else {}, seen, complete=True)
        self._time_step_downs(controls, seen)
        self._slot = slot
        if controls.version != self.controls.version:
            log.info(
                "[%s] controls v%d: %d pin(s), %d step-down(s)",
                self.client_id,
                controls.version,
                len(controls.pins),
                len(controls.step_downs),
            )
        self.controls = controls
        forced = self._rebalance_seen is not None and controls.rebalance != self._rebalance_seen
        self._rebalance_seen = controls.rebalance
        if forced:
            log.info("[%s] forced rebalance #%d", self.client_id, controls.rebalance)
            self.fresh_layout = True
        return forced

    def _time_step_downs(self, controls: Controls, seen: float) -> None:
        """Start counting each step-down read for the first time: it ends its length after
        ``seen``, on our clock. On our first read (we just joined: others may have counted
        for a while) a step-down the leader published as in force ends when it said, if sooner.
        A step-down written by an older command line has no length: the operator's ``until``
        less the item's stamp (both the operator's clock) stands for it."""
        ends: dict[tuple[str, StepDown], float] = {}
        left = self.publication.step_downs_left
        for client, step in controls.step_downs.items():
            key = (client, step)
            if key in self._step_ends:
                ends[key] = self._step_ends[key]
                continue
            length_ms = step.for_ms or max(0, step.until_ms - controls.updated_ms)
            if not self._read_before and client in left:
                length_ms = min(length_ms, left[client])
            ends[key] = seen + length_ms / 1000
        self._step_ends = ends
        self._read_before = True

    def _local(self, controls: Controls) -> Controls:
        """``controls`` with each step-down's end on our monotonic clock (in ms), to be applied
        with :func:`local_now_ms`: the pure functions compare only within our own clock."""
        steps = {
            client: StepDown(int(self._step_ends.get((client, s), 0.0) * 1000), s.drain, s.for_ms)
            for client, s in controls.step_downs.items()
        }
        return Controls(controls.version, controls.pins, steps, controls.rebalance)

    def step_downs_left(self) -> dict[str, int]:
        """Milliseconds each step-down in force has left, by our count."""
        now = time.monotonic()
        return {
            client: int((end - now) * 1000)
            for (client, _), end in sorted(self._step_ends.items())
            if end > now
        }

    def effective(self, live_ids: list[str]) -> Controls:
        """The controls to apply now, step-downs timed on our clock (:meth:`_local`): none
        (pins and step-downs suspended) unless a fresh publication (its stamp changed within
        the freshness window, on our clock) names no live member as legacy. Older members
        ignore the controls; applying them beside one would split the shards two ways (some
        read twice, some by nobody)."""
        published = self._publications.token("") is not None
        stale = not published or self._publications.is_dead("", time.monotonic())
        legacy = frozenset(self.publication.legacy & set(live_ids))
        if not (stale or legacy):
            self._suspended_for = None
            return self._local(self.controls)
        if (self.controls.pins or self.controls.step_downs) and self._suspended_for != legacy:
            self._suspended_for = legacy
            log.warning(
                "[%s] pins and step-downs suspended: %s",
                self.client_id,
                f"members {', '.join(sorted(legacy))} run a version without operator controls"
                if legacy
                else "no leader of this version has published lately",
            )
        return Controls(self.controls.version, rebalance=self.controls.rebalance)

    def leads(self, live_ids: list[str]) -> bool:
        """Whether this member leads, step-downs applied."""
        controls = self.effective(live_ids)
        return controlled_is_leader(self.client_id, live_ids, controls, local_now_ms())

    def split(
        self,
        members: dict[str, frozenset[str]],
        shards: dict[str, list[str]],
        key: Callable[[str], str] = str,
    ) -> SplitInputs:
        """Pins and drains applied to the assignment's inputs; fallen-back pins logged once.
        ``key``: the state key of a stream (:func:`kinesumer.accounts.state_key`): the inputs
        are keyed so, and so are the pins here (an operator may pin ``orders`` or its home
        ARN: one stream)."""
        controls = self.effective(sorted(members))
        if key is not str and controls.pins:
            pins = {(key(stream), shard): to for (stream, shard), to in controls.pins.items()}
            controls = replace(controls, pins=pins)
        split = split_pins(members, shards, controls, local_now_ms())
        for stream, shard_id, target in sorted(set(split.fallen_back) - self._fallen):
            log.warning(
                "[%s] %s/%s is pinned to %s, which is not a live member consuming %s: it is "
                "assigned automatically until %s is back",
                self.client_id,
                stream,
                shard_id,
                target,
                stream,
                target,
            )
        self._fallen = set(split.fallen_back)
        return split

    async def stale_members(self, client_timeout: float) -> list[ClientInfo]:
        """Members judged dead from the client items (strongly consistent; each one's token
        unchanged for ``client_timeout`` since we first saw it, as in membership.py): for a
        leader by step-down, whose membership follows the view the lowest id publishes and so
        learns of no dead member to prune. Once per ``shard_sync_interval``: a member first
        seen by one call is judged by a later one."""
        started = time.monotonic()
        # Unreadable client items are skipped (membership logs and counts them).
        clients, _ = readable_clients(await self._table.client_items())
        observer = self._clients
        observer.timeout = client_timeout
        observer.observe({c.client_id: c.token for c in clients}, time.monotonic(), complete=True)
        dead = [c for c in clients if observer.is_dead(c.client_id, started)]
        return sorted(dead, key=lambda c: c.client_id)

    async def _report_load(self, owned: set[tuple[str, str]]) -> None:
        """Write this member's load report: at the first tick, then every ``REANNOUNCE`` seconds
        (weighted mode: every ``shard_sync_interval``, with the measured rates)."""
        if time.monotonic() < self._next_report:
            return
        config = self._config
        every = REANNOUNCE if self._meter is None else config.shard_sync_interval
        self._next_report = time.monotonic() + every
        rates: dict[str, dict[str, float]] = {}
        if self._meter is not None:  # every shard we own, idle ones at 0
            measured = self._meter.take()
            for stream, shard_id in sorted(owned):
                rate = measured.get((stream, shard_id), 0.0)
                rates.setdefault(stream, {})[shard_id] = round(rate, 1)
        ttl = int(every * 3 + config.client_timeout) + 60
        await self._table.report_load(self.client_id, rates, ttl)

    async def leader_duties(self, live_ids: list[str]) -> None:
        """Leader, every ``shard_sync_interval``: publish which live members wrote no load report
        and the quantized weights of the fresh reports (for each shard, the newest report that has
        it), and the step-downs in force with the time each has left (by our count). A member that
        just joined writes its report at its first tick, a few milliseconds after its first
        heartbeat: a read in between suspends the controls until the next publication (rare, and
        safe); waiting for a second read instead would let a
        new and an old member fight for a whole ``shard_sync_interval``."""
        started = time.monotonic()
        loads = await self._table.read_loads()
        # Fresh while its stamp changed recently, on our clock (a member rewrites its report
        # every REANNOUNCE s, or every shard_sync_interval in weighted mode).
        self._reports.observe({c: r[0] for c, r in loads.items()}, time.monotonic(), complete=True)
        reports = {c: r for c, r in loads.items() if not self._reports.is_dead(c, started)}
        legacy = frozenset(set(live_ids) - set(reports))
        # The newest report of a shard is the one whose change we saw last (stamps of two
        # members are two clocks: never compared).
        newest: dict[tuple[str, str], tuple[float, float]] = {}
        for cid, (_, rates) in sorted(reports.items()):
            age = self._reports.unchanged_for(cid, started)
            for stream, by_shard in rates.items():
                for shard_id, rate in by_shard.items():
                    key = (stream, shard_id)
                    if key not in newest or age < newest[key][0]:
                        newest[key] = (age, rate)
        weights: dict[str, dict[str, float]] = {}
        for (stream, shard_id), (_, rate) in sorted(newest.items()):
            weights.setdefault(stream, {})[shard_id] = quantize(rate)
        if weights != self.publication.weights or legacy != self.publication.legacy:
            log.info(
                "[%s] publishing weights of %d shard(s); legacy members: %s",
                self.client_id,
                len(newest),
                ", ".join(sorted(legacy)) or "none",
            )
        await self._table.publish(Publication(weights, legacy, 0, self.step_downs_left()))


def local_now_ms() -> int:
    """Now on this member's monotonic clock, in ms: the frame of :meth:`GroupControls._local`."""
    return int(time.monotonic() * 1000)
