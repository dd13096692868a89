"""The operator's calls on the state table: creating it, for local work and tests (production
provisions it with Terraform from ``infra/``, and the consumer never needs create-table rights),
and the group's operator controls (pins, step-downs, forced rebalances).

The controls are one item per app (:mod:`kinesumer.statestore.dynamodb.controls`), changed by a
read-modify-write conditional on the version read: a change that races another one is read
again and retried, never lost. Members read the item every ``max(10 s, heartbeat_interval)``, in
time slots aligned on the wall clock, so a control takes effect everywhere within about one slot
and one tick. Members of a version without controls ignore them: while one is live, the others
suspend pins and step-downs too (:mod:`kinesumer.group.controls`).

And the group's lag read from the streams themselves, so it is there with no member running
(:func:`group_lag`, :class:`LagProbe`): per shard the age of the oldest record not yet
checkpointed, by Kinesis's clock (:mod:`kinesumer.kinesis.lag_probe`, rules in
:mod:`kinesumer.core.lag`). Read-only; its reads count against the per-shard read limits every
reader of the stream shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NoReturn

from botocore.exceptions import ClientError

from ..aws import ClientFactory, RequestStats, error_code
from ..aws.clients import AwsClients, default_region
from ..config import Config
from ..core import live_clients
from ..core.controls import Controls, StepDown
from ..core.lag import GroupLag, ShardLag, probe_start, settled_lag
from ..core.rewind import LATEST, TRIM_HORIZON, RewindTarget, ShardRewind, lineage_order, time_target
from ..errors import (
    AccessDeniedError,
    ConfigError,
    RewindConflictError,
    StateStoreError,
    StateTableNotFoundError,
    StateTableSchemaError,
    StreamNotFoundError,
)
from ..group.shard_sync import ShardSync
from ..kinesis.dynamodb_streams import stamp_floor_ms
from ..kinesis.efo.consumers import deregister_stream_consumer
from ..kinesis.lag_probe import MAX_PAGES, probe_shard
from ..kinesis.places import AccountPlaces, home_of
from ..kinesis.reader import KinesisReader
from ..kinesis.rewind_probe import has_record_since, instant_of, kinesis_now_ms, last_record
from ..kinesis.routing import routing_over
from ..kinesis.tool_transport import open_tool_transport
from ..kinesis.transport import KinesisTransport
from ..models import ClientInfo, Position, Shard
from ..statestore.dynamodb.controls import (
    controls_condition,
    controls_item,
    controls_key,
    decode_controls,
)
from ..statestore.dynamodb.store import DynamoDBStateStore
from ..statestore.group_view import (
    ShardView,
    TableReads,
    iso_time,
    open_table,
    stream_shards,
)
from ..statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from ..stream_refs import check_stream, is_dynamodb_stream

#: Read-modify-write attempts of a controls change racing other changes.
CONTROLS_ATTEMPTS = 10

#: Milliseconds past its end (by the writing host's clock) after which a step-down is dropped
#: from the controls item: far beyond any clock skew between operators' hosts.
STEP_DOWN_GC_MS = 3_600_000

log = logging.getLogger("kinesumer.admin")


def create_state_table(config: Config, *, wait: bool = True) -> bool:
    """Create ``config.dynamodb_table`` (on-demand, TTL on ``expires_at``) if it does not exist.

    Idempotent: an existing table with the right keys is left as it is and False is returned; an
    existing table with other keys raises :class:`StateTableSchemaError`.
    """
    client = ClientFactory(config).sync_dynamodb()
    name = config.dynamodb_table
    try:
        client.create_table(
            TableName=name,
            KeySchema=[
                {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
                {"AttributeName": SORT_KEY, "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        created = True
    except ClientError as exc:
        code = error_code(exc)
        if code == "AccessDeniedException":
            raise AccessDeniedError(f"AWS denied dynamodb:CreateTable on {name!r}: {exc}") from exc
        if code != "ResourceInUseException":
            raise
        created = False
    if wait:
        client.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
    table = client.describe_table(TableName=name)["Table"]
    keys = {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]}
    if keys != {PARTITION_KEY: "HASH", SORT_KEY: "RANGE"}:
        raise StateTableSchemaError(
            f"table {name!r} exists with keys {keys}; kinesumer needs {PARTITION_KEY} (HASH) and "
            f"{SORT_KEY} (RANGE): pick another dynamodb_table"
        )
    if created:
        try:
            client.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
        except ClientError as exc:  # dynalite has no TTL API; the table works without it
            log.info("could not enable TTL on %s (%s); dead client items stay", name, exc)
        log.info("created state table %s", name)
    return created


# -- operator controls ------------------------------------------------------------------------
def read_controls(config: Config) -> Controls:
    """The app's controls as stored (strongly consistent); version 0 when none were set."""
    client = ClientFactory(config).sync_dynamodb()
    item = _call(
        config,
        "GetItem",
        lambda: client.get_item(
            TableName=config.dynamodb_table, Key=controls_key(config.app), ConsistentRead=True
        ),
    )
    return decode_controls(item.get("Item"))


def update_controls(config: Config, change: Callable[[Controls], Controls]) -> Controls:
    """Apply ``change`` to the stored controls and write the result, conditional on the version
    read; a refused condition (another change landed in between) reads again and retries.
    Returns the controls as written. Raises :class:`StateStoreError` after
    ``CONTROLS_ATTEMPTS`` refusals in a row."""
    client = ClientFactory(config).sync_dynamodb()
    for _ in range(CONTROLS_ATTEMPTS):
        current = read_controls(config)
        wanted = change(current)
        try:
            client.put_item(
                TableName=config.dynamodb_table,
                Item=controls_item(config.app, wanted),
                **controls_condition(current.version),
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                log.info("controls of %s changed meanwhile; reading them again", config.app)
                continue
            _raise_named(config, "PutItem", exc)
        return replace(wanted, version=current.version + 1)
    raise StateStoreError(
        f"the controls of app {config.app!r} kept changing under {CONTROLS_ATTEMPTS} attempts"
    )


def pin_shard(config: Config, stream: str, shard_id: str, client_id: str) -> Controls:
    """Pin ``stream``/``shard_id`` to member ``client_id``: it leaves the automatic assignment
    and that member reads it while it is live and consumes ``stream``; otherwise the pin falls
    back to the automatic assignment (the members log it) until the member is back."""
    check_stream(stream)  # a name, or a stream ARN (whose '/'s the pins' keys allow)
    for name, value in (("shard_id", shard_id), ("client_id", client_id)):
        if not isinstance(value, str) or not value or "/" in value:
            raise ConfigError(name, f"must be a non-empty name without '/', got {value!r}")
    return update_controls(
        config, lambda c: replace(c, pins={**c.pins, (stream, shard_id): client_id})
    )


def unpin_shard(config: Config, stream: str, shard_id: str) -> Controls:
    """Remove the pin of ``stream``/``shard_id`` (none: nothing changes but the version)."""
    return update_controls(
        config,
        lambda c: replace(c, pins={k: v for k, v in c.pins.items() if k != (stream, shard_id)}),
    )


def list_pins(config: Config) -> dict[tuple[str, str], str]:
    """Every pin: (stream, shard id) -> client id."""
    return dict(sorted(read_controls(config).pins.items()))


def step_down(config: Config, client_id: str, seconds: float, *, drain: bool = False) -> Controls:
    """Make member ``client_id`` step down for ``seconds``: it does not lead (the next live id
    does), and with ``drain`` it also gives up its automatically assigned shards (not those
    pinned to it). It keeps heartbeating. ``seconds=0`` cancels a step-down."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 <= seconds < float("inf")
    ):
        raise ConfigError("seconds", f"must be a finite number of seconds >= 0, got {seconds!r}")
    until = int(time.time() * 1000 + seconds * 1000)

    def change(c: Controls) -> Controls:
        # Others' step-downs are dropped only long past their end by this host's clock, so
        # that a clock behind the one that wrote them never cuts one short (members judge
        # each by its length, on their own clocks: core/controls.py).
        gone = int(time.time() * 1000) - STEP_DOWN_GC_MS
        steps = {k: s for k, s in c.step_downs.items() if s.active(gone) and k != client_id}
        if seconds > 0:
            steps[client_id] = StepDown(until, drain, int(seconds * 1000))
        return replace(c, step_downs=steps)

    return update_controls(config, change)


def force_rebalance(config: Config) -> Controls:
    """Make every member assign afresh: re-read the members, owners and shard lists, drop
    pending claims, and in ``sticky`` mode lay the shards out as if nobody owned any."""
    return update_controls(config, lambda c: replace(c, rebalance=c.rebalance + 1))


# -- the group's lag ---------------------------------------------------------------------------
#: Seconds a :class:`LagProbe` hands out its last figure before probing again.
DEFAULT_LAG_INTERVAL = 10.0

#: Shards probed at once (each probe is a few sequential calls).
PROBE_CONCURRENCY = 8


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
        if kinesis is None:  # stream ARNs of other accounts and regions too (issue 36)
            aws = AwsClients(config, RequestStats())
            stack.push_async_callback(aws.close)
            await aws.open(dynamodb=False)
            places = AccountPlaces(config, aws, home_of(config))
            kinesis = routing_over(aws, places)
        reader = KinesisReader(kinesis, RequestStats(), config.effective_kinesis_region)
        live = await _live_members(store, config.client_timeout)
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
            views = await _stream_views(store, stream, live, listed)
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


async def _live_members(store: TableReads, fallback_timeout: float) -> dict[str, ClientInfo]:
    """The live members, as ``kinesumer status`` shows them: heartbeat stamps within the
    group's ``client_timeout`` (the one its leader publishes; else ``fallback_timeout``) of
    this host's clock, less those the leader's published view judged dead with the heartbeat
    they still show. For display only (the owner column); the lag itself uses no member's
    stamp."""
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


async def _stream_views(
    store: TableReads,
    stream: str,
    live: dict[str, ClientInfo],
    listed: list[Shard],
    known: Sequence[ShardView] | None = None,
) -> list[ShardView]:
    """The table's view of ``stream``'s shards (:func:`stream_shards`; ``known``: as read
    already), with the shards Kinesis lists that the table does not know yet, and Kinesis's
    lineage (the shard cache may be a sync behind)."""
    if known is None:
        known = await stream_shards(store, stream, live)
    views = {view.shard_id: view for view in known}
    for shard in listed:
        view = views.get(shard.shard_id)
        if view is None:
            views[shard.shard_id] = ShardView(stream, shard, None, False, None)
        else:
            views[shard.shard_id] = replace(view, shard=shard)
    return [views[shard_id] for shard_id in sorted(views)]


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


# -- rewinding a group to a time --------------------------------------------------------------
#: Attempts to move one shard whose item keeps changing under the rewind (a claim or a
#: checkpoint between its read and the conditional write), each after reading it again.
REWIND_ATTEMPTS = 5

#: Attempts to write the stream's shard cache with the rewind's ``finished`` flags (each
#: conditional on the cache read; a leader's sync writing meanwhile makes it list again).
CACHE_ATTEMPTS = 3

#: Seconds an instant may lie past Kinesis's ``Date`` before it counts as in the future: the
#: header counts whole seconds, and some servers reuse it for a second.
FUTURE_SLACK_MS = 2_000


@dataclass(frozen=True)
class RewindResult:
    """What a rewind moved (or, with ``dry_run``, would move).

    ``to`` says where to (an ISO time, ``trim-horizon`` or ``latest``); ``instant_ms`` is the
    instant of a time rewind (epoch ms, Kinesis's clock), None otherwise. ``shards``: every
    shard of the stream's lineage in the order the moves are written (ancestors first), each
    with its item as read and its target (:class:`~kinesumer.core.rewind.ShardRewind`).
    ``moved``: the shards written (none on a dry run; a shard already where the rewind puts it,
    with no owner, is not written). ``cache_synced``: the shard cache now shows the rewind's
    finished shards, so members assign reopened parents at their next tick (False: the leader's
    next shard sync does it, within ``shard_sync_interval``)."""

    app: str
    stream: str
    to: str
    instant_ms: int | None
    shards: tuple[ShardRewind, ...]
    dry_run: bool
    moved: tuple[str, ...] = ()
    cache_synced: bool = False


def rewind_group(
    config: Config,
    stream: str,
    *,
    to_time: datetime | None = None,
    by: timedelta | None = None,
    to: str | None = None,
    dry_run: bool = False,
) -> RewindResult:
    """Move every shard of ``stream`` (its whole lineage: Kinesis's listing and the table's
    shard cache and checkpoints) so that ``config.app``'s group next reads the first record
    that arrived at or after a time. Give exactly one of:

    - ``to_time``: that instant (a naive time is UTC). Kinesis's arrival times count
      milliseconds: a record that arrived in the instant's millisecond is read again.
    - ``by``: that long before now, by Kinesis's clock (the ``Date`` of its answer, whole
      seconds: up to a second more is read again, never less).
    - ``to="trim-horizon"``: every shard from its oldest record; ``to="latest"``: every open
      shard after its last record now (closed ones finished).

    With the lineage: a shard open at the time resumes there; a closed one with no record at or
    after it is finished; a child of a reshard after the time starts there too, which is its
    first record, and waits for its reopened parents as children do. Every item is moved by a
    write conditional on the item as read (:meth:`DynamoDBStateStore.rewind_checkpoint`),
    ancestors first, which bumps the lease and removes the owner: it works while the group
    runs. A member holding a moved shard drops what it fetched of it and claims it again at the
    new place, within ``commit_interval`` (its next checkpoint write or lease check). A racing
    claim or checkpoint makes a shard's write fail: it is read again and retried
    (``REWIND_ATTEMPTS``), then :class:`~kinesumer.errors.RewindConflictError` says which
    shards moved and which did not; nothing is ever overwritten.

    ``dry_run``: read and plan only; nothing is written. Blocking (it runs its own event loop):
    from a coroutine, await :func:`rewind_stream`. Raises
    :class:`~kinesumer.errors.ConfigError` for bad arguments or a time in the future,
    :class:`~kinesumer.errors.StreamNotFoundError`,
    :class:`~kinesumer.errors.StateTableNotFoundError`.
    """
    return asyncio.run(
        rewind_stream(config, stream, to_time=to_time, by=by, to=to, dry_run=dry_run)
    )


async def rewind_stream(
    config: Config,
    stream: str,
    *,
    to_time: datetime | None = None,
    by: timedelta | None = None,
    to: str | None = None,
    dry_run: bool = False,
    state: DynamoDBStateStore | None = None,
) -> RewindResult:
    """:func:`rewind_group` for a coroutine. ``state``: the state store to read and write
    through (default: the DynamoDB table ``config`` names; a test passes a wrapper that races
    the rewind)."""
    _check_rewind_arguments(stream, to_time, by, to)
    async with contextlib.AsyncExitStack() as stack:
        if state is None:
            _, store = await stack.enter_async_context(open_table(config))
        else:
            store = state
        reader = KinesisReader(
            await open_tool_transport(stack, config),
            RequestStats(),
            config.effective_kinesis_region,
        )
        # The table first, then Kinesis: a shard the table knows and the later listing does
        # not is gone (aged out). Listed first, a child born of a reshard between the two reads
        # (in the table, claimed or cached, but not in the older listing) would be taken for
        # one and finished: its records never read.
        known = await stream_shards(store, stream, {})
        listed = await reader.list_shards(stream)
        instant_ms = await _rewind_instant(reader, stream, listed, to_time, by)
        if instant_ms is not None and is_dynamodb_stream(stream):
            # No AT_TIMESTAMP there: members (and the probes here) read from the shard's
            # oldest record and skip the earlier ones, by stamps of whole seconds.
            instant_ms = stamp_floor_ms(instant_ms)
        where = to or iso_time(instant_ms)  # type: ignore[arg-type]
        views = await _stream_views(store, stream, {}, listed, known)
        plan = await _plan_rewind(reader, stream, views, listed, instant_ms, to)
        result = RewindResult(config.app, stream, where, instant_ms, plan, dry_run)
        if dry_run:
            return result
        moved = await _apply_rewind(store, stream, plan)
        plan, moved = await _follow_reshards(store, reader, stream, plan, moved, instant_ms, to)
        synced = await _sync_finished(config, store, reader, stream, plan)
        return replace(result, shards=plan, moved=moved, cache_synced=synced)


def _check_rewind_arguments(
    stream: str, to_time: datetime | None, by: timedelta | None, to: str | None
) -> None:
    if not isinstance(stream, str) or not stream:
        raise ConfigError("stream", f"must be a stream name, got {stream!r}", "rewind_group")
    given = [name for name, v in (("to_time", to_time), ("by", by), ("to", to)) if v is not None]
    if len(given) != 1:
        raise ConfigError(
            "to",
            "give exactly one of to_time, by or to"
            + (f" (got {', '.join(given)})" if given else ""),
            "rewind_group",
        )
    if to_time is not None and not isinstance(to_time, datetime):
        raise ConfigError("to_time", f"must be a datetime, got {to_time!r}", "rewind_group")
    if by is not None and (not isinstance(by, timedelta) or by <= timedelta(0)):
        raise ConfigError("by", f"must be a positive timedelta, got {by!r}", "rewind_group")
    if to is not None and to not in (TRIM_HORIZON, LATEST):
        raise ConfigError(
            "to", f"must be {TRIM_HORIZON!r} or {LATEST!r}, got {to!r}", "rewind_group"
        )


async def _rewind_instant(
    reader: KinesisReader,
    stream: str,
    listed: list[Shard],
    to_time: datetime | None,
    by: timedelta | None,
) -> int | None:
    """The instant of a time rewind (None for ``to``), checked against Kinesis's clock: an
    instant in the future would make the group skip records still to come."""
    if (to_time is None and by is None) or not listed:
        return None if to_time is None else instant_of(to_time)
    now_ms, _ = await kinesis_now_ms(reader, stream, listed[0].shard_id)
    if by is not None:
        return max(now_ms - int(by.total_seconds() * 1000), 0)  # before 1970: the oldest
    instant = instant_of(to_time)  # type: ignore[arg-type]
    if instant > now_ms + FUTURE_SLACK_MS:
        raise ConfigError(
            "to_time",
            f"{iso_time(instant)} is in the future by Kinesis's clock ({iso_time(now_ms)}): "
            f"the group would skip the records still to come",
            "rewind_group",
        )
    return max(instant, 0)


async def _plan_rewind(
    reader: KinesisReader,
    stream: str,
    views: list[ShardView],
    listed: list[Shard],
    instant_ms: int | None,
    to: str | None,
) -> tuple[ShardRewind, ...]:
    """Every shard's target (see :mod:`kinesumer.core.rewind`), in the order to write them."""
    on_stream = {shard.shard_id: shard for shard in listed}
    limit = asyncio.Semaphore(PROBE_CONCURRENCY)

    async def target_of(view: ShardView) -> ShardRewind:
        shard = on_stream.get(view.shard_id)
        target: RewindTarget
        if shard is None:
            target, why = RewindTarget(finished=True), "no longer in the stream (aged out)"
        elif to == TRIM_HORIZON:
            target, why = RewindTarget(started_at_ms=0), "from its oldest record"
        elif to == LATEST and shard.closed:
            target, why = RewindTarget(finished=True), "closed"
        elif to == LATEST:
            async with limit:
                position, since_ms = await last_record(reader, stream, view.shard_id)
            if position is not None:
                target, why = RewindTarget(position=position), "after its last record now"
            else:
                target, why = RewindTarget(started_at_ms=since_ms), "no record since the start"
        else:
            assert instant_ms is not None
            later = None
            if shard.closed:
                async with limit:
                    later = await has_record_since(reader, stream, view.shard_id, instant_ms)
            target, why = time_target(shard, on_stream, instant_ms, later)
        return ShardRewind(stream, view.shard_id, view.checkpoint, target, why)

    by_id = {view.shard_id: view for view in views}
    order = lineage_order(on_stream.get(v.shard_id, v.shard) for v in views)
    return tuple(await asyncio.gather(*(target_of(by_id[shard_id]) for shard_id in order)))


async def _apply_rewind(
    store: DynamoDBStateStore, stream: str, plan: tuple[ShardRewind, ...]
) -> tuple[str, ...]:
    """Write the moves in order, each conditional on the item as read; a refused write reads
    the item again and retries. Stops at a shard that keeps changing, so a child is never
    moved while its parent is not (:class:`RewindConflictError`)."""
    moved: list[str] = []
    for index, move in enumerate(plan):
        seen = move.seen
        for _ in range(REWIND_ATTEMPTS):
            if move.target.holds(seen) and seen is not None and seen.owner is None:
                break  # already there and nobody reads it: nothing to fence
            if await store.rewind_checkpoint(stream, move.shard_id, seen, move.target):
                moved.append(move.shard_id)
                break
            log.info(
                "%s/%s changed while it was being rewound; reading it again", stream, move.shard_id
            )
            seen = (await store.get_checkpoints(stream, [move.shard_id])).get(move.shard_id)
        else:
            not_moved = tuple(m.shard_id for m in plan[index:])
            raise RewindConflictError(
                f"rewind of {stream} stopped: {stream}/{move.shard_id} changed under each of "
                f"{REWIND_ATTEMPTS} attempts (members claiming it or writing its checkpoint); "
                f"nothing was overwritten. Moved: {', '.join(moved) or 'none'}; not moved: "
                f"{', '.join(not_moved)}. Run the rewind again.",
                tuple(moved),
                not_moved,
            )
    return tuple(moved)


async def _follow_reshards(
    store: DynamoDBStateStore,
    reader: KinesisReader,
    stream: str,
    plan: tuple[ShardRewind, ...],
    moved: tuple[str, ...],
    instant_ms: int | None,
    to: str | None,
) -> tuple[tuple[ShardRewind, ...], tuple[str, ...]]:
    """Move the shards a reshard made while the rewind ran (after its listing), listing again
    until none is new: their parents were moved to be read to their end, so they start over
    (a member may already have read one, and would go on past records the rewind replays,
    before its reopened parent's). They are children born after the command began: a time
    rewind puts them at the instant, as any shard (their first record, or the first at or
    after it); ``latest`` and ``trim-horizon`` at their first record."""
    for _ in range(CACHE_ATTEMPTS):
        listed = await reader.list_shards(stream)
        planned = {move.shard_id for move in plan}
        born = [shard for shard in listed if shard.shard_id not in planned]
        if not born:
            break
        found = await store.get_checkpoints(stream, [shard.shard_id for shard in born])
        views = [ShardView(stream, s, found.get(s.shard_id), False, None) for s in born]
        if to == LATEST:  # every record of theirs came after the command began
            by_id = {view.shard_id: view for view in views}
            first, why = RewindTarget(started_at_ms=0), "born during the rewind: from its start"
            more = tuple(
                ShardRewind(stream, shard_id, by_id[shard_id].checkpoint, first, why)
                for shard_id in lineage_order(born)
            )
        else:
            more = await _plan_rewind(reader, stream, views, listed, instant_ms, to)
        try:
            moved += await _apply_rewind(store, stream, more)
        except RewindConflictError as exc:
            raise RewindConflictError(str(exc), moved + exc.moved, exc.not_moved) from None
        plan += more
    return plan, moved


async def _sync_finished(
    config: Config,
    store: DynamoDBStateStore,
    reader: KinesisReader,
    stream: str,
    plan: tuple[ShardRewind, ...],
) -> bool:
    """Write the stream's shard cache as the leader's shard sync does (listing, ``finished``
    read from the items just written), so members assign a reopened parent at their next tick
    rather than the leader's next sync. Conditional on the cache read (the sync's own rule);
    True once the cache shows the rewind's finished closed shards."""
    sync = ShardSync(f"{config.app}-rewind", "TRIM_HORIZON", store, reader)
    expected = {m.shard_id for m in plan if m.target.finished}
    for _ in range(CACHE_ATTEMPTS):
        await sync.sync_stream(stream)
        cache = await store.load_shard_cache(stream)
        if cache is None:
            continue
        closed = {s.shard_id for s in cache.shards if s.closed}
        if cache.finished & closed == expected & closed:
            return True
    log.warning(
        "the shard cache of %s could not be brought up to date; the leader's next shard sync "
        "does it (reopened parents are read from then on)",
        stream,
    )
    return False


def deregister_consumer(config: Config, stream: str) -> bool:
    """Deregister the app's enhanced fan-out consumer of ``stream`` (a name, or a Kinesis stream
    ARN: in its own account and region); blocking. From a coroutine:
    :func:`deregister_stream_consumer` (which says what it raises)."""
    return asyncio.run(deregister_stream_consumer(config, stream))


def _call(config: Config, operation: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ClientError as exc:
        _raise_named(config, operation, exc)


def _raise_named(config: Config, operation: str, exc: ClientError) -> NoReturn:
    code = error_code(exc)
    name = config.dynamodb_table
    if code == "ResourceNotFoundException":
        region = config.effective_dynamodb_region or default_region() or "the default region"
        where = f"{region} at {config.dynamodb_endpoint}" if config.dynamodb_endpoint else region
        raise StateTableNotFoundError(f"DynamoDB table {name!r} does not exist in {where}") from exc
    if code == "AccessDeniedException":
        raise AccessDeniedError(f"AWS denied dynamodb:{operation} on {name!r}: {exc}") from exc
    raise StateStoreError(f"dynamodb:{operation} on {name!r} failed: {exc}") from exc
