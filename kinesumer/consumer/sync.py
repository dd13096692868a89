"""Kinesumer: the consumer group as a blocking generator.

It drives the same asyncio engine as :class:`~kinesumer.AsyncKinesumer`, on a private event loop
in a background thread. Records cross threads a GetRecords batch at a time, so the per-record cost
on the application's thread is a lock and two attribute writes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from ..config import Config, check_streams
from ..engine.engine import ConsumerStats, Engine
from ..engine.hooks import Hook, RebalanceHooks
from ..errors import ConsumerClosedError
from ..models import Record

T = TypeVar("T")


class Kinesumer:
    """A member of a consumer group, for ordinary (blocking) Python.

    ::

        with Kinesumer(config) as consumer:
            for record in consumer.consume(["orders", "payments"]):
                handle(record)

    With ``auto_commit=True`` (the default) a record counts as processed when the loop asks for
    the next one; with ``auto_commit=False`` when the application calls :meth:`commit`.
    """

    def __init__(
        self,
        config: Config,
        *,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"Kinesumer needs a kinesumer.Config, got {type(config).__name__}")
        self._engine = Engine(config, RebalanceHooks(on_assigned, on_revoked))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._consumer_thread: int | None = None
        self._lock = threading.Lock()

    @property
    def client_id(self) -> str:
        return self._engine.client_id

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
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
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def consume(self, streams: Iterable[str]) -> Iterator[Record]:
        """Join the group (or change streams), then yield records from this member's shards
        until :meth:`close`. Errors from the engine are raised here, in the caller's thread."""
        names = check_streams(streams)
        engine = self._engine
        self._run(engine.start(names))
        return self._records()

    def _records(self) -> Iterator[Record]:
        self._consumer_thread = threading.get_ident()
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

    def subscribe(self, streams: Iterable[str]) -> None:
        """Join the group for ``streams`` (or change them) without iterating: for :meth:`poll`."""
        self._run(self._engine.start(check_streams(streams)))

    def poll(self, max_records: int = 1000, timeout: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records from this member's shards, waiting at most ``timeout``
        seconds; after :meth:`subscribe`. In auto-commit mode a poll's records count as processed
        at the next poll; otherwise at :meth:`commit`."""
        if not self._engine.started:
            raise RuntimeError("call subscribe(streams) before poll()")
        self._consumer_thread = threading.get_ident()
        return self._run(self._engine.poll(max_records, timeout))

    def commit(self) -> None:
        """Mark every record delivered so far as processed and write the checkpoints now."""
        self._run(self._engine.commit())

    def refresh(self, streams: Iterable[str]) -> None:
        """Consume a different set of streams from now on."""
        self._run(self._engine.start(check_streams(streams)))

    def lag(self) -> dict[tuple[str, str], int | None]:
        """``(stream, shard_id)`` -> MillisBehindLatest of each shard this member reads."""
        return self._engine.lag()

    def stats(self) -> ConsumerStats:
        return self._engine.snapshot()

    def close(self, *, discard: bool = False) -> None:
        """Hand every shard off gracefully, leave the group and stop the background thread.

        Called from the thread that iterates (in auto-commit mode), the record it holds counts
        as processed; from another thread, the handoff waits up to ``handoff_timeout`` for it.
        With ``discard=True`` (the application failed on what it holds) only what was processed
        or committed is checkpointed and nothing is waited for; the rest is delivered again.
        """
        same_thread = self._consumer_thread == threading.get_ident()
        self._close(same_thread and self._engine.config.auto_commit, discard)

    def _close(self, in_hand_done: bool, discard: bool = False) -> None:
        if self._loop is None or self._loop.is_closed():
            self._engine.closed = True
            return
        try:
            self._run(self._engine.close(in_hand_done, discard))
        finally:
            loop, thread = self._loop, self._thread
            if thread is not None and thread.is_alive():
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=10)
            if not loop.is_running():
                loop.close()

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
