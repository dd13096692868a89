"""A group member committing what it reads through an exactly-once sink, for tests and benchmarks.

Two ways, on a real :class:`~kinesumer.AsyncKinesumer`:

- ``runner=True``: ``consumer.run(stream, handler, sink=..., batch=...)``, the library's own
  runner (the handler is called with a shard's batch and the sink's transaction object);
- otherwise a direct driver, for tests that need to hold a lease or call the sink themselves:
  it polls, groups a poll's records by shard (in order) and commits each group with
  ``sink.transact_async`` (or ``transact_sync`` on a worker thread) under the lease the records
  were delivered under, as the runner does. A lease that changed during the poll (lost and
  claimed again) has its records dropped; a :class:`~kinesumer.sinks.LeaseLostError` is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kinesumer import AsyncKinesumer, Config, Record
from kinesumer.consumer.base import engine_of
from kinesumer.handlers import Batch
from kinesumer.models import Position
from kinesumer.sinks import LeaseLostError

#: handler(records of one shard, tx); sync handlers for ``sync=True``.
Handler = Callable[[list[Record], Any], Any]
#: Seconds a member's start, crash or close may take before the test fails naming it.
STEP_TIMEOUT = 60.0
T = TypeVar("T")


def task_stacks() -> str:
    """Every pending task of the running loop with its stack: what a stuck await waits on."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        if not task.done():
            task.print_stack(limit=12, file=out)
    return out.getvalue()


async def bounded(step: Awaitable[T], what: str, timeout: float = STEP_TIMEOUT) -> T:
    """Await ``step`` for at most ``timeout`` seconds, else fail naming ``what`` with every
    pending task's stack (a hang then fails in seconds, not at the suite's timeout)."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        stacks = task_stacks()
        task.cancel()
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{stacks}")
    return task.result()


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
        runner: bool = False,
    ) -> None:
        self.consumer = AsyncKinesumer(config)
        self.engine = engine_of(self.consumer)
        sink.attach(self.engine)
        self.sink, self.handle, self.sync = sink, handle, sync
        self.stream, self.max_records, self.pace = stream, max_records, pace
        self.runner = runner
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
        if self.runner:
            await self._run_handler()
            return
        await self.consumer.subscribe([self.stream])
        while True:
            before = dict(self.engine.leases)
            records = await self.consumer.poll(self.max_records, 0.1)
            groups: dict[tuple[str, str], list[Record]] = {}
            for record in records:
                groups.setdefault((record.stream, record.shard_id), []).append(record)
            for key, group in groups.items():
                lease, earlier = self.engine.leases.get(key), before.get(key)
                if lease is None or (earlier is not None and lease is not earlier):
                    continue  # claimed again during the poll: the new lease reads them again
                await self._commit(lease, group)
            if self.pace:
                await asyncio.sleep(self.pace)

    async def _run_handler(self) -> None:
        async def handler(records: list[Record], tx: Any) -> None:
            result = self.handle(records, tx)
            if isinstance(result, Awaitable):
                await result
            if self.pace:
                await asyncio.sleep(self.pace)

        batch = Batch(max_size=self.max_records, max_wait=0.05)
        await self.consumer.run([self.stream], handler, concurrency=4, batch=batch, sink=self.sink)

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
        """Stop, then hand every shard off: ``run()`` lets its calls end; the direct driver
        stops at once, and what it was given and did not commit is the next owner's again."""
        name = self.engine.client_id
        if self.runner and self.task is not None:
            # run() returns once its calls ended and committed, and raises what stopped it.
            await bounded(self.consumer.aclose(), f"{name}'s aclose()")
            await bounded(asyncio.shield(self.task), f"{name}'s run() ending after aclose()")
            return
        await self._stop_task()
        await bounded(self.consumer.aclose(discard=True), f"{name}'s aclose(discard=True)")

    async def crash(self) -> None:
        """Die like a SIGKILLed process: no handoff, no final checkpoint, no deregistration."""
        await bounded(self.engine.abort(), f"{self.engine.client_id}'s engine.abort()")
        await self._stop_task()

    async def _stop_task(self) -> None:
        if self.task is not None:
            self.task.cancel()
            name = self.engine.client_id
            await bounded(asyncio.wait({self.task}), f"{name}'s loop ending, cancelled")
            # What stopped a crashed member's loop (its clients closed under it) does not matter.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                self.task.result()
