"""The clients a member's handlers write through, over the member's Kinesis transport.

Dead-letter and retry-later writers call a botocore-shaped ``put_record`` on a client from a
:class:`~kinesumer.aws.ClientFactory`: blocking from handler threads, awaited on the loop. A
member given its Kinesis (``Kinesumer(config, kinesis=...)``) hands them this factory instead,
so every record the group writes lands on the same transport it reads. A blocking call runs
the transport's coroutine on the member's event loop (the transport's clients, and an in-memory
stream's waiters, belong to that loop) and waits for it from the handler's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..aws.accounting import RequestStats
from ..aws.clients import ClientFactory
from ..config import Config
from .transport import KinesisTransport, PutRecordAnswer


class AsyncPutRecord:
    """The botocore-shaped PutRecord an async writer awaits."""

    def __init__(self, kinesis: KinesisTransport) -> None:
        self._kinesis = kinesis

    async def put_record(
        self, *, StreamName: str, Data: bytes, PartitionKey: str, **request: Any
    ) -> PutRecordAnswer:
        return await self._kinesis.put_record(
            StreamName, Data, PartitionKey, explicit_hash_key=request.get("ExplicitHashKey")
        )


class _BlockingPutRecord:
    """The botocore-shaped PutRecord a handler thread calls: the transport's call, run on the
    member's loop, waited for here."""

    def __init__(
        self, kinesis: KinesisTransport, loop_of: Callable[[], asyncio.AbstractEventLoop]
    ) -> None:
        self._kinesis = kinesis
        self._loop_of = loop_of

    def put_record(
        self, *, StreamName: str, Data: bytes, PartitionKey: str, **request: Any
    ) -> PutRecordAnswer:
        loop = self._loop_of()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # waiting here would stop the loop the call needs
            raise RuntimeError(
                "a blocking PutRecord through the member's Kinesis transport was called on the "
                "member's own event loop: call it from a handler thread, or await the async one"
            )
        call = self._kinesis.put_record(
            StreamName, Data, PartitionKey, explicit_hash_key=request.get("ExplicitHashKey")
        )
        return asyncio.run_coroutine_threadsafe(call, loop).result()


class TransportClientFactory(ClientFactory):
    """A :class:`~kinesumer.aws.ClientFactory` whose Kinesis clients put records through
    ``kinesis``. ``loop_of``: the member's event loop, asked at each blocking call (the member
    makes it when it starts). No other client (DynamoDB included) is made differently."""

    def __init__(
        self,
        config: Config,
        kinesis: KinesisTransport,
        loop_of: Callable[[], asyncio.AbstractEventLoop],
        stats: RequestStats | None = None,
        client_id: str | None = None,
    ) -> None:
        super().__init__(config, stats, client_id)
        self.transport = kinesis
        self._loop_of = loop_of

    def sync_kinesis(self, *, attempts: int | None = None) -> Any:
        return _BlockingPutRecord(self.transport, self._loop_of)

    @contextlib.asynccontextmanager
    async def kinesis(self) -> AsyncIterator[Any]:
        yield AsyncPutRecord(self.transport)
