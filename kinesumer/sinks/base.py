"""The exactly-once sink contract, its errors, and what every sink shares.

An exactly-once sink commits a handler's writes and the shard's position in one transaction of
its own store, fenced by the lease number the engine's claim wrote: a member that lost the shard
(a zombie: paused, partitioned, slow to notice) cannot commit, and a crash re-delivers only
records whose transaction did not commit. ``run(..., sink=...)`` drives it::

    runner  ── sink.attach(engine) ───────────────► (before engine.start: claim hook, clients)
    engine  ── claim_hook(lease) ─────────────────► fence the sink's position row, read it back
    invoke  ── sink.transact_sync(lease, end, body) ► BEGIN; fence; body(tx) (the handler);
                                                     position = end; COMMIT
                                                     refused fence ─► LeaseLostError

Errors::

    KinesumerError
    └── SinkError                   an exactly-once sink refused or could not commit
        ├── LeaseLostError              the fence refused the commit: another member owns the
        │                               shard now; nothing was written (not a handler failure)
        ├── TransactionTooLargeError    a handler added more writes than one transaction holds
        │                               (also ValueError)
        └── TransactionCanceledError    DynamoDB cancelled the transaction for one of the
                                        handler's own writes (its reasons attached)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import ConfigError, KinesumerError

if TYPE_CHECKING:
    from ..models import Position
    from ..read.engine import Engine
    from ..read.progress import ShardLease

log = logging.getLogger("kinesumer.sinks")


class SinkError(KinesumerError):
    """An exactly-once sink refused or could not commit a handler's writes."""


class LeaseLostError(SinkError):
    """The sink's fence refused the commit: ``stream``/``shard_id`` is owned under a newer lease
    than ``lease`` (another member claimed it). Nothing of the call was written; the new owner
    delivers its records again. The runner drops the lease's queued records and goes on."""

    def __init__(self, stream: str, shard_id: str, lease: int, detail: str) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self.lease = lease
        super().__init__(
            f"lease {lease} of {stream}/{shard_id} was lost: {detail}; nothing was committed"
        )


class TransactionTooLargeError(SinkError, ValueError):
    """The handler added more writes than one transaction can hold with the position."""


class TransactionCanceledError(SinkError):
    """DynamoDB cancelled the transaction because of one of the handler's own writes (its
    condition failed, or it was invalid). ``reasons``: DynamoDB's CancellationReasons, one per
    element in the order they were added (the position's last). It counts as the handler's
    failure: the run's failure policy decides (retry, discard, dead letter, stop...)."""

    def __init__(self, message: str, reasons: list[dict[str, Any]]) -> None:
        self.reasons = reasons
        super().__init__(message)


@runtime_checkable
class ExactlyOnceSink(Protocol):
    """What ``run(..., sink=...)`` needs from a sink (see the module docstring)."""

    def attach(self, engine: Engine) -> None:
        """Before ``engine.start()``: install the claim hook, take the engine's clients."""

    def transact_sync(self, lease: ShardLease, end: Position, body: Callable[[Any], None]) -> None:
        """Run ``body(tx)`` and commit its writes with position ``end`` atomically (on a
        worker thread), or raise: :class:`LeaseLostError`, or body's exception (nothing
        committed)."""

    async def transact_async(
        self, lease: ShardLease, end: Position, body: Callable[[Any], Awaitable[None]]
    ) -> None:
        """:meth:`transact_sync` for coroutine handlers, on the engine's loop."""

    def close_sync(self) -> None:
        """Release connections (after the run)."""

    async def close_async(self) -> None:
        """:meth:`close_sync` for the async face."""


class EngineLink:
    """A sink's hold on the engine it was attached to: its loop (known from the first claim,
    which runs on it) and the loss of a lease whose commit the fence refused."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def attach(self, engine: Engine, sink: object) -> None:
        if self.engine is not None and self.engine is not engine:
            raise SinkError(f"{sink!r} is attached to another consumer already: make one per run")
        if engine.config.broadcast:
            # No claims, no lease numbers: nothing would fence the commits, and the positions
            # would go to the group's checkpoints, which broadcast members never touch.
            raise ConfigError(
                "sink",
                "exactly-once sinks need the group's fenced leases; they are not supported "
                "with Config.broadcast=True (write idempotently in the handler instead)",
                where="run",
            )
        self.engine = engine

    def on_loop(self) -> None:
        """Called on the engine's loop (the claim hook): remember it."""
        self.loop = asyncio.get_running_loop()

    def require(self) -> Engine:
        if self.engine is None:
            raise SinkError("the sink is not attached: pass it to run(..., sink=...)")
        return self.engine

    def lost(self, lease: ShardLease, why: str) -> LeaseLostError:
        """The fence refused ``lease``'s commit: end the lease on the engine (idempotent; the
        runner does the same) and the error to raise."""
        engine, loop = self.engine, self.loop
        if engine is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(engine.checkpointer.lose, lease, why)
        stream, shard_id = lease.key
        return LeaseLostError(stream, shard_id, lease.claim.checkpoint.lease, why)
