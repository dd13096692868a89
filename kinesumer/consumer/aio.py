"""AsyncKinesumer: the consumer group as an async iterator (aioboto3 underneath).

Everything that is not about awaiting lives in :mod:`.base`; this face awaits the engine on the
application's own event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any

from ..errors import ConsumerClosedError
from ..handlers.options import Batch
from ..handlers.tasks import TaskRunner
from ..models import Record
from ..topics import Topic
from .base import CLOSE, COMMIT, CONSUME, POLL, REFRESH, RUN, SUBSCRIBE, BaseKinesumer, shared_doc


class AsyncKinesumer(BaseKinesumer):
    """A member of a consumer group, for asyncio applications.

    ::

        async with AsyncKinesumer(config) as consumer:
            async for record in consumer.consume(["orders"]):
                await handle(record)

    When a record counts as processed, and the hooks: see
    :class:`~kinesumer.consumer.base.BaseKinesumer`.
    """

    _handlers_are_async = True

    def _here(self) -> object:
        return asyncio.current_task()

    @shared_doc(CONSUME)
    async def consume(self, streams: Iterable[str]) -> AsyncIterator[Record]:
        names = self._stream_names(streams, "consume")
        engine = self._engine
        await engine.start(names)
        self._iterating_here()
        cursor = engine.cursor
        while True:
            record = cursor.next_local()
            if record is None:
                try:
                    lease, records = await engine.next_batch()
                except ConsumerClosedError:
                    return
                cursor.set_batch(lease, records)
                continue
            yield record

    @shared_doc(RUN)
    async def run(
        self,
        streams: Topic[Any] | Iterable[str | Topic[Any]],
        handler: Callable[..., Any],
        *,
        concurrency: int = 1,
        ordering: str = "shard",
        max_in_flight: int | None = None,
        batch: Batch | None = None,
        on_failure: object = None,
        decode: object = None,
        sink: object = None,
        name: str | None = None,
        max_record_age: float | None = None,
    ) -> None:
        arguments = {
            "concurrency": concurrency,
            "ordering": ordering,
            "max_in_flight": max_in_flight,
            "batch": batch,
            "on_failure": on_failure,
            "decode": decode,
            "sink": sink,
            "name": name,
            "max_record_age": max_record_age,
        }
        options, invocation, names, writes_to = self._prepare_run(streams, handler, arguments, True)
        try:
            try:
                await self._engine.start(names, writes_to)
            except ConsumerClosedError:
                return  # aclose() from another task while joining: nothing was handled
            runner = TaskRunner(
                self._engine,
                options,
                invocation,
                lambda discard: self.aclose(discard=discard),
                handler,
                self._handled[options.name],
                self._added,
            )
            await runner.run()
        finally:
            try:
                await invocation.close_async()
                for added in self._added.every:
                    await added.invocation.close_async()
                if options.sink is not None:
                    await options.sink.close_async()
            finally:
                self._end_run()

    @shared_doc(SUBSCRIBE)
    async def subscribe(self, streams: Iterable[str]) -> None:
        await self._engine.start(self._stream_names(streams, "subscribe"))

    @shared_doc(POLL)
    async def poll(self, max_records: int = 1000, timeout: float = 1.0) -> list[Record]:
        self._check_subscribed()
        return await self._engine.poll(max_records, timeout)

    @shared_doc(COMMIT)
    async def commit(self) -> None:
        await self._engine.commit()

    @shared_doc(REFRESH)
    async def refresh(self, streams: Iterable[str]) -> None:
        await self._engine.start(self._stream_names(streams, "refresh"))

    @shared_doc(CLOSE)
    async def aclose(self, *, discard: bool = False) -> None:
        await self._engine.close(in_hand_done=self._in_hand_done(), discard=discard)

    async def __aenter__(self) -> AsyncKinesumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving on an exception: the record in hand was not processed; do not checkpoint it.
        await self.aclose(discard=exc_type is not None)
