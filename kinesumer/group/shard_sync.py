"""Shard sync: the streams' shard lists (with lineage) as the group shares them.

The leader lists every stream's shards each ``shard_sync_interval`` and writes the shard cache
when it changed; every member loads a cache whose digest moved. A member that read a shard to
its end asks for a sync of that stream at the next tick (:meth:`ShardSync.request`), so children
appear without waiting for the leader. :meth:`ShardSync.start_of` says where a claimed shard
starts and which parents must finish first (parents before children).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from ..config import InitialPosition
from ..core import has_known_parent, parents_pending
from ..errors import TransientAWSError
from ..kinesis.reader import KinesisReader
from ..models import Shard
from ..statestore.base import ShardCache, StateStore

log = logging.getLogger("kinesumer.coordinator")


@dataclass(frozen=True)
class ShardStart:
    """Where a claimed shard with no checkpoint starts, and its parents still listed (each
    checked finished in the table before the shard is read)."""

    shard: Shard
    initial: InitialPosition
    pending_parents: tuple[str, ...]


class ShardSync:
    def __init__(
        self,
        client_id: str,
        initial_position: InitialPosition,
        store: StateStore,
        reader: KinesisReader,
    ) -> None:
        self.client_id = client_id
        self._initial_position = initial_position
        self._store = store
        self._reader = reader
        self.caches: dict[str, ShardCache] = {}
        self._digests: dict[str, str] = {}
        self._requests: set[str] = set()
        self._last_full_sync = float("-inf")
        #: Per stream: parents no longer listed -> whether the group holds a checkpoint of it.
        self._aged_out: dict[str, dict[str, bool]] = {}

    def request(self, stream: str) -> None:
        """Ask for a shard sync of ``stream`` at the next tick (after a SHARD_END, so children
        appear without waiting for the leader's periodic sync)."""
        self._requests.add(stream)

    def due(self, interval: float) -> bool:
        """Whether the leader's periodic sync of every stream is due."""
        return time.monotonic() - self._last_full_sync >= interval

    def synced_all(self) -> None:
        """The leader's periodic sync was done now."""
        self._last_full_sync = time.monotonic()

    async def refresh(self, streams: Iterable[str], to_sync: set[str]) -> None:
        """Bring the local shard caches up to date; write the cache of any stream in ``to_sync``
        (or without a cache at all) from ListShards. Requested syncs are included."""
        streams = tuple(streams)
        for stream in sorted(to_sync | self._requests):
            await self.sync_stream(stream)
            self._requests.discard(stream)
        digests = await self._store.shard_cache_digests(streams)
        for stream in streams:
            digest = digests.get(stream)
            if digest is None:
                await self.sync_stream(stream)
                continue
            if self._digests.get(stream) != digest:
                cache = await self._store.load_shard_cache(stream)
                if cache is not None:
                    self.caches[stream] = cache
                    self._digests[stream] = cache.digest

    async def sync_stream(self, stream: str) -> None:
        """List the stream's shards, learn which closed ones the group finished, and write the
        cache if it changed. The write is conditional on the digest we started from, so two
        writers cannot overwrite each other's newer view."""
        shards = await self._reader.list_shards(stream)
        listed = {s.shard_id for s in shards}
        closed = [s.shard_id for s in shards if s.closed]
        # Parents no longer listed aged out of retention. If the group holds a checkpoint of
        # one, it followed that lineage (it read the parent, or was reading it while it aged
        # out): its children start at TRIM_HORIZON like any child, or every record written to
        # them since the reshard would be skipped at a LATEST start. A parent the group holds
        # nothing of leaves its child a root (a new app at LATEST does not replay retention).
        # Each aged-out parent is looked up once per leader (a stream resharded long ago names
        # one for every shard: reading them at every sync would cost a read unit each).
        aged_out = {p for s in shards for p in s.parents if p not in listed}
        held = {p: v for p, v in self._aged_out.get(stream, {}).items() if p in aged_out}
        unknown = sorted(aged_out - set(held))
        wanted = closed + unknown
        checkpoints = await self._store.get_checkpoints(stream, wanted) if wanted else {}
        held.update({p: p in checkpoints for p in unknown})
        self._aged_out[stream] = held
        finished = frozenset(sid for sid, c in checkpoints.items() if c.finished) | {
            p for p, followed in held.items() if followed
        }
        cache = ShardCache(stream, tuple(shards), finished)
        current = self._digests.get(stream)
        if current is None:
            digests = await self._store.shard_cache_digests([stream])
            current = digests.get(stream)
        # An unreadable head (another app may write the table) is replaced by the fresh list.
        if cache.digest != current or self._store.shard_cache_unreadable(stream):
            if await self._store.save_shard_cache(cache, current):
                log.info(
                    "[%s] shard cache of %s: %d shards, %d finished",
                    self.client_id,
                    stream,
                    len(shards),
                    len(finished),
                )
            else:
                return  # someone else wrote a newer one: load it at the next tick
        self.caches[stream] = cache
        self._digests[stream] = cache.digest

    def start_of(self, key: tuple[str, str]) -> ShardStart:
        """A child of a reshard starts at TRIM_HORIZON (its records follow its parents'), any
        other shard at the configured initial position; both after their parents finished."""
        stream, shard_id = key
        cache = self.caches[stream]
        listed = cache.by_id()
        shard = listed.get(shard_id, Shard(shard_id))
        initial: InitialPosition = (
            "TRIM_HORIZON"
            if has_known_parent(shard, listed, cache.finished)
            else self._initial_position
        )
        # Every listed parent is checked in the table, even one the cache shows finished: the
        # cache can be behind the items, where an operator reopened a parent (a rewind to
        # before the reshard, ``checkpoints set``) and the cache is rewritten only after.
        # Trusting it, a child lost to the rewind and claimed again could be read before its
        # reopened parent. The cost: one read when a child is claimed.
        pending = tuple(parents_pending(shard, listed, finished=()))
        return ShardStart(shard, initial, pending)

    def parents_check(
        self, key: tuple[str, str], start: ShardStart
    ) -> Callable[[], Awaitable[bool]]:
        """A check (one DynamoDB read while any parent is pending) that every parent of the
        shard is checkpointed finished. Transient errors count as "not yet"."""
        stream, shard_id = key
        pending = list(start.pending_parents)

        async def parents_finished() -> bool:
            if not pending:
                return True
            try:
                checkpoints = await self._store.get_checkpoints(stream, pending)
            except TransientAWSError as exc:
                log.warning("[%s] checking parents of %s: %s", self.client_id, shard_id, exc)
                return False
            return all(p in checkpoints and checkpoints[p].finished for p in pending)

        return parents_finished
