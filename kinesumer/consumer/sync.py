"""Kinesumer: the consumer group as a blocking generator.

It drives the same asyncio engine as :class:`~kinesumer.AsyncKinesumer`, on a private event loop
in a background thread. Records cross threads a GetRecords batch at a time, so the per-record cost
on the application's thread is a lock and two attribute writes. Everything that is not about
blocking lives in :mod:`.base`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from ..config import Config
from ..errors import ConsumerClosedError
from ..group.hooks import Hook
from ..handlers.options import Batch
from ..handlers.threads import ThreadRunner
from ..models import Record
from ..statestore.base import GroupState
from ..topics import Topic
from .base import CLOSE, COMMIT, CONSUME, POLL, REFRESH, RUN, SUBSCRIBE, BaseKinesumer, shared_doc

T = TypeVar("T")


class Kinesumer(BaseKinesumer):
    """A member of a consumer group, for ordinary (blocking) Python.

    ::

        with Kinesumer(config) as consumer:
            for record in consumer.consume(["orders", "payments"]):
                handle(record)

    When a record counts as processed, and the hooks: see
    :class:`~kinesumer.consumer.base.BaseKinesumer`. :meth:`close` also stops the background
    thread.
    """

    def __init__(
        self,
        config: Config,
        *,
        topics: Iterable[str | Topic[Any]] | None = None,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
        state: GroupState | None = None,
    ) -> None:
        super().__init__(
            config, topics=topics, on_assigned=on_assigned, on_revoked=on_revoked, state=state
        )
        # The engine's event loop and its thread, started by the first call that needs them.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closing = threading.Lock()
        self._close_task: asyncio.Task[None] | None = None

    def _here(self) -> object:
        return threading.get_ident()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's loop (started on first use) and wait for its result."""
        return self._submit(coro).result()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on the engine's loop (started on first use); its future."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"kinesumer-{self.client_id}", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            if self._loop.is_closed():
                coro.close()
                raise ConsumerClosedError("this consumer was closed; create a new one")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @shared_doc(CONSUME)
    def consume(self, streams: Iterable[str]) -> Iterator[Record]:
        names = self._stream_names(streams, "consume")
        self._run(self._engine.start(names))
        return self._records()

    def _records(self) -> Iterator[Record]:
        self._iterating_here()
        cursor = self._engine.cursor
        next_batch = self._engine.next_batch
        while True:
            record = cursor.next_local()
            if record is None:
                try:
                    lease, records = self._run(next_batch())
                except ConsumerClosedError:
                    return
                cursor.set_batch(lease, records)
                continue
            yield record

    @shared_doc(RUN)
    def run(
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
        options, invocation, names, writes_to = self._prepare_run(
            streams, handler, arguments, False
        )
        try:
            try:
                self._run(self._engine.start(names, writes_to))
            except ConsumerClosedError:
                return  # close() from another thread while joining: nothing was handled
            runner = ThreadRunner(
                self._engine,
                options,
                invocation,
                self._submit,
                lambda discard: self.close(discard=discard),
                handler,
                self._handled[options.name],
                self._added,
            )
            runner.run()
        finally:
            try:
                invocation.close_sync()
                if options.sink is not None:
                    options.sink.close_sync()
            finally:
                self._end_run()

    @shared_doc(SUBSCRIBE)
    def subscribe(self, streams: Iterable[str]) -> None:
        self._run(self._engine.start(self._stream_names(streams, "subscribe")))

    @shared_doc(POLL)
    def poll(self, max_records: int = 1000, timeout: float = 1.0) -> list[Record]:
        self._check_subscribed()
        self._iterating_here()
        return self._run(self._engine.poll(max_records, timeout))

    @shared_doc(COMMIT)
    def commit(self) -> None:
        self._run(self._engine.commit())

    @shared_doc(REFRESH)
    def refresh(self, streams: Iterable[str]) -> None:
        self._run(self._engine.start(self._stream_names(streams, "refresh")))

    @shared_doc(CLOSE)
    def close(self, *, discard: bool = False) -> None:
        # One close at a time: a second one (run()'s caller leaving its ``with`` block while a
        # helper thread closes) waits for the first, then finds the loop closed. Unserialised,
        # it could submit to a loop that stops before running it, and wait forever.
        with self._closing:
            self._close(discard)

    def _close(self, discard: bool) -> None:
        if self._loop is None or self._loop.is_closed():
            self._engine.mark_closed()
            return
        closing = self._submit(self._close_on_loop(self._in_hand_done(), discard))
        try:
            closing.result()
        except BaseException:
            if not closing.done():  # interrupted (KeyboardInterrupt) while the close runs
                self._cancel_close()
            raise
        finally:
            loop, thread = self._loop, self._thread
            if thread is not None and thread.is_alive():
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=10)
            if not loop.is_running():
                loop.close()

    async def _close_on_loop(self, in_hand_done: bool, discard: bool) -> None:
        self._close_task = asyncio.current_task()
        await self._engine.close(in_hand_done=in_hand_done, discard=discard)

    def _cancel_close(self) -> None:
        """End an interrupted close as a cancelled one (the heartbeat halts, the clients close)
        before the loop stops: abandoned with the loop, it went on heartbeating for as long as
        the process lived (a notebook's interrupted cell), its shards unread."""

        async def cancel() -> None:
            task = self._close_task  # set: the close's task started before this one
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._submit(cancel()).result(timeout=60)

    def __enter__(self) -> Kinesumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving on an exception: the record in hand was not processed; do not checkpoint it.
        self.close(discard=exc_type is not None)
