"""Failure policies of a handler (``run(on_failure=...)``) and the pure decisions they make.

A policy says what happens when a handler (or the decoder before it) raises: retry with backoff a
bounded number of times (:class:`Retry`), then one action: :class:`Stop` the run, :class:`Block`
(keep retrying), :class:`Discard`, :class:`DeadLetter` or :class:`RetryLater`. The decisions are
pure functions (:func:`after_failure`, :func:`final_action`, :func:`backoff_delay`) that the
synchronous and the asynchronous invocation both drive; only sleeping and calling differ.

Also here: the two exceptions an invocation raises to the runner, :class:`HandlerFailedError`
(the policy stops the run) and :class:`AbandonedError` (the run is closing while the invocation
waited: its records are not done).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ConfigError, DecodeError, KinesumerError
from ..models import Record
from ..stream_refs import parse_stream
from .age import RecordTooOldError

#: Kinesis stream names: 1-128 of letters, digits, ``_``, ``.`` and ``-``.
STREAM_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class KeyOfError(Exception):
    """``add_handler(key_of=...)`` raised on a record: that handler's failure policy disposes
    of the record (dead letter, discard, or stop) and the handler is not called with it."""

    def __init__(self, name: str, record: Record, error: Exception) -> None:
        super().__init__(
            f"add_handler({name!r}): key_of raised on {record.stream}/{record.shard_id} "
            f"record {record.sequence_number}: {error!r}"
        )
        self.record = record
        self.error = error


@dataclass(frozen=True)
class Retry:
    """How often a failing call is tried, and how long to wait between tries.

    ``attempts`` handler calls are made before the policy's action (1: no retry). The wait before
    retry ``n`` (1-based) is ``backoff * 2**(n-1)`` seconds, capped at ``max_backoff``; with
    ``jitter`` it is drawn uniformly from the upper half of that (so tries spread out but never
    come back at once).
    """

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 10.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError("Retry.attempts", f"must be an int, not {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError("Retry.attempts", f"must be at least 1, not {self.attempts}")
        _non_negative("Retry.backoff", self.backoff)
        _non_negative("Retry.max_backoff", self.max_backoff)
        if self.max_backoff < self.backoff:
            raise ConfigError(
                "Retry.max_backoff",
                f"must be at least backoff ({self.backoff}), not {self.max_backoff}",
            )
        if not isinstance(self.jitter, bool):
            raise ConfigError("Retry.jitter", f"must be a bool, not {self.jitter!r}")


@dataclass(frozen=True)
class Stop:
    """The default: no retry (unless ``retry`` says so), then ``run()`` stops and raises the
    handler's exception. Nothing at or after the failing record is checkpointed."""

    retry: Retry = field(default_factory=lambda: Retry(attempts=1))

    def __post_init__(self) -> None:
        _check_retry("Stop.retry", self.retry)


@dataclass(frozen=True)
class Block:
    """Keep retrying (waits grow to ``retry.max_backoff``) until the call succeeds, the run is
    closing or the shard is handed off; then the records stay undone: the checkpoint holds, the
    next owner re-delivers.
    ``retry.attempts`` only sets when the WARNING log starts."""

    retry: Retry = field(default_factory=Retry)

    def __post_init__(self) -> None:
        _check_retry("Block.retry", self.retry)


@dataclass(frozen=True)
class Discard:
    """After the retries, log a WARNING naming the record and the handler, count it
    (outcome ``discarded``) and go on."""

    retry: Retry = field(default_factory=Retry)

    def __post_init__(self) -> None:
        _check_retry("Discard.retry", self.retry)


@dataclass(frozen=True)
class DeadLetter:
    """After the retries, write the record with its error to the Kinesis stream ``stream``
    (a JSON envelope: :mod:`kinesumer.handlers.deadletter`). The record is done only once the write
    landed; a write that keeps failing stops the run with :class:`DeadLetterWriteError`."""

    stream: str
    retry: Retry = field(default_factory=Retry)

    def __post_init__(self) -> None:
        _check_stream("DeadLetter.stream", self.stream)
        _check_retry("DeadLetter.retry", self.retry)


@dataclass(frozen=True)
class RetryLater:
    """After the retries, write the record to ``stream``, which the run consumes too; read back,
    it is handled again ``delay`` seconds after it was written. After ``rounds`` such rounds the
    ``then`` policy's action applies (its own ``retry`` is not used: the retries happened)."""

    stream: str
    delay: float = 60.0
    rounds: int = 3
    then: Stop | Discard | DeadLetter = field(default_factory=Stop)
    retry: Retry = field(default_factory=Retry)

    def __post_init__(self) -> None:
        _check_stream("RetryLater.stream", self.stream)
        _non_negative("RetryLater.delay", self.delay)
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ConfigError("RetryLater.rounds", f"must be an int >= 1, not {self.rounds!r}")
        if not isinstance(self.then, (Stop, Discard, DeadLetter)):
            raise ConfigError(
                "RetryLater.then",
                f"must be Stop(), Discard() or DeadLetter(...), not {self.then!r}",
            )
        if isinstance(self.then, DeadLetter) and self.then.stream == self.stream:
            raise ConfigError("RetryLater.then", "the dead-letter stream must not be the retry one")
        _check_retry("RetryLater.retry", self.retry)


FailurePolicy = Stop | Block | Discard | DeadLetter | RetryLater
#: The action a failed record ends with (RetryLater resolved to itself or its ``then``).
FinalAction = Stop | Discard | DeadLetter | RetryLater
POLICY_TYPES = (Stop, Block, Discard, DeadLetter, RetryLater)


class HandlerFailedError(KinesumerError):
    """The failure policy stops the run: ``error`` is what the handler (or decoder, or a
    dead-letter write) raised on ``record``; the runner raises ``error`` from ``run()``."""

    def __init__(self, error: BaseException, record: Record, handler: str) -> None:
        self.error = error
        self.record = record
        self.handler = handler
        super().__init__(
            f"handler {handler} failed on {describe(record)}: {type(error).__name__}: {error}"
        )


class AbandonedError(KinesumerError):
    """The run is closing, or the shard was handed off, while the invocation waited (backing
    off, blocking, or until a RetryLater record's due time): its records are not done; the next
    owner re-delivers them."""


#: Partition keys are often customer ids or e-mail addresses, and log lines and error messages
#: travel further than the stream (log shippers, tickets, chat): a record is named by its
#: position only, unless the application sets this logger's own level to DEBUG
#: (``logging.getLogger("kinesumer.partition_keys").setLevel(logging.DEBUG)``). A DEBUG root
#: logger alone does not: the switch is explicit.
PARTITION_KEYS_LOGGER = logging.getLogger("kinesumer.partition_keys")


def describe(record: Record) -> str:
    """``stream/shard/sequence`` (and ``#sub`` for a KPL user record), and the partition key
    when :data:`PARTITION_KEYS_LOGGER` is set to DEBUG."""
    sub = f"#{record.sub_sequence_number}" if record.sub_sequence_number else ""
    where = f"{record.stream}/{record.shard_id}/{record.sequence_number}{sub}"
    level = PARTITION_KEYS_LOGGER.level
    if level == logging.NOTSET or level > logging.DEBUG:
        return where
    return f"{where} (key {record.partition_key!r})"


def check_policy(policy: object, argument: str = "on_failure") -> FailurePolicy:
    """``policy`` if it is a failure policy, else ConfigError naming ``argument``."""
    if not isinstance(policy, POLICY_TYPES):
        raise ConfigError(
            argument,
            "must be Stop(), Block(), Discard(), DeadLetter(stream) or RetryLater(stream), "
            f"not {policy!r}",
        )
    return policy


def backoff_delay(
    retry: Retry, retry_number: int, uniform: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before retry ``retry_number`` (1 = the first retry). ``uniform`` returns a
    float in [0, 1) (injected by tests)."""
    exponent = min(max(retry_number - 1, 0), 62)  # 2**62 * any backoff is past any cap
    ceiling = float(min(retry.max_backoff, retry.backoff * (2**exponent)))
    if not retry.jitter:
        return ceiling
    return ceiling / 2 + uniform() * ceiling / 2


def after_failure(policy: FailurePolicy, attempts: int, error: BaseException) -> bool:
    """Whether to try again after ``attempts`` calls failed, the last with ``error``.

    Within ``retry.attempts`` yes; :class:`Block` always. A :class:`DecodeError` is not retried
    (decoding the same bytes again gives the same answer), nor a record too old or one an added
    handler's ``key_of`` raised on, except under Block, whose contract is
    that the checkpoint holds until the run closes.
    """
    if isinstance(policy, Block):
        return True
    if isinstance(error, (DecodeError, RecordTooOldError, KeyOfError)):
        return False  # (run() refuses max_record_age with Block)
    return attempts < policy.retry.attempts


def final_action(policy: FailurePolicy, round_number: int) -> FinalAction:
    """The action for a record whose retries are spent. ``round_number``: how many times it has
    been through the RetryLater stream (0: read from its own stream). Block never gets here."""
    if isinstance(policy, RetryLater):
        return policy if round_number < policy.rounds else policy.then
    if isinstance(policy, Block):
        raise AssertionError("Block retries until it succeeds or the run closes")
    return policy


def dead_letter_streams(policy: FailurePolicy) -> tuple[str, ...]:
    """Every stream the policy may write to (checked to exist before the run starts)."""
    if isinstance(policy, RetryLater):
        return (policy.stream, *dead_letter_streams(policy.then))
    if isinstance(policy, DeadLetter):
        return (policy.stream,)
    return ()


def _check_retry(name: str, retry: object) -> None:
    if not isinstance(retry, Retry):
        raise ConfigError(name, f"must be a Retry(...), not {retry!r}")


def _check_stream(name: str, stream: object) -> None:
    """A Kinesis stream's name, or its ARN (of any account and region the member reaches:
    the write goes through the member's routing transport)."""
    if isinstance(stream, str) and stream.startswith("arn:"):
        try:
            ref = parse_stream(stream)
        except ConfigError as exc:
            raise ConfigError(name, f"{stream!r} is not a Kinesis stream ARN: {exc}") from None
        if ref.kind == "kinesis-arn":
            return
    if not isinstance(stream, str) or not STREAM_NAME.match(stream):
        raise ConfigError(name, f"must be a Kinesis stream name or ARN, not {stream!r}")


def _non_negative(name: str, value: object) -> None:
    # Finite: an infinite backoff or delay would hold a record (and its shard) for ever.
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value < float("inf")
    ):
        raise ConfigError(name, f"must be a finite number >= 0, not {value!r}")
