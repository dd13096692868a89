"""The state store on one DynamoDB table: :class:`DynamoDBStateStore` wires the table calls
(:mod:`.table`), the item codecs (:mod:`.codecs`) and the shard cache (:mod:`.shard_cache`) into
the :class:`~kinesumer.statestore.base.StateStore` protocol, plus the operator's checkpoint moves
the command line makes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from ...aws import RequestStats
from ...core.rewind import RewindTarget
from ...errors import CorruptStateError
from ...models import Checkpoint, ClientInfo, Position
from ..base import MembershipView, PublishedMembers, SavedPosition, ShardCache
from ..schema import SORT_KEY, checkpoint_pk, client_pk
from ..spark import LedgerEntry
from . import codecs, positions, view
from .codecs import CLIENT_ITEM_BUDGET, client_item
from .shard_cache import ShardCacheItems
from .spark import SparkItems
from .table import StateTable
from .unreadable import Unreadable

__all__ = ["CLIENT_ITEM_BUDGET", "DynamoDBStateStore", "client_item"]


class DynamoDBStateStore:
    """:class:`~kinesumer.statestore.base.StateStore` on a DynamoDB table, through one
    aiobotocore ``client`` (requests retried and counted in ``stats``).

    ``keys``: the name each stream's shard cache and checkpoint items are kept under, from the
    stream as the application named it (:func:`kinesumer.accounts.state_key`: a Kinesis stream
    ARN of the home account and region is kept under its plain name); the items read back
    carry the name as given. None: the name as given."""

    def __init__(
        self,
        client: Any,
        table: str,
        app: str,
        stats: RequestStats,
        *,
        keys: Callable[[str], str] | None = None,
    ) -> None:
        self._table = StateTable(client, table, stats)
        self._app = app
        self._key: Callable[[str], str] = keys or str
        #: Items skipped because they cannot be read back (see :mod:`.unreadable`).
        self.unreadable = Unreadable(stats)
        self._shard_caches = ShardCacheItems(self._table, app)
        self._spark = SparkItems(self._table, app, self.unreadable)
        self._known_digests: dict[str, str] = {}  # as last read or written: what a leader publishes
        self._followed_digests: dict[str, str] | None = (
            None  # from the head: the next read's answer
        )

    async def check(self) -> None:
        await self._table.check()

    # -- membership ---------------------------------------------------------------------------
    async def heartbeat(self, client: ClientInfo, ttl_seconds: int) -> None:
        await self._table.put(client_item(self._app, client, ttl_seconds))

    async def deregister(self, client_id: str) -> None:
        await self._table.delete(codecs.client_key(self._app, client_id))
        await self.announce_change()  # followers of the view read the members directly now

    async def list_clients(self) -> list[ClientInfo]:
        """Every client item that reads back; the others are skipped (logged and counted)."""
        clients, errors = codecs.readable_clients(await self._table.query(client_pk(self._app)))
        for error in errors:
            self.unreadable.skip("client", error)
        return clients

    async def get_client(self, client_id: str) -> ClientInfo | None:
        """One client item, strongly consistent; None when it is gone or unreadable (skipped,
        logged and counted: no verdict ever saw such a member live, so it counts as gone)."""
        item = await self._get(codecs.client_key(self._app, client_id), consistent=True)
        try:
            return None if item is None else codecs.decode_client(item)
        except CorruptStateError as exc:
            self.unreadable.skip("client", exc)
            return None

    async def prune_client(self, client: ClientInfo) -> bool:
        return await self._table.delete_if(
            codecs.client_key(self._app, client.client_id), codecs.prune_condition(client)
        )

    # -- the membership view (see :mod:`.view`) ------------------------------------------------
    async def read_view_head(self, *, consistent: bool) -> MembershipView | None:
        """The view's head; None when there is none or it is unreadable (skipped: members then
        read the client items themselves)."""
        item = await self._get(view.head_key(self._app), consistent=consistent)
        try:
            return None if item is None else view.decode_head(item)
        except CorruptStateError as exc:
            self.unreadable.skip("view", exc)
            return None

    async def read_view_members(self, members_key: str) -> PublishedMembers | None:
        item = await self._get(view.view_key(self._app, members_key), consistent=False)
        try:
            return None if item is None else view.decode_members(item, self._table.name)
        except CorruptStateError as exc:
            self.unreadable.skip("view", exc)
            return None

    async def publish_view(
        self, seen: MembershipView | None, head: MembershipView, members: PublishedMembers | None
    ) -> bool:
        head = dataclasses.replace(head, digests=tuple(sorted(self._known_digests.items())))
        if members is not None:
            item = view.members_item(self._app, head.members_key, members, int(time.time()))
            if await self._table.put_if(item, codecs.ABSENT) is None:
                return False  # the same key twice: another publisher at the same millisecond
        published = await self._table.update_if(
            view.head_key(self._app), view.head_update(seen, head)
        )
        if published is None:
            if members is not None:  # ours lost: nobody points to it
                await self._table.delete(view.view_key(self._app, head.members_key))
            return False
        if members is not None and seen is not None and seen.members_key:
            await self._table.delete(view.view_key(self._app, seen.members_key))
        return True

    def follow_digests(self, head: MembershipView | None) -> None:
        self._followed_digests = None if head is None else dict(head.digests)

    async def announce_change(self) -> None:
        await self._table.update_if(view.head_key(self._app), view.bump_update())

    async def _get(self, key: dict[str, Any], *, consistent: bool) -> dict[str, Any] | None:
        """GetItem, eventually consistent unless ``consistent`` (half the read units)."""
        table = self._table
        call = partial(table.dynamodb.get_item, TableName=table.name, Key=key)
        response = await table.call("GetItem", partial(call, ConsistentRead=consistent))
        item: dict[str, Any] | None = response.get("Item")
        return item

    # -- shard cache --------------------------------------------------------------------------
    async def shard_cache_digests(self, streams: Sequence[str]) -> dict[str, str]:
        followed, self._followed_digests = self._followed_digests, None
        if followed is not None and all(s in followed for s in streams):
            return {s: followed[s] for s in streams}
        named = {self._key(s): s for s in streams}
        digests = {named[k]: d for k, d in (await self._shard_caches.digests(list(named))).items()}
        self._known_digests.update(digests)
        return digests

    async def load_shard_cache(self, stream: str) -> ShardCache | None:
        """The stream's cache; None also when it cannot be read (skipped, logged and counted:
        the caller keeps the cache it has rather than take garbage for the shard list)."""
        try:
            key = self._key(stream)
            cache = await self._shard_caches.load(key)
            if cache is not None and key != stream:
                cache = dataclasses.replace(cache, stream=stream)
            return cache
        except CorruptStateError as exc:
            self.unreadable.skip("shard_cache", exc)
            return None

    def shard_cache_unreadable(self, stream: str) -> bool:
        return self._shard_caches.refused(self._key(stream))

    async def save_shard_cache(self, cache: ShardCache, expected_digest: str | None) -> bool:
        key = self._key(cache.stream)
        stored = cache if key == cache.stream else dataclasses.replace(cache, stream=key)
        saved = await self._shard_caches.save(stored, expected_digest)
        if saved:
            self._known_digests[cache.stream] = cache.digest
        return saved

    async def cached_streams(self) -> list[str]:
        """Streams that have a shard cache for this app (what ``kinesumer status`` lists)."""
        return await self._shard_caches.streams()

    # -- checkpoints --------------------------------------------------------------------------
    async def get_checkpoints(
        self, stream: str, shard_ids: Iterable[str] | None = None
    ) -> dict[str, Checkpoint]:
        if shard_ids is None:
            items = await self._table.query(checkpoint_pk(self._app, self._key(stream)))
        else:
            key = self._key(stream)
            keys = [codecs.checkpoint_key(self._app, key, s) for s in sorted(set(shard_ids))]
            items = await self._table.batch_get(keys)
        # An unreadable checkpoint is left out (as if there were none: a claim of it, being
        # conditional on the item's absence, is refused, so it is never overwritten) and noted.
        result = {}
        read = set()
        for item in items:
            shard_id = str(item.get(SORT_KEY, {}).get("S"))
            read.add(shard_id)
            try:
                checkpoint = codecs.decode_checkpoint(stream, item, self._table.name)
            except CorruptStateError as exc:
                self.unreadable.checkpoint(stream, shard_id, exc)
                continue
            result[checkpoint.shard_id] = checkpoint
        asked = self.unreadable.shards_of(stream) if shard_ids is None else set(shard_ids)
        for shard_id in (asked - read) | set(result):  # deleted or repaired: readable again
            self.unreadable.checkpoint(stream, shard_id, None)
        return result

    def checkpoint_unreadable(self, stream: str, shard_id: str) -> bool:
        """Whether the shard's checkpoint could not be read back at its last read: the shard is
        not read until it can (it is listed in ``consumer.stats().unreadable_shards``)."""
        return self.unreadable.checkpoint_unreadable(stream, shard_id)

    async def claim(
        self, stream: str, shard_id: str, client_id: str, seen: Checkpoint | None
    ) -> Checkpoint | None:
        written = await self._table.update_if(
            codecs.checkpoint_key(self._app, self._key(stream), shard_id),
            codecs.claim_update(client_id, seen),
            return_new=True,
        )
        if written is None:
            return None
        try:
            return codecs.decode_checkpoint(stream, written, self._table.name)
        except CorruptStateError as exc:  # changed under us: ours, but not readable
            self.unreadable.checkpoint(stream, shard_id, exc)
            return None

    async def write_checkpoint(
        self,
        checkpoint: Checkpoint,
        position: Position | None,
        *,
        finished: bool = False,
        release: bool = False,
        done: bytes | None = None,
    ) -> bool:
        update = codecs.checkpoint_update(
            checkpoint, position, finished=finished, release=release, done=done
        )
        written = await self._table.update_if(
            codecs.checkpoint_key(self._app, self._key(checkpoint.stream), checkpoint.shard_id),
            update,
        )
        return written is not None

    async def record_start(self, checkpoint: Checkpoint, started_at_ms: int) -> bool:
        written = await self._table.update_if(
            codecs.checkpoint_key(self._app, self._key(checkpoint.stream), checkpoint.shard_id),
            codecs.start_update(checkpoint, started_at_ms),
        )
        return written is not None

    async def move_checkpoint(
        self, stream: str, shard_id: str, seen: Checkpoint | None, position: Position | None
    ) -> bool:
        """An operator's move (``position``) or removal (None) of a checkpoint, if the item is
        still as ``seen`` (None: there is none yet). Not part of the consumers' protocol.

        The write bumps the lease and removes the owner, exactly as if the shard had been
        released and re-claimed: any member still holding the old lease has its next checkpoint
        write refused (so it cannot overwrite the new position) and drops the shard; the member
        the assignment gives it to claims it again and starts from here. False: the item changed
        since it was read (a claim, a handoff, a checkpoint under a new lease); nothing was
        written.
        """
        if seen is None:
            item = codecs.new_checkpoint_item(self._app, self._key(stream), shard_id, position)
            return await self._table.put_if(item, codecs.ABSENT) is not None
        written = await self._table.update_if(
            codecs.checkpoint_key(self._app, self._key(stream), shard_id),
            codecs.move_update(seen, position),
        )
        return written is not None

    async def rewind_checkpoint(
        self, stream: str, shard_id: str, seen: Checkpoint | None, target: RewindTarget
    ) -> bool:
        """An operator's rewind of one shard to ``target`` (a start instant, a position, or
        finished: see :mod:`kinesumer.core.rewind`), if the item is still exactly as ``seen``
        (None: there is none yet). Not part of the consumers' protocol.

        Like :meth:`move_checkpoint`, it bumps the lease and removes the owner: a member still
        holding the old lease has its next checkpoint write refused, or sees the move at its
        next lease check, drops the shard and what it buffered of it, and claims it again at
        the new place. Its condition is stricter than a move's: a checkpoint the owner wrote
        since the read (same lease, new position or start) refuses it too, so the caller
        reads again and decides on what is there now. False: the item changed; nothing was
        written."""
        if seen is None:
            item = codecs.rewind_item(self._app, self._key(stream), shard_id, target)
            return await self._table.put_if(item, codecs.ABSENT) is not None
        written = await self._table.update_if(
            codecs.checkpoint_key(self._app, self._key(stream), shard_id),
            codecs.rewind_update(seen, target),
        )
        return written is not None

    # -- the Spark source's items (:class:`~kinesumer.statestore.spark.SparkSourceStore`) ----
    async def ledger_entry(
        self, query: str, batch: int, stream: str, shard_id: str
    ) -> LedgerEntry | None:
        return await self._spark.ledger_entry(query, batch, stream, shard_id)

    async def add_ledger_entry(
        self, query: str, entry: LedgerEntry, ttl_seconds: int
    ) -> LedgerEntry:
        return await self._spark.add_ledger_entry(query, entry, ttl_seconds)

    async def ledger_batch(self, query: str, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        return await self._spark.ledger_batch(query, batch)

    async def delete_ledger_before(self, query: str, batch: int) -> int:
        return await self._spark.delete_ledger_before(query, batch)

    async def forget_ledger(self, query: str) -> int:
        return await self._spark.forget_ledger(query)

    async def latest_pin(self, stream: str, shard_id: str) -> int | None:
        return await self._spark.latest_pin(stream, shard_id)

    async def add_latest_pin(
        self, stream: str, shard_id: str, started_at_ms: int, written_at_ms: int
    ) -> int:
        return await self._spark.add_latest_pin(stream, shard_id, started_at_ms, written_at_ms)

    async def latest_pins(self, stream: str) -> dict[str, int]:
        """Where the app's Spark queries first opened each shard of ``stream`` at ``LATEST``
        (:mod:`kinesumer.spark.source.driver.pins`): shard id -> epoch ms. Unreadable pins are
        skipped (logged and counted)."""
        return await self._spark.latest_pins(stream)

    async def forget_latest_pin(self, stream: str, shard_id: str, started_at_ms: int) -> bool:
        """An operator's removal of a shard's Spark ``LATEST`` pin, if it still holds
        ``started_at_ms`` (a pin made again since is left alone). False: it changed."""
        return await self._spark.forget_latest_pin(stream, shard_id, started_at_ms)

    async def client_marks(self) -> frozenset[tuple[str, str]]:
        return await self._spark.client_marks()

    async def forget_group(self, streams: Iterable[str]) -> int:
        return await self._spark.forget_group(streams)

    # -- broadcast members' own positions (see :mod:`.positions`) -----------------------------
    async def open_broadcast_session(self, client_id: str) -> int:
        """Start a session of broadcast member ``client_id``: a number higher than any earlier
        start's (an atomic counter). Positions written under it refuse older sessions' writes."""
        written = await self._table.update_if(
            positions.session_key(self._app, client_id), positions.session_update(), return_new=True
        )
        if written is None:  # unconditional: only a malformed answer gets here
            raise CorruptStateError(f"no session number came back for {client_id!r}")
        return positions.decode_session(written)

    async def broadcast_positions(self, client_id: str) -> dict[tuple[str, str], SavedPosition]:
        """Every position broadcast member ``client_id`` saved, by (stream, shard id); a
        stream by its state key (the caller maps it to its own name)."""
        items = await self._table.query(positions.broadcast_pk(self._app, client_id))
        found = (positions.decode_position(item, self._table.name) for item in items)
        return {(s.stream, s.shard_id): s for s in found if s is not None}

    async def save_broadcast_position(
        self, client_id: str, session: int, saved: SavedPosition
    ) -> bool:
        """Save a broadcast member's position in one shard, as ``session``. False: a newer
        session of the same client id wrote it (another process took the id over)."""
        written = await self._table.update_if(
            positions.position_key(self._app, client_id, self._key(saved.stream), saved.shard_id),
            positions.position_update(session, saved),
        )
        return written is not None
