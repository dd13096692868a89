"""AsyncProducer: the asyncio face over the same core as :class:`~kinesumer.Producer`.

``await producer.put(...)`` waits only for buffer room and returns an asyncio future of the
record's :class:`~.records.PutResult`; ``await`` that for where it landed.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from ..errors import ProducerClosedError
from ..topics import Topic
from .base import BaseProducer
from .records import MAX_RECORD_BYTES, PutResult


class AsyncProducer(BaseProducer):
    """Puts records to Kinesis from asyncio code. ::

        async with AsyncProducer(region="eu-west-1") as producer:
            future = await producer.put("orders", b'{"id": 1}', partition_key="order-1")
            await producer.flush()
        result = await future             # PutResult(shard_id, sequence_number, 0)

    Use it on one event loop. Settings: see :class:`~kinesumer.producer.base.BaseProducer`.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._opened = False

    async def start(self) -> None:
        """Open the Kinesis client, unless given ``kinesis=`` (the first ``put`` does it when
        needed)."""
        if not self._opened:
            self._opened = True
            await self._core.open()

    async def put(
        self,
        stream: str | Topic[Any],
        data: Any,
        *,
        partition_key: str,
        explicit_hash_key: str | None = None,
        block: bool | None = None,
    ) -> asyncio.Future[PutResult]:
        """Queue one record once the buffer has room (or raise
        :class:`~kinesumer.errors.BufferFullError` with ``block=False``); the returned future
        resolves to where it landed, or to its error. Arguments: as ``Producer.put``."""
        if self._core.closed:
            raise ProducerClosedError("this producer was closed; create a new one")
        await self.start()
        future: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
        record = self._record(stream, data, partition_key, explicit_hash_key, future)
        if record.size > MAX_RECORD_BYTES:
            await self._core.check_large(record)
        await self._core.admit_async(record.size, self.options.block if block is None else block)
        self._core.submit(record)
        return future

    async def flush(self) -> None:
        """Wait until every record put so far is written or failed; FlushError if any failed
        since the last flush."""
        if self._opened:
            await self._core.flush()

    async def close(self) -> None:
        """Flush, then stop (idempotent); FlushError if records failed."""
        if self._opened and not self._core.closed:
            await self._core.close()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
