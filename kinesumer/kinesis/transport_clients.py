"""The clients a member's handlers write through, over the member's Kinesis transport.

Dead-letter and retry-later writers call a botocore-shaped ``put_record`` on a client from a
:class:`~kinesumer.aws.ClientFactory`: blocking from handler threads, awaited on the loop. A
member given its Kinesis (``Kinesumer(config, kinesis=...)``) hands them this factory instead,
so every record the group writes lands on the same transport it reads. A blocking call runs
the transport's coroutine on the member's event loop (the transport's clients, and an in-memory
stream's waiters, belong to that loop) and waits for it from the handler's thread.

A member reading AWS hands them a :class:`RoutedClientFactory`: a write to a stream named by
name goes through the factory's own boto3/aiobotocore client, as before; a write to a stream
given by ARN goes through the member's routing transport, to the client of the ARN's account
and region (the role of ``Config.accounts``, the region's endpoint): a dead-letter stream of
another account lands there, not in the home account under the same name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from ..aws.accounting import RequestStats
from ..aws.clients import ClientFactory
from ..config import Config
from .transport import KinesisTransport, PutRecordAnswer


class PutsRecord(Protocol):
    """What the writers here call: a transport's PutRecord."""

    def put_record(
        self, stream: str, data: bytes, partition_key: str, *, explicit_hash_key: str | None = None
    ) -> Coroutine[Any, Any, PutRecordAnswer]: ...


class AsyncPutRecord:
    """The botocore-shaped PutRecord an async writer awaits."""

    def __init__(self, kinesis: PutsRecord) -> None:
        self._kinesis = kinesis

    async def put_record(
        self, *, StreamName: str, Data: bytes, PartitionKey: str, **request: Any
    ) -> PutRecordAnswer:
        return await self._kinesis.put_record(
            StreamName, Data, PartitionKey, explicit_hash_key=request.get("ExplicitHashKey")
        )


class _BlockingPutRecord:
    """The botocore-shaped PutRecord a handler thread calls: the transport's call, run on the
    member's loop, waited for here.

    A handler can outlive its member's loop (a call still running when ``close()`` stopped the
    loop): a write submitted to a loop that stopped would never run, and waiting for it would
    hang the handler's thread. So the wait is in slices that look at the loop, and a write the
    stopped loop will not run is made on a loop of this thread's own (as a blocking boto3 client
    would still make it). A write that had started on the member's loop may then be made twice:
    a dead letter is written at least once, never lost."""

    #: How often a waiting writer looks whether the member's loop still runs (seconds).
    LOOK_INTERVAL = 0.25

    def __init__(
        self, kinesis: PutsRecord, loop_of: Callable[[], asyncio.AbstractEventLoop]
    ) -> None:
        self._kinesis = kinesis
        self._loop_of = loop_of

    def put_record(
        self, *, StreamName: str, Data: bytes, PartitionKey: str, **request: Any
    ) -> PutRecordAnswer:
        def call() -> Coroutine[Any, Any, PutRecordAnswer]:
            hash_key = request.get("ExplicitHashKey")
            return self._kinesis.put_record(
                StreamName, Data, PartitionKey, explicit_hash_key=hash_key
            )

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
        if loop.is_closed() or not loop.is_running():
            return asyncio.run(call())
        future = asyncio.run_coroutine_threadsafe(call(), loop)
        while True:
            try:
                return future.result(timeout=self.LOOK_INTERVAL)
            except concurrent.futures.TimeoutError:
                if loop.is_running():
                    continue
            future.cancel()  # the stopped loop will not run it (nor this cancellation)
            return asyncio.run(call())


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


class _RoutedPutRecord:
    """PutRecord by ARN through ``by_arn``, by name through ``by_name`` (a botocore client)."""

    def __init__(self, by_name: Any, by_arn: Any) -> None:
        self._by_name = by_name
        self._by_arn = by_arn

    def put_record(self, *, StreamName: str, **request: Any) -> Any:
        target = self._by_arn if StreamName.startswith("arn:") else self._by_name
        return target.put_record(StreamName=StreamName, **request)


class RoutedClientFactory(ClientFactory):
    """A :class:`~kinesumer.aws.ClientFactory` whose Kinesis clients put to a stream ARN through
    ``routing_of()`` (the member's routing transport, asked at each put: it exists from the
    join on) on the member's loop (``loop_of``), and to a stream name as the plain factory's
    clients do."""

    def __init__(
        self,
        config: Config,
        routing_of: Callable[[], KinesisTransport],
        loop_of: Callable[[], asyncio.AbstractEventLoop],
        stats: RequestStats | None = None,
        client_id: str | None = None,
    ) -> None:
        super().__init__(config, stats, client_id)
        self._routing_of = routing_of
        self._loop_of = loop_of

    def sync_kinesis(self, *, attempts: int | None = None) -> Any:
        by_arn = _BlockingPutRecord(_Deferred(self._routing_of), self._loop_of)
        return _RoutedPutRecord(super().sync_kinesis(attempts=attempts), by_arn)

    @contextlib.asynccontextmanager
    async def kinesis(self) -> AsyncIterator[Any]:
        async with super().kinesis() as client:
            yield _RoutedPutRecord(client, AsyncPutRecord(_Deferred(self._routing_of)))


class _Deferred:
    """The put_record of the transport ``transport_of()`` gives when called (not before)."""

    def __init__(self, transport_of: Callable[[], KinesisTransport]) -> None:
        self._transport_of = transport_of

    def put_record(
        self, stream: str, data: bytes, partition_key: str, *, explicit_hash_key: str | None = None
    ) -> Coroutine[Any, Any, PutRecordAnswer]:
        return self._transport_of().put_record(
            stream, data, partition_key, explicit_hash_key=explicit_hash_key
        )
