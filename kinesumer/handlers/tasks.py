"""``AsyncKinesumer.run``: the coroutine handler in up to ``concurrency`` tasks on the event loop.

The same bookkeeping as the thread runner (:mod:`.dispatch`): admit the engine's batches,
schedule per key, start a task per handler call while a slot is free, finish each call's
records in their low-water trackers. The runner wakes on one event: a batch arrived, a call
ended, or the batch timer ran out. ``concurrency=1``, ``ordering="shard"``, no batch, no sink:
the handler is awaited inline, record after record, as ``async for`` over ``consume()`` would.

It stops as :mod:`.threads` does: ``aclose()`` from another task (the in-flight calls end, then
``run`` returns), the policy stopping the run (close with discard, raise the handler's own
exception), or the engine failing (its error is raised). Cancelling ``run`` cancels its calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..errors import ConsumerClosedError
from ..models import Record
from ..read.engine import Engine
from ..read.progress import ShardLease
from ..runtime.supervisor import wait_done
from .counters import HandlerCounters
from .dispatch import Dispatch
from .options import RunOptions, calls_plainly
from .policies import AbandonedError, HandlerFailedError
from .progress import Entry
from .registry import HandlerSet, wanted
from .scheduler import Call
from .stopping import AsyncEngineStopping, engine_stopping
from .threads import is_inline

log = logging.getLogger("kinesumer.handlers")

#: How often the runner looks at the engine while nothing wakes it (a close that began).
_CHECK = 0.25


class AsyncInvocation(Protocol):
    """What the runner awaits (kinesumer.handlers.invoke.Invocation)."""

    async def call_async(
        self, records: list[Record], lease: ShardLease, stopping: asyncio.Event
    ) -> None: ...

    def observe(self, records: list[Record], lease: ShardLease) -> None: ...


class TaskRunner:
    """Runs one ``AsyncKinesumer.run``: built by the face once the member joined."""

    def __init__(
        self,
        engine: Engine,
        options: RunOptions,
        invocation: AsyncInvocation,
        close: Callable[[bool], Awaitable[None]],
        handler: Callable[[Any], Awaitable[object]],
        counters: HandlerCounters,
        added: HandlerSet | None = None,
    ) -> None:
        #: Handlers added while it runs (AsyncKinesumer.add_handler).
        self._added = added if added is not None else HandlerSet()
        self._engine = engine
        self._options = options
        self._invocation = invocation
        self._handler = handler
        self._counters = counters
        self._close = close  # the face's aclose(discard)
        #: Set when the run is stopping: a call backing off or blocking gives up (Abandoned).
        #: Reads as set once the engine stops, too (the inline runner has no one to watch it).
        self.stopping = AsyncEngineStopping(engine)

    async def run(self) -> None:
        if is_inline(self._options):
            if calls_plainly(self._options):
                await self._run_direct()
            else:
                await self._run_inline()
        else:
            await self._run_tasks()

    async def _run_direct(self) -> None:
        """Inline with the default policy and nothing around the call (see
        :func:`~.options.calls_plainly`): the handler itself, outcomes counted per batch."""
        engine, handler, counters = self._engine, self._handler, self._counters
        admit = engine.cursor.admit
        while True:
            try:
                lease, records = await engine.next_batch()
            except ConsumerClosedError:
                return
            if self._added.current:  # handlers were added: the full path, record by record
                if not await self._inline_batch(lease, records):
                    return
                continue
            progress = lease.progress
            handled = 0
            try:
                for record in records:
                    if not admit(lease, record):
                        break  # revoked or lost: the rest is the next owner's
                    if progress.skipping and progress.already_done(record):
                        progress.mark_processed(progress.delivered)  # type: ignore[arg-type]
                        continue  # the previous owner finished it
                    await handler(record)
                    handled += 1
                    # admit() set ``delivered`` to this record's position.
                    progress.mark_processed(progress.delivered)  # type: ignore[arg-type]
            except Exception as exc:
                counters.add("failed")
                await self._fail(HandlerFailedError(exc, record, self._options.name))
            finally:
                if handled:
                    counters.add("ok", handled)

    async def _run_inline(self) -> None:
        while True:
            try:
                lease, records = await self._engine.next_batch()
            except ConsumerClosedError:
                return
            if not await self._inline_batch(lease, records):
                return

    async def _inline_batch(self, lease: ShardLease, records: list[Record]) -> bool:
        """One engine batch, record by record: the handler, then the added handlers that want
        the record (see .registry). False: the run is over."""
        engine, call, stopping = self._engine, self._invocation.call_async, self.stopping
        admit = engine.cursor.admit
        added = self._added.current
        self._invocation.observe(records, lease)
        progress = lease.progress
        for record in records:
            if not admit(lease, record):
                break  # revoked or lost: the rest is the next owner's
            if progress.skipping and progress.already_done(record):
                progress.mark_processed(progress.delivered)  # type: ignore[arg-type]
                continue  # the previous owner finished it
            try:
                await call([record], lease, stopping)
                for handler, mine in wanted([(record, added)]):
                    await handler.invocation.call_async(mine, lease, stopping)
            except AbandonedError:
                # Closing (or failed), or the shard was handed off, while it waited: the
                # record stays undone (the next owner's); the handoff need not wait for it.
                progress.discard_delivered()
                if not engine_stopping(engine):
                    break
                if engine.failure is not None:
                    raise engine.failure from None
                return False
            except Exception as exc:
                await self._fail(exc)
            # admit() set ``delivered`` to this record's position.
            progress.mark_processed(progress.delivered)  # type: ignore[arg-type]
        return True

    async def _run_tasks(self) -> None:
        engine = self._engine
        loop = asyncio.get_running_loop()
        dispatch = Dispatch(
            self._options,
            engine.cursor,
            engine.config.max_buffered_records,
            self._added,
            engine.config.max_buffered_bytes,
        )
        wake = asyncio.Event()
        ended: list[tuple[Call[Entry], BaseException | None]] = []
        calls: set[asyncio.Task[None]] = set()
        fetch: asyncio.Task[tuple[ShardLease, list[Record]]] | None = None

        async def work(call: Call[Entry]) -> None:
            entries = call.items
            error: BaseException | None = None
            try:
                lease = entries[0].lease
                records = [entry.record for entry in entries]
                await self._invocation.call_async(records, lease, self.stopping)
                for handler, mine in wanted((entry.record, entry.added) for entry in entries):
                    await handler.invocation.call_async(mine, lease, self.stopping)
            except BaseException as exc:
                error = exc
            else:
                for entry in entries:
                    entry.tracker.finish(entry)
            ended.append((call, error))
            wake.set()

        try:
            while True:
                dispatch.admit()
                now = loop.time()
                while (call := dispatch.next_call(now)) is not None:
                    task = loop.create_task(work(call))
                    calls.add(task)
                    task.add_done_callback(calls.discard)
                for lease, why in dispatch.lost:
                    engine.checkpointer.lose(lease, why)
                dispatch.lost.clear()
                if dispatch.wants_records and fetch is None:
                    fetch = loop.create_task(engine.next_batch())
                    fetch.add_done_callback(lambda _: wake.set())
                if dispatch.stopping:
                    self.stopping.set()
                    if dispatch.running == 0:
                        dispatch.sweep()  # records abandoned last: the handoffs need not wait
                        break
                elif engine.lifecycle.closing_or_closed:
                    self.stopping.set()  # a blocked or backing-off call gives up
                wait = dispatch.wait_time(now)
                await wait_done(wake.wait(), _CHECK if wait is None else wait)
                wake.clear()
                dispatch.sweep()
                while ended:
                    dispatch.finished(*ended.pop())
                if fetch is not None and fetch.done():
                    got, fetch = fetch, None
                    try:
                        lease, records = got.result()
                        self._invocation.observe(records, lease)
                        dispatch.set_batch(lease, records)
                    except ConsumerClosedError:
                        dispatch.closed = True
                    except Exception as exc:  # the engine failed: raise it after the calls
                        dispatch.failure = dispatch.failure or exc
                        dispatch.closed = True
        except BaseException:
            self.stopping.set()
            for task in calls:
                task.cancel()
            if fetch is not None:
                fetch.cancel()
            raise
        if fetch is not None:
            fetch.cancel()
        if dispatch.failure is not None:
            await self._stop_with(dispatch)

    async def _fail(self, error: Exception) -> None:
        dispatch = Dispatch(self._options, self._engine.cursor)
        dispatch.failure = error
        await self._stop_with(dispatch)

    async def _stop_with(self, dispatch: Dispatch) -> None:
        """The run failed: close with discard (checkpoints stay at the low-water marks), then
        raise what failed."""
        error = dispatch.handler_error()
        if error is None:
            return
        if dispatch.failure is not self._engine.failure:
            try:
                await self._close(True)
            except Exception as exc:  # the handler's error is what the caller must see
                log.warning("closing after the handler failed did not finish: %r", exc)
        raise error
