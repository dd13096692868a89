"""An in-memory state store: the group's state (clients, checkpoints, shard caches, the
membership view, broadcast positions) and the Spark source's items, in one process.

:class:`MemoryState` implements every store protocol the library uses
(:class:`~kinesumer.statestore.base.StateStore`,
:class:`~kinesumer.statestore.base.MembershipViewStore`,
:class:`~kinesumer.statestore.spark.SparkSourceStore`, and the operator's and broadcast
members' methods of :class:`~kinesumer.statestore.dynamodb.DynamoDBStateStore`) with the
semantics of the DynamoDB one where they matter:

- every conditional write refuses exactly when the DynamoDB store's condition would (a claim
  on the owner and lease it read, a checkpoint fenced by owner and lease, a shard cache on the
  digest it read, a pin or ledger entry only where there is none, ...), and says so in its
  return value;
- reads are strongly consistent (a write is seen by the next read, from any thread);
- what comes out is a copy: nothing a caller does to a returned object changes what is stored;
- values go through the same normalisation as the DynamoDB items (a client's lags within the
  item's budget, a ledger entry's empty owner read back as ``"-"``, a published member list
  without stamps).

One ``MemoryState`` is one table seen as one app (``app``); :meth:`for_app` gives another
app's view of the same table (the Spark source keeps its ledger under its app and its pins and
group under the group's). Each method takes the table's lock for its whole read-modify-write,
so it may be called from any thread and any event loop; none blocks on anything else.
TTLs are not enforced (DynamoDB's own run days late): items stay until deleted.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ..models import Checkpoint, ClientInfo, Position
from ..statestore.base import (
    GroupState,
    MembershipView,
    PublishedMembers,
    SavedPosition,
    ShardCache,
)
from ..statestore.dynamodb.codecs import client_item, decode_client
from ..statestore.spark import LedgerEntry

__all__ = ["MemoryState"]

K = TypeVar("K")
V = TypeVar("V")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Head:
    """The view's head: ``published`` False while only joins and leaves were counted on it
    (the DynamoDB item then has ``changes`` and no ``version``)."""

    view: MembershipView
    published: bool


@dataclass
class _Position:
    """A broadcast member's saved position, attribute by attribute as the item holds it."""

    session: int
    position: Position | None = None
    started_at_ms: int | None = None
    finished: bool = False


@dataclass
class _Tables:
    """Every item of the table, by kind; guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    clients: dict[tuple[str, str], ClientInfo] = field(default_factory=dict)
    checkpoints: dict[tuple[str, str, str], Checkpoint] = field(default_factory=dict)
    shard_caches: dict[tuple[str, str], ShardCache] = field(default_factory=dict)
    heads: dict[str, _Head] = field(default_factory=dict)
    member_lists: dict[tuple[str, str], PublishedMembers] = field(default_factory=dict)
    sessions: dict[tuple[str, str], int] = field(default_factory=dict)
    positions: dict[tuple[str, str, str, str], _Position] = field(default_factory=dict)
    ledger: dict[tuple[str, str, int, str, str], LedgerEntry] = field(default_factory=dict)
    pins: dict[tuple[str, str, str], int] = field(default_factory=dict)


async def _io() -> None:
    """A suspension point where the DynamoDB store awaits the network: other tasks run."""
    await asyncio.sleep(0)


class MemoryState:
    """The state table in memory, as app ``app`` sees it (see the module docstring).

    ``MemoryState()`` is a fresh, empty table; ``state.for_app("other")`` shares its items.
    """

    def __init__(self, app: str = "app", *, _tables: _Tables | None = None) -> None:
        self.app = app
        self._tables = _tables if _tables is not None else _Tables()
        # As the DynamoDB store's: digests this instance last read or wrote (what it publishes
        # on a view head), and those a followed head handed over for the next read.
        self._known_digests: dict[str, str] = {}
        self._followed_digests: dict[str, str] | None = None

    def for_app(self, app: str) -> MemoryState:
        """App ``app``'s view of the same table."""
        return MemoryState(app, _tables=self._tables)

    async def check(self) -> None:
        await _io()

    # -- membership ---------------------------------------------------------------------------
    async def heartbeat(self, client: ClientInfo, ttl_seconds: int) -> None:
        # Through the client item's codec: the lags kept within its budget, the host and
        # version filled in, exactly as a member reading the DynamoDB item would see them.
        stored = decode_client(client_item(self.app, client, ttl_seconds))
        await _io()
        with self._tables.lock:
            self._tables.clients[(self.app, client.client_id)] = stored

    def write_client_blocking(self, client: ClientInfo, ttl_seconds: int) -> None:
        """:meth:`heartbeat` for the member's heartbeat thread, which has no event loop."""
        stored = decode_client(client_item(self.app, client, ttl_seconds))
        with self._tables.lock:
            self._tables.clients[(self.app, client.client_id)] = stored

    async def deregister(self, client_id: str) -> None:
        await _io()
        with self._tables.lock:
            self._tables.clients.pop((self.app, client_id), None)
        await self.announce_change()

    async def list_clients(self) -> list[ClientInfo]:
        await _io()
        with self._tables.lock:
            found = [c for (app, _), c in self._tables.clients.items() if app == self.app]
        return [copy.deepcopy(c) for c in sorted(found, key=lambda c: c.client_id)]

    async def get_client(self, client_id: str) -> ClientInfo | None:
        await _io()
        with self._tables.lock:
            found = self._tables.clients.get((self.app, client_id))
        return copy.deepcopy(found)

    async def prune_client(self, client: ClientInfo) -> bool:
        await _io()
        key = (self.app, client.client_id)
        with self._tables.lock:
            stored = self._tables.clients.get(key)
            if stored is None or stored.last_update_ms != client.last_update_ms:
                return False
            if client.beat and stored.beat != client.beat:
                return False
            del self._tables.clients[key]
            return True

    async def client_marks(self) -> frozenset[tuple[str, str]]:
        await _io()
        with self._tables.lock:
            return frozenset(
                (cid, str(c.last_update_ms))
                for (app, cid), c in self._tables.clients.items()
                if app == self.app
            )

    # -- the membership view ------------------------------------------------------------------
    async def read_view_head(self, *, consistent: bool) -> MembershipView | None:
        await _io()
        with self._tables.lock:
            head = self._tables.heads.get(self.app)
            return None if head is None else head.view

    async def read_view_members(self, members_key: str) -> PublishedMembers | None:
        await _io()
        with self._tables.lock:
            found = self._tables.member_lists.get((self.app, members_key))
        return None if found is None else _published(found)

    async def publish_view(
        self, seen: MembershipView | None, head: MembershipView, members: PublishedMembers | None
    ) -> bool:
        head = dataclasses.replace(head, digests=tuple(sorted(self._known_digests.items())))
        await _io()
        tables = self._tables
        with tables.lock:
            list_key = (self.app, head.members_key)
            if members is not None:
                if list_key in tables.member_lists:
                    return False
                tables.member_lists[list_key] = _published(members)
            current = tables.heads.get(self.app)
            if seen is None or not seen.members_key:
                held = current is None or not current.published
            else:
                held = (
                    current is not None
                    and current.published
                    and current.view.version == seen.version
                    and current.view.members_key == seen.members_key
                )
            if not held:
                if members is not None:
                    del tables.member_lists[list_key]
                return False
            changes = 0 if current is None else current.view.changes
            tables.heads[self.app] = _Head(dataclasses.replace(head, changes=changes), True)
            if members is not None and seen is not None and seen.members_key:
                tables.member_lists.pop((self.app, seen.members_key), None)
            return True

    def follow_digests(self, head: MembershipView | None) -> None:
        self._followed_digests = None if head is None else dict(head.digests)

    async def announce_change(self) -> None:
        await _io()
        with self._tables.lock:
            current = self._tables.heads.get(self.app)
            if current is None:
                empty = MembershipView(0, "", 0, 0, "", 0, changes=1)
                self._tables.heads[self.app] = _Head(empty, False)
            else:
                bumped = dataclasses.replace(current.view, changes=current.view.changes + 1)
                self._tables.heads[self.app] = _Head(bumped, current.published)

    # -- shard cache --------------------------------------------------------------------------
    async def shard_cache_digests(self, streams: Sequence[str]) -> dict[str, str]:
        followed, self._followed_digests = self._followed_digests, None
        if followed is not None and all(s in followed for s in streams):
            return {s: followed[s] for s in streams}
        await _io()
        with self._tables.lock:
            caches = self._tables.shard_caches
            digests = {s: caches[(self.app, s)].digest for s in streams if (self.app, s) in caches}
        self._known_digests.update(digests)
        return digests

    async def load_shard_cache(self, stream: str) -> ShardCache | None:
        await _io()
        with self._tables.lock:
            return self._tables.shard_caches.get((self.app, stream))

    def shard_cache_unreadable(self, stream: str) -> bool:
        return False  # nothing but this store writes its items: none is ever unreadable

    async def save_shard_cache(self, cache: ShardCache, expected_digest: str | None) -> bool:
        # Read back as the DynamoDB store's body is: shards sorted, a frozen copy of its own.
        stored = ShardCache.from_json(cache.stream, cache.to_json())
        await _io()
        with self._tables.lock:
            current = self._tables.shard_caches.get((self.app, cache.stream))
            held = (
                current is None
                if expected_digest is None
                else (current is not None and current.digest == expected_digest)
            )
            if not held:
                return False
            self._tables.shard_caches[(self.app, cache.stream)] = stored
        self._known_digests[cache.stream] = stored.digest
        return True

    async def cached_streams(self) -> list[str]:
        await _io()
        with self._tables.lock:
            return sorted(s for app, s in self._tables.shard_caches if app == self.app)

    # -- checkpoints --------------------------------------------------------------------------
    async def get_checkpoints(
        self, stream: str, shard_ids: Iterable[str] | None = None
    ) -> dict[str, Checkpoint]:
        await _io()
        wanted = None if shard_ids is None else set(shard_ids)
        with self._tables.lock:
            return {
                shard: checkpoint
                for (app, s, shard), checkpoint in self._tables.checkpoints.items()
                if app == self.app and s == stream and (wanted is None or shard in wanted)
            }

    def checkpoint_unreadable(self, stream: str, shard_id: str) -> bool:
        return False  # nothing but this store writes its items: none is ever unreadable

    async def claim(
        self, stream: str, shard_id: str, client_id: str, seen: Checkpoint | None
    ) -> Checkpoint | None:
        await _io()
        key = (self.app, stream, shard_id)
        with self._tables.lock:
            current = self._tables.checkpoints.get(key)
            if seen is None:
                held = current is None
            else:
                held = (
                    current is not None
                    and current.owner == seen.owner
                    and current.lease == seen.lease
                )
            if not held:
                return None
            base = current or Checkpoint(stream, shard_id)
            claimed = dataclasses.replace(
                base,
                owner=client_id,
                lease=(seen.lease if seen else 0) + 1,
                last_update_ms=_now_ms(),
            )
            self._tables.checkpoints[key] = claimed
            return claimed

    def _fenced(self, checkpoint: Checkpoint) -> Checkpoint | None:
        """The stored checkpoint if ``checkpoint``'s owner still holds it under its lease (the
        DynamoDB condition ``#owner = :me AND #lease = :lease``); call with the lock held."""
        key = (self.app, checkpoint.stream, checkpoint.shard_id)
        current = self._tables.checkpoints.get(key)
        if current is None or current.owner is None:
            return None
        if current.owner != (checkpoint.owner or "") or current.lease != checkpoint.lease:
            return None
        return current

    async def write_checkpoint(
        self,
        checkpoint: Checkpoint,
        position: Position | None,
        *,
        finished: bool = False,
        release: bool = False,
        done: bytes | None = None,
    ) -> bool:
        await _io()
        with self._tables.lock:
            current = self._fenced(checkpoint)
            if current is None:
                return False
            changes: dict[str, object] = {"last_update_ms": _now_ms()}
            if position is not None:
                changes["sequence_number"] = position.sequence_number
                changes["sub_sequence_number"] = position.sub_sequence_number
            if finished:
                changes["finished"] = True
            if release:
                changes["owner"] = None
            if done is not None:
                changes["done"] = bytes(done)
            written = dataclasses.replace(current, **changes)  # type: ignore[arg-type]
            self._tables.checkpoints[(self.app, current.stream, current.shard_id)] = written
            return True

    async def record_start(self, checkpoint: Checkpoint, started_at_ms: int) -> bool:
        await _io()
        with self._tables.lock:
            current = self._fenced(checkpoint)
            if current is None:
                return False
            started = current.started_at_ms if current.started_at_ms is not None else started_at_ms
            written = dataclasses.replace(current, started_at_ms=started, last_update_ms=_now_ms())
            self._tables.checkpoints[(self.app, current.stream, current.shard_id)] = written
            return True

    async def move_checkpoint(
        self, stream: str, shard_id: str, seen: Checkpoint | None, position: Position | None
    ) -> bool:
        """An operator's move (``position``) or removal (None) of a checkpoint, if it is still
        as ``seen`` (None: there is none): the lease bumped and the owner, ``finished``, the
        start and the done records removed, as the DynamoDB store's."""
        await _io()
        key = (self.app, stream, shard_id)
        with self._tables.lock:
            current = self._tables.checkpoints.get(key)
            if seen is None:
                if current is not None:
                    return False
                moved = Checkpoint(stream, shard_id, lease=1, last_update_ms=_now_ms())
            else:
                if current is None or current.lease != seen.lease or current.owner != seen.owner:
                    return False
                moved = Checkpoint(stream, shard_id, lease=seen.lease + 1, last_update_ms=_now_ms())
            if position is not None:
                moved = dataclasses.replace(
                    moved,
                    sequence_number=position.sequence_number,
                    sub_sequence_number=position.sub_sequence_number,
                )
            self._tables.checkpoints[key] = moved
            return True

    # -- broadcast members' own positions -----------------------------------------------------
    async def open_broadcast_session(self, client_id: str) -> int:
        await _io()
        with self._tables.lock:
            session = self._tables.sessions.get((self.app, client_id), 0) + 1
            self._tables.sessions[(self.app, client_id)] = session
            return session

    async def broadcast_positions(self, client_id: str) -> dict[tuple[str, str], SavedPosition]:
        await _io()
        with self._tables.lock:
            return {
                (stream, shard): SavedPosition(
                    stream, shard, saved.position, saved.started_at_ms, saved.finished
                )
                for (app, cid, stream, shard), saved in self._tables.positions.items()
                if app == self.app and cid == client_id
            }

    async def save_broadcast_position(
        self, client_id: str, session: int, saved: SavedPosition
    ) -> bool:
        await _io()
        key = (self.app, client_id, saved.stream, saved.shard_id)
        with self._tables.lock:
            current = self._tables.positions.get(key)
            if current is not None and current.session > session:
                return False
            written = _Position(session) if current is None else dataclasses.replace(current)
            written.session = session
            if saved.position is not None:
                written.position, written.started_at_ms = saved.position, None
            elif saved.started_at_ms is not None:
                written.started_at_ms = saved.started_at_ms
            written.finished = written.finished or saved.finished
            self._tables.positions[key] = written
            return True

    # -- the Spark source's items -------------------------------------------------------------
    async def ledger_entry(
        self, query: str, batch: int, stream: str, shard_id: str
    ) -> LedgerEntry | None:
        await _io()
        with self._tables.lock:
            return self._tables.ledger.get((self.app, query, batch, stream, shard_id))

    async def add_ledger_entry(
        self, query: str, entry: LedgerEntry, ttl_seconds: int
    ) -> LedgerEntry:
        await _io()
        key = (self.app, query, entry.batch, entry.stream, entry.shard_id)
        with self._tables.lock:
            held = self._tables.ledger.get(key)
            if held is not None:
                return held
            # Read back as the DynamoDB item is: an empty owner is stored as "-".
            self._tables.ledger[key] = dataclasses.replace(entry, owner=entry.owner or "-")
            return entry

    async def ledger_batch(self, query: str, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        await _io()
        with self._tables.lock:
            return {
                (stream, shard): entry
                for (app, q, b, stream, shard), entry in self._tables.ledger.items()
                if app == self.app and q == query and b == batch
            }

    async def delete_ledger_before(self, query: str, batch: int) -> int:
        await _io()
        app = self.app
        with self._tables.lock:
            return _drop(self._tables.ledger, lambda k: k[:2] == (app, query) and k[2] < batch)

    async def forget_ledger(self, query: str) -> int:
        await _io()
        app = self.app
        with self._tables.lock:
            return _drop(self._tables.ledger, lambda k: k[:2] == (app, query))

    async def latest_pin(self, stream: str, shard_id: str) -> int | None:
        await _io()
        with self._tables.lock:
            return self._tables.pins.get((self.app, stream, shard_id))

    async def add_latest_pin(
        self, stream: str, shard_id: str, started_at_ms: int, written_at_ms: int
    ) -> int:
        await _io()
        with self._tables.lock:
            return self._tables.pins.setdefault((self.app, stream, shard_id), started_at_ms)

    async def latest_pins(self, stream: str) -> dict[str, int]:
        await _io()
        with self._tables.lock:
            return {
                shard: pin
                for (app, s, shard), pin in self._tables.pins.items()
                if app == self.app and s == stream
            }

    async def forget_latest_pin(self, stream: str, shard_id: str, started_at_ms: int) -> bool:
        await _io()
        key = (self.app, stream, shard_id)
        with self._tables.lock:
            held = self._tables.pins.get(key)
            if held is not None and held != started_at_ms:
                return False
            self._tables.pins.pop(key, None)
            return True

    async def forget_group(self, streams: Iterable[str]) -> int:
        await _io()
        wanted = set(streams)
        tables, app = self._tables, self.app
        with tables.lock:
            return (
                _drop(tables.clients, lambda k: k[0] == app)
                + _drop(tables.shard_caches, lambda k: k[0] == app)
                + _drop(tables.heads, lambda k: k == app)
                + _drop(tables.member_lists, lambda k: k[0] == app)
                + _drop(tables.pins, lambda k: k[0] == app)
                + _drop(tables.checkpoints, lambda k: k[0] == app and k[1] in wanted)
            )


def _drop(items: dict[K, V], doomed: Callable[[K], bool]) -> int:
    """Delete the entries of ``items`` whose key is ``doomed``; returns how many."""
    keys = [key for key in items if doomed(key)]
    for key in keys:
        del items[key]
    return len(keys)


def _published(members: PublishedMembers) -> PublishedMembers:
    """``members`` as a published list reads back: live members without their stamps, sorted
    by id, the verdicts copied (and always present: this version writes them)."""
    live = [
        ClientInfo(c.client_id, 0, streams=frozenset(c.streams), assignment=c.assignment)
        for c in sorted(members.live, key=lambda c: c.client_id)
    ]
    return PublishedMembers(live, dict(members.dead), True)


if TYPE_CHECKING:  # mypy holds MemoryState to the protocol a member is given
    _AS_GROUP_STATE: GroupState = MemoryState()
