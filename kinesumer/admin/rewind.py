"""Rewinding a group to a time (:func:`rewind_group`): every shard of a stream's lineage moved
so that the group next reads the first record that arrived at or after it, or from its oldest
record, or after its last one now. The plan is pure (:mod:`kinesumer.core.rewind`); the Kinesis
reads that decide a closed shard's fate are :mod:`kinesumer.kinesis.rewind_probe`'s; the
conditional writes, and following the reshards made while the rewind ran, are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ..aws import RequestStats
from ..config import Config
from ..core.rewind import (
    LATEST,
    TRIM_HORIZON,
    RewindTarget,
    ShardRewind,
    lineage_order,
    time_target,
)
from ..errors import ConfigError, RewindConflictError
from ..group.shard_sync import ShardSync
from ..kinesis.dynamodb_streams import stamp_floor_ms
from ..kinesis.reader import KinesisReader
from ..kinesis.rewind_probe import has_record_since, instant_of, kinesis_now_ms, last_record
from ..kinesis.tool_transport import open_tool_transport
from ..models import Shard
from ..statestore.dynamodb.store import DynamoDBStateStore
from ..statestore.group_view import ShardView, iso_time, open_table, stream_shards
from ..stream_refs import is_dynamodb_stream
from .shards import PROBE_CONCURRENCY, stream_views

#: Attempts to move one shard whose item keeps changing under the rewind (a claim or a
#: checkpoint between its read and the conditional write), each after reading it again.
REWIND_ATTEMPTS = 5

#: Attempts to write the stream's shard cache with the rewind's ``finished`` flags (each
#: conditional on the cache read; a leader's sync writing meanwhile makes it list again).
CACHE_ATTEMPTS = 3

#: Seconds an instant may lie past Kinesis's ``Date`` before it counts as in the future: the
#: header counts whole seconds, and some servers reuse it for a second.
FUTURE_SLACK_MS = 2_000

log = logging.getLogger("kinesumer.admin")


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
        views = await stream_views(store, stream, {}, listed, known)
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
