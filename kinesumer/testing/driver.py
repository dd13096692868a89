"""Handler tests without a server: :class:`HandlerDriver` calls a handler through the code
``run()`` calls it through, in memory, on a clock the test moves.

The same as ``run()``: the argument checks (``run_options``), the grouping of records into
calls (the per-key :class:`~kinesumer.handlers.scheduler.Scheduler`, with the batch size), and
every handler call (:class:`~kinesumer.handlers.invoke.Invocation`): typed decoding, retries
with backoff, the failure policy, dead-letter and retry-later envelopes (written by the real
writers, to an in-memory Kinesis), the outcome counters, the sink's transaction around the call,
and a policy that stops the run raising the handler's exception.

Not simulated: ``concurrency`` (one call at a time, in the scheduler's order), ``max_wait`` (a
batch is as full as the records given allow), and the engine (leases, checkpoints, handoffs,
rebalances; exactly-once commits are :class:`~.memory.MemorySink`'s list). Time is
:attr:`HandlerDriver.clock`: backoffs and retry-later delays move it instead of sleeping;
records a ``RetryLater`` policy sent to its stream come back, as the group would read them from
that stream, when :meth:`HandlerDriver.advance` moves the clock past their due time.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..config import Config
from ..handlers.counters import HandlerCounters
from ..handlers.deadletter import DeadLetterEnvelope, read_envelope
from ..handlers.dispatch import key_function
from ..handlers.invoke import CallEnvironment, Invocation
from ..handlers.options import Batch, run_options
from ..handlers.policies import HandlerFailedError, RetryLater
from ..handlers.retry_later import prepare
from ..handlers.scheduler import Scheduler
from ..handlers.stopping import AsyncCallEnds, SyncCallEnds
from ..models import Checkpoint, Record
from ..read.progress import ShardLease, shard_lease
from .kinesis import MemoryKinesis
from .memory import MemoryClients, MemorySink, VirtualClock, virtual_ends


class HandlerDriver:
    """Runs ``handler`` as ``run(streams, handler, **options)`` would; see the module docstring.

    ::

        driver = HandlerDriver(handle, decode=Order, on_failure=DeadLetter("orders-dlq"))
        driver.deliver([record({"id": 1}), record(b"not json")])
        assert driver.dead_letters("orders-dlq")[0].error_type == "DecodeError"

    ``sink``: any exactly-once sink (``DynamoDBTransactions()``) is replaced by a
    :class:`~.memory.MemorySink`, :attr:`sink`. An async handler is driven with
    :meth:`deliver_async` / :meth:`advance_async`.
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        ordering: str = "shard",
        batch: Batch | None = None,
        on_failure: object = None,
        decode: object = None,
        sink: object = None,
        name: str | None = None,
        config: Config | None = None,
        start: float | None = None,
    ) -> None:
        self.is_async = inspect.iscoroutinefunction(handler)
        self.sink = MemorySink() if sink is not None else None
        self.options = run_options(
            handler,
            concurrency=1,
            ordering=ordering,
            max_in_flight=None,
            batch=batch,
            on_failure=on_failure,
            decode=decode,
            sink=self.sink,
            name=name,
            is_async=self.is_async,
        )
        self.clock = VirtualClock(start)
        # Wall time, not the virtual clock: a test that moves the clock by days must still
        # find its dead letters (the virtual clock would age them past the retention).
        self.kinesis = MemoryKinesis(create_streams_on_put=True)
        self.counters = HandlerCounters(self.options.name)
        config = config or Config(app="kinesumer-testing", dynamodb_table="kinesumer-state")
        self.invocation = Invocation(
            handler,
            self.options,
            MemoryClients(config, self.kinesis),
            self.counters,
            self.is_async,
            client_id="driver",
            environment=CallEnvironment(
                clock=self.clock,
                uniform=lambda: 0.5,
                sync_ends=virtual_ends(self.clock, SyncCallEnds),
                async_ends=virtual_ends(self.clock, AsyncCallEnds),
                write_attempts=1,
            ),
        )
        self._leases: dict[tuple[str, str], ShardLease] = {}
        self._read_back: dict[str, int] = {}  # retry stream -> records of it delivered

    # ---- what happened -------------------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        """Records by outcome (``ok``, ``retried``, ``dead_letter``, ...), as ``run()`` counts."""
        return self.counters.snapshot()

    def written(self, stream: str) -> list[Record]:
        """The records put to ``stream`` (a dead-letter or retry-later stream)."""
        if stream not in self.kinesis.stream_names():
            return []
        return self.kinesis.records(stream)

    def dead_letters(self, stream: str) -> list[DeadLetterEnvelope]:
        """The envelopes put to ``stream``, decoded (see :mod:`kinesumer.handlers.deadletter`)."""
        return [read_envelope(r.data) for r in self.written(stream)]

    # ---- driving -------------------------------------------------------------------------

    def deliver(self, records: Iterable[Record]) -> None:
        """Hand ``records`` (in sequence order per shard) to the handler, call after call, until
        each is done: handled, discarded, or written to a dead-letter or retry-later stream.
        A policy that stops the run raises the handler's exception, as ``run()`` does."""
        if self.is_async:
            raise TypeError("an async handler: await driver.deliver_async(records)")
        for call in self._calls(records):
            try:
                self.invocation.call_sync(call, self._lease(call), _NEVER)
            except HandlerFailedError as failed:
                raise failed.error from failed

    async def deliver_async(self, records: Iterable[Record]) -> None:
        """:meth:`deliver` for an async handler."""
        never = asyncio.Event()
        for call in self._calls(records):
            try:
                await self.invocation.call_async(call, self._lease(call), never)
            except HandlerFailedError as failed:
                raise failed.error from failed

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, then deliver the retry-later records now due."""
        self.clock.advance(seconds)
        self.deliver(self._due())

    async def advance_async(self, seconds: float) -> None:
        """:meth:`advance` for an async handler."""
        self.clock.advance(seconds)
        await self.deliver_async(self._due())

    # ---- inside --------------------------------------------------------------------------

    def _calls(self, records: Iterable[Record]) -> Iterable[list[Record]]:
        options = self.options
        scheduler: Scheduler[Record] = Scheduler(
            options.ordering != "none",
            max_in_flight=1 << 30,
            batch_size=options.batch_size,
            one_key_per_call=options.sink is not None,
        )
        key = key_function(options.ordering)
        for each in records:
            scheduler.add(each, key(each))
        while (call := scheduler.take(force=True)) is not None:
            yield call.items
            scheduler.done(call)

    def _due(self) -> list[Record]:
        policy = self.options.on_failure
        if not isinstance(policy, RetryLater):
            return []
        written = self.written(policy.stream)
        pending = written[self._read_back.get(policy.stream, 0) :]
        due = []
        for each in pending:  # a stream is read in order: a record not due holds the rest
            if prepare(each, policy).due > self.clock.now:
                break
            due.append(each)
        self._read_back[policy.stream] = self._read_back.get(policy.stream, 0) + len(due)
        return due

    def _lease(self, call: list[Record]) -> ShardLease:
        key = (call[0].stream, call[0].shard_id)
        if key not in self._leases:
            self._leases[key] = shard_lease(Checkpoint(key[0], key[1], owner="driver", lease=1))
        return self._leases[key]


#: The run never stops while the driver delivers.
_NEVER = threading.Event()
