"""Producer: the blocking face, over the asyncio core on a private event loop in a thread.

``put`` checks the record, takes buffer room (waiting for it, or raising with ``block=False``)
and hands the record to the loop: it never waits for the network. The record's
``concurrent.futures.Future`` resolves to its :class:`~.records.PutResult` once written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from ..errors import ProducerClosedError
from ..topics import Topic
from .base import BaseProducer
from .futures import new_future
from .records import MAX_RECORD_BYTES, PutResult

T = TypeVar("T")


class Producer(BaseProducer):
    """Puts records to Kinesis from ordinary (blocking) Python. ::

        with Producer(region="eu-west-1") as producer:
            future = producer.put("orders", b'{"id": 1}', partition_key="order-1")
            producer.flush()              # everything put so far is written (or raises)
        future.result()                   # PutResult(shard_id, sequence_number, 0)

    Thread-safe: any number of threads may ``put``. Settings: see
    :class:`~kinesumer.producer.base.BaseProducer`.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kinesumer-producer", daemon=True
        )
        self._thread.start()
        self._close_lock = threading.Lock()
        self._run(self._core.open())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def put(
        self,
        stream: str | Topic[Any],
        data: Any,
        *,
        partition_key: str,
        explicit_hash_key: str | None = None,
        block: bool | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[PutResult]:
        """Queue one record; its future resolves to where it landed, or to its error.

        ``data``: bytes, or a value of the topic's type when ``stream`` is a
        :class:`~kinesumer.Topic` (or a stream of this producer's topics). ``block`` (default:
        the producer's): wait for buffer room (at most ``timeout`` seconds), or raise
        :class:`~kinesumer.errors.BufferFullError`. Bad input raises here:
        :class:`~kinesumer.errors.InvalidRecordError` / ``RecordTooLargeError`` (a record over
        1 MiB is checked against its stream's maximum record size, learned with one
        DescribeStreamSummary per stream: :mod:`kinesumer.producer.limits`). The future
        makes its lock on its first use (:mod:`kinesumer.producer.futures`): one unwatched
        future per buffered record costs the garbage collector one object, not ten.
        """
        if self._core.closed:
            raise ProducerClosedError("this producer was closed; create a new one")
        future: concurrent.futures.Future[PutResult] = new_future()
        record = self._record(stream, data, partition_key, explicit_hash_key, future)
        if record.size > MAX_RECORD_BYTES:
            if threading.current_thread() is self._thread:
                # A put from a future's done-callback runs on the loop: waiting for the loop
                # there would wait for itself, and every put and flush after it with it.
                self._core.check_large_known(record)
            else:
                self._run(self._core.check_large(record))
        self._core.admit(record.size, self.options.block if block is None else block, timeout)
        self._core.submit(record)
        return future

    def flush(self) -> None:
        """Wait until every record put so far is written or failed; raise
        :class:`~kinesumer.errors.FlushError` (counts by error) if any failed since the last
        flush."""
        if self._core.closed:
            raise ProducerClosedError("this producer was closed; create a new one")
        self._run(self._core.flush())

    def close(self) -> None:
        """Flush, then stop (idempotent). Raises FlushError if records failed; the producer is
        closed either way."""
        with self._close_lock:
            if self._loop.is_closed():
                return
            try:
                self._run(self._core.close())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
                self._loop.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
