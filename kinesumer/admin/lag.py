"""The group's lag read from the streams themselves, so it is there with no member running
(:func:`group_lag`, :class:`LagProbe`): per shard the age of the oldest record not yet
checkpointed, by Kinesis's clock (:mod:`kinesumer.kinesis.lag_probe`, rules in
:mod:`kinesumer.core.lag`). Read-only; its reads count against the per-shard read limits every
reader of the stream shares.

And the group's live members as a tool reading the table judges them (:func:`live_members`):
the lag's owner column, and the members ``kinesumer lag --serve`` shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from ..aws import RequestStats
from ..aws.clients import AwsClients
from ..config import Config
from ..core import live_clients
from ..core.lag import GroupLag, ShardLag, probe_start, settled_lag
from ..errors import ConfigError, StreamNotFoundError
from ..kinesis.lag_probe import MAX_PAGES, probe_shard
from ..kinesis.places import AccountPlaces, home_of
from ..kinesis.reader import KinesisReader
from ..kinesis.routing import routing_over
from ..kinesis.transport import KinesisTransport
from ..models import ClientInfo, Position, Shard
from ..statestore.group_view import ShardView, TableReads, open_table
from .shards import PROBE_CONCURRENCY, stream_views

#: Seconds a :class:`LagProbe` hands out its last figure before probing again.
DEFAULT_LAG_INTERVAL = 10.0

log = logging.getLogger("kinesumer.admin")


def group_lag(
    config: Config,
    streams: Sequence[str] | None = None,
    *,
    max_pages: int = MAX_PAGES,
) -> GroupLag:
    """How far behind ``config.app``'s group is on ``streams`` (default: every stream it has a
    shard cache for or a live member consumes), read from the streams and the state table:
    it needs no member running, and writes nothing.

    Per shard, the age (ms) of its oldest record not yet checkpointed, by Kinesis's clock (0
    when there is none, and for a closed parent that is ``finished``), with its live owner and
    checkpoint; per stream and for the group, the maximum. Each probe costs, per shard not
    finished, 1 ListShards per stream, 1 GetShardIterator and usually 1 GetRecords (at most
    ``max_pages``): call it no more often than a few times a minute, or use a
    :class:`LagProbe`, which keeps its last figure for a while.

    Blocking (it runs its own event loop): from a coroutine, await :func:`probe_group_lag`.
    Raises :class:`~kinesumer.errors.StateTableNotFoundError`,
    :class:`~kinesumer.errors.AccessDeniedError`, and
    :class:`~kinesumer.errors.StreamNotFoundError` for a named stream Kinesis does not know.
    """
    return asyncio.run(probe_group_lag(config, streams, max_pages=max_pages))


async def probe_group_lag(
    config: Config,
    streams: Sequence[str] | None = None,
    *,
    kinesis: KinesisTransport | None = None,
    state: TableReads | None = None,
    max_pages: int = MAX_PAGES,
) -> GroupLag:
    """:func:`group_lag` for a coroutine. ``kinesis``: a Kinesis transport to read through
    (``kinesumer.testing.MemoryKinesis`` in a test; default: AWS as ``config`` says);
    ``state``: the state table to read (``kinesumer.testing.MemoryState``; default: the
    DynamoDB table ``config`` names)."""
    if isinstance(streams, str):
        raise ConfigError("streams", f"must be a list of stream names, got the string {streams!r}")
    async with contextlib.AsyncExitStack() as stack:
        store: TableReads
        if state is None:
            _, store = await stack.enter_async_context(open_table(config))
        else:
            store = state
        places = None
        if kinesis is None:  # stream ARNs of other accounts and regions too
            aws = AwsClients(config, RequestStats())
            stack.push_async_callback(aws.close)
            await aws.open(dynamodb=False)
            places = AccountPlaces(config, aws, home_of(config))
            kinesis = routing_over(aws, places)
        reader = KinesisReader(kinesis, RequestStats(), config.effective_kinesis_region)
        live = await live_members(store, config.client_timeout)
        names = list(streams or ())
        if not names:
            found = set(await store.cached_streams())
            for member in live.values():
                found |= member.streams
            names = sorted(found)
        if places is not None:  # as the table keeps them: a home ARN is its plain name
            names = await places.state_keys(names)
        limit = asyncio.Semaphore(PROBE_CONCURRENCY)
        rows: list[ShardLag] = []
        probed: list[str] = []
        for stream in names:
            try:
                listed = await reader.list_shards(stream)
            except StreamNotFoundError:
                if streams:
                    raise
                log.warning("stream %s of app %s no longer exists: left out", stream, config.app)
                continue
            probed.append(stream)
            views = await stream_views(store, stream, live, listed)
            rows += await asyncio.gather(
                *(_shard_lag(reader, view, listed, limit, max_pages) for view in views)
            )
        return GroupLag.of(config.app, config.dynamodb_table, rows, probed)


class LagProbe:
    """A group's lag (:func:`probe_group_lag`) measured at most once per ``min_interval``
    seconds: what a service asked for the figure by many scrapers uses, so that its reads
    (per shard 1 GetShardIterator and usually 1 GetRecords each probe) stay a small share of
    the 5 GetRecords a second per shard every reader of the stream shares. Within the interval
    (this host's monotonic clock) the last figure is handed out again; callers that ask while
    a probe runs wait for that probe. A failed probe is not kept: the next call probes again.
    """

    def __init__(
        self,
        config: Config,
        streams: Sequence[str] | None = None,
        *,
        min_interval: float = DEFAULT_LAG_INTERVAL,
        kinesis: KinesisTransport | None = None,
        state: TableReads | None = None,
        max_pages: int = MAX_PAGES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(min_interval, bool) or not 0 <= min_interval < float("inf"):
            raise ConfigError("min_interval", f"must be seconds >= 0, got {min_interval!r}")
        self.config = config
        self.streams = tuple(streams or ())
        self.min_interval = min_interval
        self.max_pages = max_pages
        self._kinesis = kinesis
        self._state = state
        self._clock = clock
        self._last: tuple[float, GroupLag] | None = None
        self._lock: asyncio.Lock | None = None
        #: Probes made (not answered from the cache): for tests and a service's metrics.
        self.probes = 0

    async def measure(self) -> GroupLag:
        """The group's lag, probed now unless the last probe is younger than
        ``min_interval``."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._last is not None and self._clock() - self._last[0] < self.min_interval:
                return self._last[1]
            began = self._clock()
            figure = await probe_group_lag(
                self.config,
                self.streams,
                kinesis=self._kinesis,
                state=self._state,
                max_pages=self.max_pages,
            )
            self.probes += 1
            self._last = (began, figure)
            return figure


async def live_members(
    store: TableReads, fallback_timeout: float, clients: Sequence[ClientInfo] | None = None
) -> dict[str, ClientInfo]:
    """The live members, by id, as the lag's owner column and ``kinesumer lag --serve`` show
    them: heartbeat stamps within the group's ``client_timeout`` (the one its leader publishes;
    else ``fallback_timeout``) of this host's clock, less those the leader's published view
    judged dead with the heartbeat they still show. ``clients``: the client items as already
    read (default: read them). For display only: the lag itself uses no member's stamp, and
    members judge each other by change on their own clocks (:mod:`kinesumer.core.liveness`)."""
    if clients is None:
        clients = await store.list_clients()
    head = await store.read_view_head(consistent=False)
    timeout_ms = head.timeout_ms if head is not None and head.timeout_ms else None
    if timeout_ms is None:
        timeout_ms = int(fallback_timeout * 1000)
    listed = None
    if head is not None and head.members_key:
        listed = await store.read_view_members(head.members_key)
    judged_dead = listed.dead if listed is not None else {}
    live = live_clients(clients, int(time.time() * 1000), timeout_ms)
    return {c.client_id: c for c in live if judged_dead.get(c.client_id) != c.token}


async def _shard_lag(
    reader: KinesisReader,
    view: ShardView,
    listed: list[Shard],
    limit: asyncio.Semaphore,
    max_pages: int,
) -> ShardLag:
    """One shard's row: probed, unless it is finished (no lag, no reads) or Kinesis no
    longer lists it (aged out past retention: nothing of it is left to read)."""
    checkpoint = view.checkpoint
    millis = 0
    if not view.finished and any(s.shard_id == view.shard_id for s in listed):
        position = None
        if checkpoint is not None and checkpoint.sequence_number:
            position = Position(checkpoint.sequence_number, checkpoint.sub_sequence_number)
        start = probe_start(position, view.started_at_ms, view.spark_pin_ms)
        async with limit:
            probe = await probe_shard(
                reader, view.stream, view.shard_id, start, max_pages=max_pages
            )
        millis = probe.millis_behind
    return ShardLag(
        stream=view.stream,
        shard_id=view.shard_id,
        owner=view.owner if view.owner_live else None,
        checkpoint=view.position,
        millis_behind=settled_lag(view.finished, millis),
        finished=view.finished,
    )
