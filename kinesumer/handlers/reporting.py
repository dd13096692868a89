"""What an invocation says about each handler call, for both faces: the counts
(:class:`~.counters.HandlerCounters`) and the log lines of a retry, of a record the policy
disposed of, and of a failure that stops the run.

:class:`CallReporter` is the invocation's (:mod:`.invoke`) only way to count and log, so the
sync and async faces report alike; it never calls a handler or writes to AWS.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from .counters import HandlerCounters
from .deadletter import DeadLetterWriteError
from .policies import Block, FailurePolicy, HandlerFailedError, backoff_delay, describe
from .retry_later import Item, Outcome, Step, Unit, describe_items, worth_a_warning

log = logging.getLogger("kinesumer.handlers")


class CallReporter:
    """Counts and logs for the handler ``name`` under ``policy``; ``uniform``: the jitter's
    random source (the retry delays it returns are drawn here)."""

    def __init__(
        self,
        name: str,
        counters: HandlerCounters,
        policy: FailurePolicy,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self.name = name
        self.counters = counters
        self.policy = policy
        self.uniform = uniform

    def ok(self, count: int = 1) -> None:
        self.counters.add("ok", count)

    def decode_failed(self) -> None:
        self.counters.add("decode_error")

    def too_old(self, item: Item) -> None:
        self.counters.add("too_old")
        log.info(
            "handler %s: %s is past max_record_age: to the failure policy",
            self.name,
            describe(item.delivered),
        )

    def retrying(self, unit: Unit, error: Exception, attempts: int) -> float:
        """Count and log one more try of ``unit``; the seconds to wait before it."""
        self.counters.add("retried", len(unit.items))
        policy = self.policy
        delay = backoff_delay(policy.retry, attempts, self.uniform)
        blocking = isinstance(policy, Block) and attempts >= policy.retry.attempts
        warn = blocking and worth_a_warning(attempts, policy.retry.attempts)
        level = logging.WARNING if warn else logging.INFO
        log.log(
            level,
            "handler %s failed on %s (attempt %d%s): %s: %s; retrying in %.2fs",
            self.name,
            describe_items(unit.items),
            attempts,
            ", blocking until it succeeds" if blocking else "",
            type(error).__name__,
            error,
            delay,
        )
        return delay

    def bisecting(self, unit: Unit, error: Exception) -> None:
        log.info(
            "handler %s failed on %s (%s: %s): trying each half",
            *(self.name, describe_items(unit.items), type(error).__name__, error),
        )

    def done(self, step: Step, error: Exception) -> None:
        """``step`` was taken (its write, if any, landed): count and log it; a STOP raises
        :class:`HandlerFailedError`."""
        record = step.item.original
        if step.outcome is Outcome.STOP:
            self.counters.add(Outcome.STOP.value)
            raise HandlerFailedError(error, record, self.name) from error
        self.counters.add(step.outcome.value)
        level, what = logging.WARNING, "discarded"
        if step.outcome is Outcome.DEAD_LETTER:
            what = f"dead-lettered to {step.stream}"
        elif step.outcome is Outcome.RETRY_LATER:
            round_number = step.envelope.round if step.envelope else 0
            level, what = logging.INFO, f"sent to {step.stream} for round {round_number}"
        why = f" ({step.note})" if step.note else ""
        log.log(
            level,
            "handler %s: %s %s after %s: %s%s",
            *(self.name, what, describe(record), type(error).__name__, error, why),
        )

    def failed(self, step: Step, failed: DeadLetterWriteError) -> None:
        """A dead letter could not be written: the run stops (raises)."""
        self.counters.add(Outcome.STOP.value)
        log.error("handler %s: %s; the run stops", self.name, failed)
        raise HandlerFailedError(failed, step.item.original, self.name) from failed
