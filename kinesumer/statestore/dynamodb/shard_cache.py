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

from ...errors import CorruptStateError
from ..base import ShardCache
from ..schema import SORT_KEY, shard_cache_pk
from . import codecs
from .table import StateTable

#: Bytes of compressed body per chunk item: under the 400 KB item limit with room for the keys.
CHUNK_BYTES = 350_000


class ShardCacheItems:
    """The shard cache items of one app in the state ``table``."""

    def __init__(self, table: StateTable, app: str) -> None:
        self._table = table
        self._app = app

    async def streams(self) -> list[str]:
        """Streams that have a shard cache: the head items, whose ``sk`` is the bare stream name
        (stream names cannot contain ``#``; the body chunks' keys do)."""
        items = await self._table.query(shard_cache_pk(self._app), projection=SORT_KEY)
        return sorted(i[SORT_KEY]["S"] for i in items if "#" not in i[SORT_KEY]["S"])

    async def digests(self, streams: Sequence[str]) -> dict[str, str]:
        """The current digest of each stream's cache (streams without one are left out)."""
        keys = [codecs.shard_cache_key(self._app, s) for s in dict.fromkeys(streams)]
        items = await self._table.batch_get(keys, projection="sk, digest")
        return {item[SORT_KEY]["S"]: item["digest"]["S"] for item in items}

    async def load(self, stream: str) -> ShardCache | None:
        head = await self._table.get(codecs.shard_cache_key(self._app, stream))
        if head is None:
            return None
        body_key, chunks = codecs.decode_head(head)
        body = b""
        for index in range(chunks):
            chunk = await self._table.get(codecs.shard_cache_key(self._app, f"{body_key}#{index}"))
            if chunk is None:  # replaced while we read: the caller reads again next tick
                return None
            body += chunk["data"]["B"]
        try:
            return ShardCache.from_json(stream, zlib.decompress(body))
        except (zlib.error, ValueError, KeyError, TypeError) as exc:
            pk = shard_cache_pk(self._app)
            raise CorruptStateError(
                f"shard cache of stream {stream!r} (item {pk}/{stream}) cannot be read: {exc}; "
                f"delete the item and the leader will write it again"
            ) from exc

    async def save(self, cache: ShardCache, expected_digest: str | None) -> bool:
        """Write ``cache`` if the head still has ``expected_digest`` (None: no head yet); False
        when another writer got there first (its chunks stay, ours are deleted)."""
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
            await self._delete_chunks(*codecs.decode_head(old))
        return True

    async def _delete_chunks(self, body_key: str, count: int) -> None:
        for index in range(count):
            await self._table.delete(codecs.shard_cache_key(self._app, f"{body_key}#{index}"))
