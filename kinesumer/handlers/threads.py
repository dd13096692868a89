"""``Kinesumer.run``: the handler on the calling thread, or on a pool of worker threads.

The calling thread dispatches: it takes the engine's batches (a GetRecords batch at a time, from
the engine's event loop on its own thread), admits their records, and starts handler calls on a
:class:`~concurrent.futures.ThreadPoolExecutor` of ``concurrency`` workers as the scheduler allows
(:mod:`.dispatch`). It waits on one queue that hears everything: a batch arrived, a call ended.
A worker finishes its records in their low-water trackers itself, so a checkpoint can move as
soon as a call returns.

``concurrency=1``, ``ordering="shard"``, no batch, no sink: the handler runs inline on the
calling thread, one record after the other, with no pool and no queue: the same cost per record
as iterating ``consume()``.

How it stops:

- ``close()`` from another thread: the shards are handed off (each waits, up to
  ``handoff_timeout``, for its admitted records); once the engine is closed, the in-flight calls
  end and ``run()`` returns.
- the policy stops the run (``HandlerFailedError``): nothing more starts, the in-flight calls
  end, the consumer closes with discard (the checkpoints stay at the low-water marks, before the
  failing record) and ``run()`` raises the handler's own exception, with a note naming it and
  the record.
- the engine failed: the in-flight calls end and its error is raised.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from ..errors import ConsumerClosedError
from ..models import Record
from ..read.engine import Engine
from ..read.progress import ShardLease
from ..runtime.lifecycle import EngineState
from .counters import HandlerCounters
from .dispatch import Dispatch
from .options import RunOptions, calls_plainly
from .policies import AbandonedError, HandlerFailedError
from .progress import Entry
from .registry import HandlerSet, wanted
from .scheduler import Call
from .stopping import EngineStopping, engine_stopping

log = logging.getLogger("kinesumer.handlers")

Submit = Callable[[Coroutine[Any, Any, Any]], "Future[Any]"]

#: How often the dispatcher looks at the engine's state while nothing else wakes it: a close
#: that stopped the engine's loop before a request for records could run is seen this late.
_CHECK = 0.25


class SyncInvocation(Protocol):
    """What the runner calls (kinesumer.handlers.invoke.Invocation)."""

    def call_sync(
        self, records: list[Record], lease: ShardLease, stopping: threading.Event
    ) -> None: ...

    def observe(self, records: list[Record], lease: ShardLease) -> None: ...


def is_inline(options: RunOptions) -> bool:
    """One call at a time in shard order with nothing to gather: no pool needed."""
    return (
        options.concurrency == 1
        and options.ordering == "shard"
        and options.batch is None
        and options.sink is None
    )


class ThreadRunner:
    """Runs one ``Kinesumer.run``: built by the face once the member joined."""

    def __init__(
        self,
        engine: Engine,
        options: RunOptions,
        invocation: SyncInvocation,
        submit: Submit,
        close: Callable[[bool], None],
        handler: Callable[[Any], object],
        counters: HandlerCounters,
        added: HandlerSet | None = None,
    ) -> None:
        #: Handlers added while it runs (Kinesumer.add_handler).
        self._added = added if added is not None else HandlerSet()
        self._engine = engine
        self._options = options
        self._invocation = invocation
        self._handler = handler
        self._counters = counters
        self._submit = submit
        self._close = close  # the face's close(discard)
        #: Set when the run is stopping: a call backing off or blocking gives up (Abandoned).
        #: Reads as set once the engine stops, too (the inline runner has no one to watch it).
        self.stopping = EngineStopping(engine)

    def run(self) -> None:
        if is_inline(self._options):
            if calls_plainly(self._options):
                self._run_direct()
            else:
                self._run_inline()
        else:
            self._run_pooled()

    # -- the engine's batches ------------------------------------------------------------------
    def _request(self) -> Future[tuple[ShardLease, list[Record]]] | None:
        try:
            return self._submit(self._engine.next_batch())
        except ConsumerClosedError:
            return None

    def _engine_ended(self) -> bool:
        """The engine is closed or failed (its loop may be stopped: a request would never
        answer). Failed: its error is raised."""
        state = self._engine.state
        if state is EngineState.FAILED and self._engine.failure is not None:
            raise self._engine.failure
        return state is EngineState.CLOSED

    def _next_batch(self) -> tuple[ShardLease, list[Record]] | None:
        """The next batch, blocking; None once the consumer is closed."""
        future = self._request()
        if future is None:
            return None
        while True:
            try:
                return future.result(timeout=_CHECK)
            except ConsumerClosedError:
                return None
            except concurrent.futures.TimeoutError:
                if self._engine_ended():
                    future.cancel()
                    return None

    # -- inline --------------------------------------------------------------------------------
    def _run_direct(self) -> None:
        """Inline with the default policy and nothing around the call (see
        :func:`~.options.calls_plainly`): the handler itself, outcomes counted per batch."""
        handler, counters = self._handler, self._counters
        admit = self._engine.cursor.admit
        while True:
            got = self._next_batch()
            if got is None:
                return
            lease, records = got
            if self._added.current:  # handlers were added: the full path, record by record
                if not self._inline_batch(lease, records):
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
                    handler(record)
                    handled += 1
                    # admit() set ``delivered`` to this record's position.
                    progress.mark_processed(progress.delivered)  # type: ignore[arg-type]
            except Exception as exc:
                counters.add("failed")
                self._fail(HandlerFailedError(exc, record, self._options.name))
            finally:
                if handled:
                    counters.add("ok", handled)

    def _run_inline(self) -> None:
        while True:
            got = self._next_batch()
            if got is None:
                return
            if not self._inline_batch(*got):
                return

    def _inline_batch(self, lease: ShardLease, records: list[Record]) -> bool:
        """One engine batch, record by record: the handler, then the added handlers that want
        the record (see .registry). False: the run is over."""
        call, stopping = self._invocation.call_sync, self.stopping
        admit = self._engine.cursor.admit
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
                call([record], lease, stopping)
                for handler, mine in wanted([(record, added)]):
                    handler.invocation.call_sync(mine, lease, stopping)
            except AbandonedError:
                # Closing (or failed), or the shard was handed off, while it waited: the
                # record stays undone (the next owner's); the handoff need not wait for it.
                progress.discard_delivered()
                if not engine_stopping(self._engine):
                    break
                self._engine_ended()  # a failed engine's error is raised
                return False
            except Exception as exc:
                self._fail(exc)
            # admit() set ``delivered`` to this record's position.
            progress.mark_processed(progress.delivered)  # type: ignore[arg-type]
        return True

    # -- pooled --------------------------------------------------------------------------------
    def _run_pooled(self) -> None:
        options = self._options
        config = self._engine.config
        dispatch = Dispatch(
            options,
            self._engine.cursor,
            config.max_buffered_records,
            self._added,
            config.max_buffered_bytes,
        )
        events: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        pool = ThreadPoolExecutor(options.concurrency, thread_name_prefix="kinesumer-handler")
        request: Future[tuple[ShardLease, list[Record]]] | None = None
        engine = self._engine
        next_sweep = 0.0
        try:
            while True:
                dispatch.admit()
                now = time.monotonic()
                while (call := dispatch.next_call(now)) is not None:
                    pool.submit(self._work, call, events)
                if dispatch.lost:
                    self._tell_lost(dispatch)
                if dispatch.wants_records and request is None:
                    request = self._request()
                    if request is None:
                        dispatch.closed = True
                    else:
                        request.add_done_callback(lambda f: events.put(("batch", f, None)))
                if dispatch.stopping:
                    self.stopping.set()
                    if dispatch.running == 0:
                        dispatch.sweep()  # records abandoned last: the handoffs need not wait
                        break
                elif engine.lifecycle.closing_or_closed:
                    self.stopping.set()  # a blocked or backing-off call gives up
                wait = dispatch.wait_time(now)
                if now >= next_sweep:  # leases that ended: drop their queued records
                    dispatch.sweep()
                    next_sweep = now + _CHECK
                try:
                    kind, item, error = events.get(timeout=_CHECK if wait is None else wait)
                except queue.Empty:
                    if request is not None:
                        try:
                            if self._engine_ended():
                                dispatch.closed = True
                        except BaseException as exc:  # failed: raise it after the calls
                            dispatch.failure = dispatch.failure or exc
                            dispatch.closed = True
                    continue
                if kind == "done":
                    dispatch.finished(item, error)
                else:
                    request = None
                    try:
                        lease, records = item.result()
                        self._invocation.observe(records, lease)
                        dispatch.set_batch(lease, records)
                    except ConsumerClosedError:
                        dispatch.closed = True
                    except BaseException as exc:  # the engine failed: raise it after the calls
                        dispatch.failure = dispatch.failure or exc
                        dispatch.closed = True
        except BaseException:
            self.stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        if dispatch.failure is not None:
            self._stop_with(dispatch)

    def _work(self, call: Call[Entry], events: queue.SimpleQueue[tuple[str, Any, Any]]) -> None:
        """On a worker: one handler call; its records are finished here, then reported."""
        entries = call.items
        error: BaseException | None = None
        try:
            lease = entries[0].lease
            self._invocation.call_sync([entry.record for entry in entries], lease, self.stopping)
            for handler, mine in wanted((entry.record, entry.added) for entry in entries):
                handler.invocation.call_sync(mine, lease, self.stopping)
        except BaseException as exc:
            error = exc
        else:
            for entry in entries:
                entry.tracker.finish(entry)
        events.put(("done", call, error))

    def _tell_lost(self, dispatch: Dispatch) -> None:
        checkpointer = self._engine.checkpointer
        for lease, why in dispatch.lost:

            async def lose(lease: ShardLease = lease, why: str = why) -> None:
                checkpointer.lose(lease, why)

            with contextlib.suppress(ConsumerClosedError):  # closed: lost with the rest
                self._submit(lose())
        dispatch.lost.clear()

    def _fail(self, error: Exception) -> None:
        dispatch = Dispatch(self._options, self._engine.cursor)
        dispatch.failure = error
        self._stop_with(dispatch)

    def _stop_with(self, dispatch: Dispatch) -> None:
        """The run failed: close with discard (checkpoints stay at the low-water marks), then
        raise what failed."""
        error = dispatch.handler_error()
        if error is None:
            return
        if dispatch.failure is not None and dispatch.failure is not self._engine.failure:
            try:
                self._close(True)
            except Exception as exc:  # the handler's error is what the caller must see
                log.warning("closing after the handler failed did not finish: %r", exc)
        raise error
