"""``foreach_batch(available_now=True)``: deciding when this member has processed what its
shards hold, from the consumer's public :meth:`~kinesumer.Kinesumer.stats` only."""

from __future__ import annotations

from datetime import datetime

from ..consumer.sync import Kinesumer
from ..models import Record

#: Coordinator ticks the drained state must survive before the run ends, so that shards about to
#: arrive (a rebalance in progress, children of a finished parent, which are claimed at the next
#: tick) are not missed.
SETTLE_TICKS = 2


class DrainWatch:
    """Decides when an ``available_now`` run may end. Called by the driver around every poll.

    A shard counts as done when its last GetRecords came back empty (``caught_up``) or when it
    delivered a record that arrived after the run started (everything older is behind it, so a
    busy stream still ends); a shard at SHARD_END (``ended``) is not done until it is finished
    and released (its children are claimed right after). The member is drained when every
    active shard is done, no claim is pending (a second driver that owns nothing *yet* waits for
    the shards coming its way), a poll brings nothing more from shards not yet past the start,
    and all of that still holds :data:`SETTLE_TICKS` coordinator ticks later, after the last
    commit.
    """

    def __init__(self, consumer: Kinesumer, started: datetime) -> None:
        self._consumer = consumer
        self._started = started
        self._passed: set[tuple[str, str]] = set()
        self._since: int | None = None
        self.candidate = False

    def before_poll(self) -> int | None:
        """The coordinator's tick count if every active shard is done and no claim is pending,
        else None.

        The tick count comes from one snapshot and the shards from a second one, taken after
        it: if the first shows tick ``n``, tick ``n - 1`` had completed, so the shards (and
        pending claims) of the second include its claims. One snapshot would not promise that
        (the engine's thread may finish a tick while the snapshot is being copied).
        """
        ticks = self._consumer.stats().coordinator_ticks
        stats = self._consumer.stats()
        if stats.claims_pending:
            return None
        passed = self._passed
        for shard in stats.shards:
            if shard.status != "active":
                continue  # moving away or lost: another member reads the rest
            if shard.ended or not (shard.caught_up or (shard.stream, shard.shard_id) in passed):
                return None
        return ticks

    def after_poll(self, ticks: int | None, got: list[Record]) -> bool:
        """True once the member is drained (and stayed so, see the class)."""
        passed = self._passed
        fresh = any((r.stream, r.shard_id) not in passed for r in got)
        started = self._started
        for record in got:
            arrived = record.approximate_arrival_timestamp
            if arrived is not None and arrived >= started:
                passed.add((record.stream, record.shard_id))
        self.candidate = ticks is not None and not fresh
        if ticks is None or fresh:
            self._since = None
            return False
        if self._since is None:
            self._since = ticks
            return False
        return ticks >= self._since + SETTLE_TICKS

    def reset(self) -> None:
        """After a commit: shards may finish now (and their children follow); start over."""
        self._since = None
