"""One handler call as the runner sees it: decode, call (inside the sink's transaction when there
is one), and on failure apply the failure policy, counting every outcome.

:class:`Invocation` is the runner's only way into the policies: the
runner calls :meth:`Invocation.call_sync` from worker threads, or :meth:`Invocation.call_async`
from tasks, with the records of one call. When the method returns, every record of the call is
done: handled, discarded, or written to a dead-letter or retry-later stream. It raises
:class:`~.policies.HandlerFailedError` when the policy stops the run,
:class:`~.policies.AbandonedError` when ``stopping`` was set, or the shard of all its records
was handed off, while it waited (records not done),
and lets the sink's own errors (``LeaseLostError``: the fenced commit was refused) through.

The decisions are made once, in :mod:`.policies` and :mod:`.retry_later`; the two faces below only
differ in how they sleep, call and write.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..aws.clients import ClientFactory
from ..errors import DecodeError
from ..models import Position, Record
from ..observability.telemetry import instrument_handler
from ..read.progress import ShardLease
from ..sinks.base import TransactionCanceledError, TransactionTooLargeError
from ..sinks.traced import traced_sink
from .age import KinesisClock
from .counters import HandlerCounters
from .deadletter import (
    WRITE_ATTEMPTS,
    AsyncDeadLetterWriter,
    DeadLetterWriteError,
    DeadLetterWriter,
)
from .decode import RecordDecoder, make_decoder
from .options import RunOptions
from .policies import (
    AbandonedError,
    RetryLater,
    after_failure,
    check_policy,
    describe,
)
from .reporting import CallReporter
from .retry_later import (
    Identity,
    Item,
    Step,
    Unit,
    due_time,
    end_of,
    halves,
    plan,
    prepare,
    unit_end,
    units,
)
from .stopping import AsyncCallEnds, SyncCallEnds

#: A sink's refusals caused by the handler's own writes (a condition of theirs failed, too many
#: of them): the handler's failure, through the policy. The fence's refusal (LeaseLostError) and
#: a commit whose outcome is unknown (other SinkErrors) are not, and pass through to the runner.
_HANDLERS_OWN = (TransactionCanceledError, TransactionTooLargeError)


class _HandlerRaised(Exception):
    """The handler itself raised ``error`` inside the sink's transaction (as opposed to the
    sink refusing the commit, which passes through)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


@dataclass(frozen=True)
class CallEnvironment:
    """What a handler call draws on besides the handler: the clock (epoch seconds) that retry
    waits and record ages are measured by, the random source of the backoff's jitter, what a
    waiting call waits on (the run stopping, the lease ending: :mod:`.stopping`), and the
    PutRecord tries per dead letter before the run stops. The defaults are production's."""

    clock: Callable[[], float] = time.time
    uniform: Callable[[], float] = random.random
    sync_ends: Callable[..., SyncCallEnds] = SyncCallEnds
    async_ends: Callable[..., AsyncCallEnds] = AsyncCallEnds
    write_attempts: int = WRITE_ATTEMPTS


class Invocation:
    """Calls ``handler`` under ``options`` (see the module docstring).

    ``aws``: the factory dead-letter writes use (the sync face a blocking client with the
    caller's own credentials, the async face an aiobotocore client, through ``role_arn`` when
    set). ``client_id``: the member's id, written in envelopes (default ``Config.client_id``).
    ``environment``: the clock, the jitter's random source, what a waiting call waits on and
    the dead-letter write tries (:class:`CallEnvironment`; the in-memory driver of
    :mod:`kinesumer.testing` passes a virtual one).
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        options: RunOptions,
        aws: ClientFactory,
        counters: HandlerCounters,
        is_async: bool,
        *,
        client_id: str | None = None,
        environment: CallEnvironment | None = None,
        refuse: Callable[[Record], Exception | None] | None = None,
    ) -> None:
        self.policy = check_policy(options.on_failure)
        self.name = options.name or getattr(handler, "__qualname__", None) or repr(handler)
        self.batched = options.batch is not None
        metrics = aws.stats.metrics if aws.stats is not None else None
        self.handler = instrument_handler(
            handler, self.name, self.batched, is_async, aws.config, metrics
        )
        decoder = options.decode
        self.decoder = decoder if isinstance(decoder, RecordDecoder) else make_decoder(decoder)
        self.sink = traced_sink(options.sink, aws)  # spans (telemetry.py): itself when off
        self.counters, self.is_async = counters, is_async
        env = environment or CallEnvironment()
        self.uniform, self.clock = env.uniform, env.clock
        self.sync_ends, self.async_ends = env.sync_ends, env.async_ends
        write_attempts = env.write_attempts
        policy = self.policy
        self.extra_streams: tuple[str, ...] = (
            (policy.stream,) if isinstance(policy, RetryLater) else ()
        )
        #: run(max_record_age) and what it is measured by (see .age), read leniently.
        self.max_age: float | None = getattr(options, "max_record_age", None)
        self.kinesis_clock = KinesisClock()
        self.bisect = bool(getattr(options.batch, "bisect_on_error", False))
        self.report = CallReporter(self.name, counters, self.policy, self.uniform)
        #: An added handler's key_of check (registry.KeyOfCheck): a record's error, if any.
        self.refuse = refuse
        special = self.sink is not None or self.extra_streams or refuse is not None
        self._plain = not (self.batched or special or self.max_age)
        config = aws.config
        self.identity = Identity(self.name, config.app, client_id or config.client_id or "")
        self._writer = DeadLetterWriter(aws, attempts=write_attempts)
        self._async_writer = AsyncDeadLetterWriter(aws, attempts=write_attempts)

    # ---- the synchronous face ------------------------------------------------------------

    def call_sync(
        self, records: list[Record], lease: ShardLease, stopping: threading.Event
    ) -> None:
        """Handle ``records`` (one call) on this thread; see the module docstring."""
        if self._plain and len(records) == 1:
            # The common case (a record, no sink, batch or retry stream) costs a decode, a call
            # and a count; a failure takes the full path below (a payload that did not decode
            # is decoded there again, and counted).
            record = records[0]
            value = record if self.decoder is None else self._decoded(record)
            if value is not None:
                try:
                    self.handler(value)
                except Exception as error:
                    unit = Unit([Item(record, record)], [value])
                    ends = self.sync_ends(stopping, lease, records)
                    self._run_sync(unit, lease, end_of(records), ends, error)
                    return
                self.report.ok()
                return
        items = [prepare(record, self.policy) for record in records]
        wait = due_time(items) - self.clock()
        ends = self.sync_ends(stopping, lease, records)
        if wait > 0 and ends.wait(wait):
            raise AbandonedError(f"closing before {describe(items[0].delivered)} was due")
        end = end_of(records)
        committed = False
        for unit in self._units(items, records, lease):
            committed = self._run_sync(unit, lease, unit_end(unit), ends)
        if self.sink is not None and not committed:
            # The call's last unit was disposed of by the policy: no handler transaction
            # carried ``end``. Commit it alone (fenced), or the next owner would deliver these
            # records again (and write their dead letters again). Each unit that succeeded
            # committed its own last record (units come in the records' order, see units()),
            # so one that succeeded last carried ``end`` already.
            self.sink.transact_sync(lease, end, _no_writes)

    def _run_sync(
        self,
        unit: Unit,
        lease: ShardLease,
        end: Position,
        ends: SyncCallEnds,
        first_error: Exception | None = None,
    ) -> bool:
        """Call ``unit`` until it succeeds or the policy gives up (``first_error``: the first
        call was made already and raised it). True: the handler succeeded (with a sink: its
        transaction committed ``end``); False: the policy disposed of the unit."""
        attempts = 0
        while True:
            attempts += 1
            if first_error is not None:
                error, first_error = first_error, None
            else:
                try:
                    self._attempt_sync(unit, lease, end)
                except _HandlerRaised as raised:
                    error = raised.error
                else:
                    self.report.ok(len(unit.items))
                    return True
            if not after_failure(self.policy, attempts, error):
                if self.bisect and len(unit.items) > 1:
                    self.report.bisecting(unit, error)
                    first, second = halves(unit)
                    self._run_sync(first, lease, unit_end(first), ends)
                    return self._run_sync(second, lease, unit_end(second), ends)
                self._finish_sync(
                    plan(unit.items, self.policy, error, attempts, self._now_ms(), self.identity),
                    error,
                )
                return False
            delay = self.report.retrying(unit, error, attempts)
            if ends.wait(delay):
                raise AbandonedError(f"closing while retrying {describe(unit.items[0].original)}")

    def _attempt_sync(self, unit: Unit, lease: ShardLease, end: Position) -> None:
        if unit.error is not None:
            raise _HandlerRaised(unit.error)
        argument = unit.values if self.batched else unit.values[0]
        if self.sink is None:
            try:
                self.handler(argument)
            except Exception as error:
                raise _HandlerRaised(error) from error
            return

        def body(tx: Any) -> None:
            try:
                self.handler(argument, tx)
            except Exception as error:
                raise _HandlerRaised(error) from error

        try:
            self.sink.transact_sync(lease, end, body)
        except _HANDLERS_OWN as refused:
            raise _HandlerRaised(refused) from refused

    def _finish_sync(self, steps: list[Step], error: Exception) -> None:
        for step in steps:
            if step.envelope is not None:
                try:
                    self._writer.put(step.stream, step.item.original, step.envelope)
                except DeadLetterWriteError as failed:
                    self.report.failed(step, failed)
            self.report.done(step, error)

    def close_sync(self) -> None:
        """Nothing to release: the blocking client is the process's shared session's."""

    # ---- the asynchronous face -----------------------------------------------------------

    async def call_async(
        self, records: list[Record], lease: ShardLease, stopping: asyncio.Event
    ) -> None:
        """Handle ``records`` (one call) in this task; see the module docstring."""
        if self._plain and len(records) == 1:  # as in call_sync
            record = records[0]
            value = record if self.decoder is None else self._decoded(record)
            if value is not None:
                try:
                    await self.handler(value)
                except Exception as error:
                    unit = Unit([Item(record, record)], [value])
                    ends = self.async_ends(stopping, lease, records)
                    await self._run_async(unit, lease, end_of(records), ends, error)
                    return
                self.report.ok()
                return
        items = [prepare(record, self.policy) for record in records]
        wait = due_time(items) - self.clock()
        ends = self.async_ends(stopping, lease, records)
        if wait > 0 and await ends.wait(wait):
            raise AbandonedError(f"closing before {describe(items[0].delivered)} was due")
        end = end_of(records)
        committed = False
        for unit in self._units(items, records, lease):
            committed = await self._run_async(unit, lease, unit_end(unit), ends)
        if self.sink is not None and not committed:  # as in call_sync
            await self.sink.transact_async(lease, end, _no_writes_async)

    async def _run_async(
        self,
        unit: Unit,
        lease: ShardLease,
        end: Position,
        ends: AsyncCallEnds,
        first_error: Exception | None = None,
    ) -> bool:
        attempts = 0
        while True:
            attempts += 1
            if first_error is not None:
                error, first_error = first_error, None
            else:
                try:
                    await self._attempt_async(unit, lease, end)
                except _HandlerRaised as raised:
                    error = raised.error
                else:
                    self.report.ok(len(unit.items))
                    return True
            if not after_failure(self.policy, attempts, error):
                if self.bisect and len(unit.items) > 1:  # as in _run_sync
                    self.report.bisecting(unit, error)
                    first, second = halves(unit)
                    await self._run_async(first, lease, unit_end(first), ends)
                    return await self._run_async(second, lease, unit_end(second), ends)
                await self._finish_async(
                    plan(unit.items, self.policy, error, attempts, self._now_ms(), self.identity),
                    error,
                )
                return False
            delay = self.report.retrying(unit, error, attempts)
            if await ends.wait(delay):
                raise AbandonedError(f"closing while retrying {describe(unit.items[0].original)}")

    async def _attempt_async(self, unit: Unit, lease: ShardLease, end: Position) -> None:
        if unit.error is not None:
            raise _HandlerRaised(unit.error)
        argument = unit.values if self.batched else unit.values[0]
        if self.sink is None:
            try:
                await self.handler(argument)
            except Exception as error:
                raise _HandlerRaised(error) from error
            return

        async def body(tx: Any) -> None:
            try:
                await self.handler(argument, tx)
            except Exception as error:
                raise _HandlerRaised(error) from error

        try:
            await self.sink.transact_async(lease, end, body)
        except _HANDLERS_OWN as refused:
            raise _HandlerRaised(refused) from refused

    async def _finish_async(self, steps: list[Step], error: Exception) -> None:
        for step in steps:
            if step.envelope is not None:
                try:
                    await self._async_writer.put(step.stream, step.item.original, step.envelope)
                except DeadLetterWriteError as failed:
                    self.report.failed(step, failed)
            self.report.done(step, error)

    async def close_async(self) -> None:
        """Close the dead-letter client, if one was opened."""
        await self._async_writer.close()

    # ---- shared by both faces ------------------------------------------------------------

    def _decoded(self, record: Record) -> Any:
        """The handler's Message for ``record``, or None when it does not decode."""
        assert self.decoder is not None
        try:
            return self.decoder(record)
        except DecodeError:
            return None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _too_old(self, item: Item) -> Exception | None:
        """``run(max_record_age)``: the error that sends ``item`` to the policy, if it is old."""
        assert self.max_age is not None
        policy, waited = self.policy, 0.0
        if isinstance(policy, RetryLater) and item.delivered is not item.original:
            waited = policy.delay  # a RetryLater round's delay is not age (see .age)
        error = self.kinesis_clock.too_old(item.delivered, self.max_age, waited)
        if error is not None:
            self.report.too_old(item)
        return error

    def observe(self, records: list[Record], lease: ShardLease) -> None:
        """The runner got ``records`` (an engine batch) of ``lease``: what they show of
        Kinesis's clock (their arrivals, the shard's ``MillisBehindLatest``) ages every record
        of the batch alike, not only those of the call that holds the last one."""
        if self.max_age is not None:
            self.kinesis_clock.observe(records, lease.progress.millis_behind)

    def _units(self, items: list[Item], records: list[Record], lease: ShardLease) -> list[Unit]:
        """The calls to make (see :func:`.retry_later.units`), records past max_record_age (or
        that an added handler's ``key_of`` raised on) failing alone."""
        refuse: Callable[[Item], Exception | None] | None = None
        if self.refuse is not None:
            check = self.refuse
            refuse = lambda item: check(item.delivered)  # noqa: E731
        elif self.max_age is not None:
            # Only ``lease``'s records go with its MillisBehindLatest (see KinesisClock.observe).
            self.kinesis_clock.observe(records, lease.progress.millis_behind, lease.key)
            refuse = self._too_old
        return units(items, self.decoder, self.batched, self.report.decode_failed, refuse)


def _no_writes(tx: Any) -> None:
    """A sink transaction's body that adds nothing: only the position is committed."""


async def _no_writes_async(tx: Any) -> None:
    """:func:`_no_writes` for the async face."""
