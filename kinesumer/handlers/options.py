"""The arguments of ``run()``, checked once: :class:`Batch` and :class:`RunOptions`.

Both faces build a :class:`RunOptions` with :func:`run_options` before joining the group, so a
bad argument is a :class:`~kinesumer.errors.ConfigError` naming it (``run(concurrency): ...``)
and nothing was started. Everything downstream (the scheduler, the invocation, the sinks) reads
the frozen result and checks nothing again.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from .policies import POLICY_TYPES, Block, FailurePolicy, Stop

Ordering = Literal["key", "shard", "none"]

ORDERINGS: tuple[str, ...] = ("key", "shard", "none")

#: The most records one handler call (a batch) may take, and the most parallel calls: far above
#: any sensible setting, low enough to catch a typo (an extra zero or two).
MAX_BATCH_SIZE = 10_000
MAX_CONCURRENCY = 10_000


@dataclass(frozen=True)
class Batch:
    """Call the handler with a list of records: up to ``max_size`` records, waiting at most
    ``max_wait`` seconds for a batch to fill once its first record is ready. A batch also forms
    without waiting when every handler slot was busy and records queued up meanwhile."""

    max_size: int = 100
    max_wait: float = 0.2
    #: When a batch fails and the policy gives up on it, split it in two halves and try each
    #: (with the policy's retries), down to the failing record(s) alone, as Lambda's
    #: ``BisectBatchOnFunctionError``: only the records that fail alone reach the policy's
    #: final action. At-least-once: a record of a half that succeeds was passed to the handler
    #: in every failing call that held it before (a handler's writes must be idempotent); it is
    #: counted ``ok`` once and, with a sink, committed once (with its half).
    bisect_on_error: bool = False

    def __post_init__(self) -> None:
        size, wait = self.max_size, self.max_wait
        if not isinstance(self.bisect_on_error, bool):
            raise ConfigError(
                "bisect_on_error", f"must be True or False, got {self.bisect_on_error!r}", "Batch"
            )
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ConfigError(
                "max_size", f"must be an int from 1 to {MAX_BATCH_SIZE}, got {size!r}", "Batch"
            )
        if (
            isinstance(wait, bool)
            or not isinstance(wait, (int, float))
            or not math.isfinite(wait)
            or wait < 0
        ):
            raise ConfigError(
                "max_wait", f"must be a finite number of seconds >= 0, got {wait!r}", "Batch"
            )


@dataclass(frozen=True)
class RunOptions:
    """Every argument of ``run()`` after validation (see :func:`run_options`)."""

    #: Handler calls in flight at once (threads of the sync face, tasks of the async one).
    concurrency: int
    #: What must be handled in order: records of one partition key, of one shard, or nothing.
    ordering: Ordering
    #: Records admitted and not yet done, per member: reading pauses at this bound.
    max_in_flight: int
    #: Batch handler settings; None: the handler takes one record per call.
    batch: Batch | None
    #: The failure policy (kinesumer.handlers.policies; ``Stop()`` when none was given).
    on_failure: FailurePolicy
    #: The payload decoder asked for: None, ``"json"``, a type or a callable (handlers.decode).
    decode: Any
    #: An exactly-once sink (kinesumer.sinks), or None.
    sink: Any
    #: The handler's name in metrics, stats and dead letters.
    name: str
    #: Seconds: records older than this (by Kinesis's clock, see handlers.age) go to the
    #: failure policy instead of the handler. None: no limit.
    max_record_age: float | None = None

    @property
    def batch_size(self) -> int:
        """The most records of one call."""
        return self.batch.max_size if self.batch is not None else 1


def default_max_in_flight(concurrency: int, batch: Batch | None) -> int:
    """Twice what the handler slots can take at once (a full set of calls in flight and as much
    again queued behind them, so a slot that frees finds work at once), and at least 100 so
    that key ordering sees enough records to find parallel keys."""
    size = batch.max_size if batch is not None else 1
    return max(100, 2 * concurrency * size)


def calls_plainly(options: RunOptions) -> bool:
    """The default policy without retries, no decoder, no sink, no batch: a handler error stops
    the run at once and nothing else can happen in a call, so a runner calling one record at a
    time may call the handler itself, without the invocation's per-call work (that keeps the
    cost per record of a no-op handler that of iterating ``consume()``)."""
    policy = options.on_failure
    return (
        isinstance(policy, Stop)
        and policy.retry.attempts == 1
        and options.decode is None
        and options.sink is None
        and options.batch is None
        and options.max_record_age is None
    )


def _fail(field: str, message: str) -> ConfigError:
    return ConfigError(field, message, "run")


def check_handler(handler: object, is_async: bool) -> None:
    """The sync face takes a plain function, the async face a coroutine function."""
    if not callable(handler):
        raise _fail("handler", f"must be callable, got {handler!r}")
    is_coroutine = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )
    if is_async and not is_coroutine:
        raise _fail("handler", f"AsyncKinesumer.run needs a coroutine function, got {handler!r}")
    if not is_async and is_coroutine:
        raise _fail(
            "handler",
            f"Kinesumer.run needs a plain function, got the coroutine function {handler!r}; "
            "use AsyncKinesumer.run",
        )


def handler_name(handler: Callable[..., object]) -> str:
    return str(getattr(handler, "__qualname__", None) or type(handler).__qualname__)


def run_options(
    handler: Callable[..., object],
    *,
    concurrency: int,
    ordering: str,
    max_in_flight: int | None,
    batch: Batch | None,
    on_failure: object,
    decode: object,
    sink: object,
    name: str | None,
    is_async: bool,
    max_record_age: float | None = None,
) -> RunOptions:
    """Check every argument of ``run()``; a bad one raises ConfigError naming it."""
    check_handler(handler, is_async)
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise _fail(
            "concurrency", f"must be an int from 1 to {MAX_CONCURRENCY}, got {concurrency!r}"
        )
    if ordering not in ORDERINGS:
        raise _fail(
            "ordering", f"must be one of {', '.join(map(repr, ORDERINGS))}, got {ordering!r}"
        )
    if batch is not None and not isinstance(batch, Batch):
        raise _fail("batch", f"must be a kinesumer.handlers.Batch or None, got {batch!r}")
    if max_in_flight is None:
        max_in_flight = default_max_in_flight(concurrency, batch)
    elif isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
        raise _fail("max_in_flight", f"must be an int or None, got {max_in_flight!r}")
    elif max_in_flight < concurrency:
        raise _fail(
            "max_in_flight",
            f"must be at least concurrency ({concurrency}) or the slots never fill, "
            f"got {max_in_flight}",
        )
    if on_failure is None:
        on_failure = Stop()
    elif not isinstance(on_failure, POLICY_TYPES):
        raise _fail(
            "on_failure",
            "must be Stop(), Block(), Discard(), DeadLetter(stream) or RetryLater(stream), "
            f"got {on_failure!r}",
        )
    if decode is not None and not (decode == "json" or callable(decode)):
        raise _fail("decode", f"must be None, 'json', a type or a callable, got {decode!r}")
    if sink is not None:
        method = "transact_async" if is_async else "transact_sync"
        if not callable(getattr(sink, method, None)) or not callable(getattr(sink, "attach", None)):
            raise _fail("sink", f"must be an exactly-once sink (kinesumer.sinks), got {sink!r}")
        if ordering != "shard":
            raise _fail(
                "ordering",
                f"a sink commits a shard's position with each call, so it needs "
                f'ordering="shard", got {ordering!r}',
            )
    _check_max_record_age(max_record_age, on_failure)
    if name is None:
        name = handler_name(handler)
    elif not isinstance(name, str) or not name:
        raise _fail("name", f"must be a non-empty str or None, got {name!r}")
    return RunOptions(
        concurrency=concurrency,
        ordering=ordering,  # type: ignore[arg-type]  # checked against ORDERINGS above
        max_in_flight=max_in_flight,
        batch=batch,
        on_failure=on_failure,
        decode=decode,
        sink=sink,
        name=name,
        max_record_age=None if max_record_age is None else float(max_record_age),
    )


def _check_max_record_age(value: object, policy: object) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _fail("max_record_age", f"must be None or seconds > 0, got {value!r}")
    if isinstance(policy, Block):
        raise _fail(
            "max_record_age",
            "Block never gives a record up, and a record too old stays too old; use Stop, "
            "Discard, DeadLetter or RetryLater with max_record_age",
        )
