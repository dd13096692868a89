"""The shard cache in the state table: each stream's shard list, compressed and chunked.

A stream's cache is one small head item (``sk=<stream>``: ``digest``, ``body``, ``chunks``) and
a body: zlib JSON split into chunk items under DynamoDB's 400 KB item limit
(``sk=<stream>#<digest>.<writer nonce>#<i>``), so 20,000 shards fit. Readers poll only the head
items and fetch a body when its digest changes. The body is written before the head points at
it, so no reader sees half; every write has its own chunk keys, so a writer that loses the race
deletes only its own chunks, and the winner deletes the body it replaced.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from ...errors import CorruptStateError
from ..base import ShardCache
from ..schema import SORT_KEY, shard_cache_pk
from . import codecs
from .attributes import attribute, corrupt
from .table import StateTable

#: Bytes of compressed body per chunk item: under the 400 KB item limit with room for the keys.
CHUNK_BYTES = 350_000

#: Most bytes a cache body may decompress to. 20,000 shards, every one with two parents and
#: half of them finished, make a 1.8 MB body (158 KB compressed): this is over four times that.
#: Anyone who can write to the table can write a body; a 306 KB chunk that inflated to 300 MB
#: raised a member's peak memory from 143 MB to 775 MB before the bound.
MAX_BODY_BYTES = 8 * 1024 * 1024

#: Most chunks a head may name: enough for a body of MAX_BODY_BYTES that does not compress at
#: all (zlib barely grows such input), so no valid body needs more; more is never read.
MAX_CHUNKS = -(-MAX_BODY_BYTES // CHUNK_BYTES)


class ShardCacheItems:
    """The shard cache items of one app in the state ``table``."""

    def __init__(self, table: StateTable, app: str) -> None:
        self._table = table
        self._app = app
        #: stream -> (digest, error) of the last body refused: not read again while the head
        #: still names it (a hostile body would otherwise be fetched again every tick).
        self._refused: dict[str, tuple[str | None, CorruptStateError]] = {}

    async def streams(self) -> list[str]:
        """Streams that have a shard cache: the head items, whose ``sk`` is the bare stream name
        (stream names cannot contain ``#``; the body chunks' keys do)."""
        items = await self._table.query(shard_cache_pk(self._app), projection=SORT_KEY)
        return sorted(i[SORT_KEY]["S"] for i in items if "#" not in i[SORT_KEY]["S"])

    async def digests(self, streams: Sequence[str]) -> dict[str, str]:
        """The current digest of each stream's cache (streams without one are left out; a head
        whose digest is unreadable gets :data:`UNREADABLE`, so that :meth:`load` reports it)."""
        keys = [codecs.shard_cache_key(self._app, s) for s in dict.fromkeys(streams)]
        items = await self._table.batch_get(keys, projection="sk, digest")
        found = {}
        for item in items:
            digest = item.get("digest", {}).get("S")
            found[item[SORT_KEY]["S"]] = digest if isinstance(digest, str) else UNREADABLE
        return found

    async def load(self, stream: str) -> ShardCache | None:
        """The stream's cache, None when there is none (or it was replaced while being read);
        :class:`CorruptStateError` naming the head when it cannot be read, before more than
        :data:`MAX_CHUNKS` chunks are read or more than :data:`MAX_BODY_BYTES` inflated. A head
        refused once is not read further while it stays the same (see :meth:`refused_digest`)."""
        head = await self._table.get(codecs.shard_cache_key(self._app, stream))
        if head is None:
            return None
        digest = head.get("digest", {}).get("S")
        refused = self._refused.get(stream)
        if refused is not None and isinstance(digest, str) and refused[0] == digest:
            raise refused[1]
        try:
            cache = await self._read(stream, head)
        except CorruptStateError as error:
            self._refused[stream] = (digest if isinstance(digest, str) else None, error)
            raise
        if cache is not None:
            self._refused.pop(stream, None)
        return cache

    def refused_digest(self, stream: str) -> str | None:
        """The digest of ``stream``'s head as last read, if it was refused as unreadable (None
        otherwise, or when even its digest is unreadable): a writer replaces that head."""
        refused = self._refused.get(stream)
        return None if refused is None else refused[0]

    def refused(self, stream: str) -> bool:
        """Whether ``stream``'s head was refused as unreadable at its last read."""
        return stream in self._refused

    async def _read(self, stream: str, head: dict[str, Any]) -> ShardCache | None:
        fix = "delete the item and the leader will write it again"
        body_key, chunks = codecs.decode_head(head)
        digest = attribute(head, "digest", "S")
        if not 0 < chunks <= MAX_CHUNKS:
            raise corrupt(head, f"{chunks} chunks (at most {MAX_CHUNKS}); {fix}")
        parts = []
        for index in range(chunks):
            chunk = await self._table.get(codecs.shard_cache_key(self._app, f"{body_key}#{index}"))
            if chunk is None:  # replaced while we read: the caller reads again next tick
                return None
            parts.append(attribute(chunk, "data", "B"))
        try:
            cache = ShardCache.from_json(stream, inflate(b"".join(parts)))
            checked(cache)
            if cache.digest != digest:
                raise ValueError("the body does not match the head's digest")
        except (zlib.error, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise corrupt(head, f"shard cache body cannot be read ({exc}); {fix}") from exc
        return cache

    async def save(self, cache: ShardCache, expected_digest: str | None) -> bool:
        """Write ``cache`` if the head still has ``expected_digest`` (None: no head yet), or,
        when the head was refused as unreadable, if it is still that head (a fresh listing
        replaces it); False when another writer got there first (its chunks stay, ours are
        deleted)."""
        expected_digest = self.refused_digest(cache.stream) or expected_digest
        digest = cache.digest
        body_key = f"{cache.stream}#{digest}.{uuid.uuid4().hex[:12]}"
        body = zlib.compress(cache.to_json(), 6)
        chunks = [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
        for index, chunk in enumerate(chunks):
            await self._table.put(codecs.chunk_item(self._app, body_key, index, chunk))
        head = codecs.shard_cache_head(
            self._app,
            cache.stream,
            digest=digest,
            body_key=body_key,
            chunks=len(chunks),
            shard_count=len(cache.shards),
        )
        old = await self._table.put_if(
            head, codecs.head_condition(expected_digest), return_old=True
        )
        if old is None:
            await self._delete_chunks(body_key, len(chunks))
            return False
        if "body" in old:
            try:
                replaced = codecs.decode_head(old)
            except CorruptStateError:
                return True  # a head of another app's making: its chunks are not ours to find
            await self._delete_chunks(*replaced)
        return True

    async def _delete_chunks(self, body_key: str, count: int) -> None:
        for index in range(min(count, MAX_CHUNKS)):
            await self._table.delete(codecs.shard_cache_key(self._app, f"{body_key}#{index}"))


#: The digest :meth:`ShardCacheItems.digests` gives a head whose own is unreadable: it matches
#: no cache, so the stream's cache is loaded (and reported) instead of silently kept.
UNREADABLE = "unreadable"


def inflate(body: bytes) -> bytes:
    """``body`` decompressed; ValueError once it would pass :data:`MAX_BODY_BYTES`, before it is
    inflated further (a few hundred KB of zlib can inflate to hundreds of MB)."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(body, MAX_BODY_BYTES + 1)
    if len(out) > MAX_BODY_BYTES or inflater.unconsumed_tail:
        raise ValueError(f"the body inflates past {MAX_BODY_BYTES} bytes")
    if not inflater.eof:
        raise ValueError("the compressed body is truncated")
    return out


def checked(cache: ShardCache) -> None:
    """TypeError when ``cache``'s ids are not all text: a cache of another app's making must
    not put numbers where the assignment and Kinesis calls expect shard ids."""
    for shard in cache.shards:
        if not all(isinstance(i, str) for i in (shard.shard_id, *shard.parents)):
            raise TypeError(f"shard {shard.shard_id!r} has an id or a parent that is not text")
    if not all(isinstance(i, str) for i in cache.finished):
        raise TypeError("a finished shard id is not text")
