"""A member that commits what it reads through an exactly-once sink, as ``run(sink=...)`` does.

Used by the sink tests and benchmarks: a real :class:`~kinesumer.AsyncKinesumer` polls, groups a
poll's records by shard (in order) and commits each group with ``sink.transact_async`` (or
``transact_sync`` on a worker thread), under the lease the records were delivered under. A lease
that changed during the poll (lost and claimed again) has its records dropped, as the runner
drops a lost lease's queued records; a :class:`~kinesumer.sinks.LeaseLostError` is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from kinesumer import AsyncKinesumer, Config, Record
from kinesumer.consumer.base import engine_of
from kinesumer.models import Position
from kinesumer.sinks import LeaseLostError

#: handler(records of one shard, tx); sync handlers for ``sync=True``.
Handler = Callable[[list[Record], Any], Any]


class SinkMember:
    def __init__(
        self,
        config: Config,
        stream: str,
        sink: Any,
        handle: Handler,
        *,
        sync: bool = False,
        max_records: int = 10,
        pace: float = 0.0,
    ) -> None:
        self.consumer = AsyncKinesumer(config)
        self.engine = engine_of(self.consumer)
        sink.attach(self.engine)
        self.sink, self.handle, self.sync = sink, handle, sync
        self.stream, self.max_records, self.pace = stream, max_records, pace
        self.task: asyncio.Task[None] | None = None
        self.committed = 0
        self.lost = 0

    def start(self) -> SinkMember:
        self.task = asyncio.create_task(self._run())
        return self

    def check(self) -> None:
        """Raise what stopped the member's loop, if anything did (a wait's predicate calls it)."""
        task = self.task
        if task is not None and task.done() and not task.cancelled() and task.exception():
            raise AssertionError(f"{self.engine.client_id} stopped") from task.exception()

    def owned(self) -> set[str]:
        return {s.shard_id for s in self.consumer.stats().shards if s.status == "active"}

    async def _run(self) -> None:
        await self.consumer.subscribe([self.stream])
        while True:
            before = dict(self.engine.leases)
            records = await self.consumer.poll(self.max_records, 0.1)
            groups: dict[tuple[str, str], list[Record]] = {}
            for record in records:
                groups.setdefault((record.stream, record.shard_id), []).append(record)
            for key, group in groups.items():
                lease = self.engine.leases.get(key)
                if lease is None or lease is not before.get(key):
                    continue  # claimed again during the poll: the new lease reads them again
                await self._commit(lease, group)
            if self.pace:
                await asyncio.sleep(self.pace)

    async def _commit(self, lease: Any, group: list[Record]) -> None:
        end = Position(group[-1].sequence_number, group[-1].sub_sequence_number)
        try:
            if self.sync:
                await asyncio.to_thread(
                    self.sink.transact_sync, lease, end, lambda tx: self.handle(group, tx)
                )
            else:

                async def body(tx: Any) -> None:
                    result = self.handle(group, tx)
                    if isinstance(result, Awaitable):
                        await result

                await self.sink.transact_async(lease, end, body)
            self.committed += len(group)
        except LeaseLostError:
            self.lost += 1

    async def close(self) -> None:
        """Stop polling, then hand every shard off; what was delivered and not committed is
        delivered again by the next owner (``discard``)."""
        await self._stop_task()
        await self.consumer.aclose(discard=True)

    async def crash(self) -> None:
        """Die like a SIGKILLed process: no handoff, no final checkpoint, no deregistration."""
        if self.task is not None:
            self.task.cancel()
        await self.engine.abort()
        await self._stop_task()

    async def _stop_task(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
