"""The pure part of an invocation: what each record of a call is (a fresh record, or one read back
from the RetryLater stream, rebuilt from its envelope, with its due time), which records are called
together, and, once a call's retries are spent, the step each of its records takes next.

Both invocation faces (:mod:`.invoke`) drive these functions; nothing here sleeps, calls a handler
or writes to AWS.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DecodeError
from ..models import Position, Record
from .age import RecordTooOldError
from .deadletter import DeadLetterEnvelope, make_envelope, read_envelope
from .policies import (
    DeadLetter,
    Discard,
    FailurePolicy,
    RetryLater,
    Stop,
    describe,
    final_action,
)


@dataclass(frozen=True)
class Item:
    """One record of a call. ``delivered`` is what the runner gave (its position is the one the
    checkpoint moves past); ``original`` is what the handler sees: the same record, or for a
    record of the RetryLater stream the one its envelope carries. ``round``: RetryLater rounds
    behind it. ``due``: epoch seconds before which it must not be handled. ``error``: it cannot be
    handled at all (a record on the RetryLater stream that is not an envelope)."""

    delivered: Record
    original: Record
    round: int = 0
    due: float = 0.0
    error: DecodeError | None = None


def prepare(record: Record, policy: FailurePolicy) -> Item:
    """The :class:`Item` for ``record``: read back from the RetryLater stream, it is rebuilt from
    its envelope; anything else is handled as it is."""
    if not isinstance(policy, RetryLater) or record.stream != policy.stream:
        return Item(record, record)
    try:
        envelope = read_envelope(record.data)
    except ValueError as exc:
        # Not written by kinesumer: it can never be handled, so no more rounds; ``then`` decides.
        error = DecodeError(
            record.stream,
            record.shard_id,
            record.sequence_number,
            f"not a kinesumer retry-later envelope: {exc}",
        )
        return Item(record, record, round=policy.rounds, error=error)
    return Item(
        record,
        envelope.original_record(),
        round=envelope.round,
        due=envelope.failed_at / 1000 + policy.delay,
    )


@dataclass
class Unit:
    """Records called together, with the handler's argument for each, or the error that makes
    them fail without a call (a payload that did not decode, a bad envelope)."""

    items: list[Item]
    values: list[Any]
    error: Exception | None = None


def units(
    items: list[Item],
    decoder: Callable[[Record], Any] | None,
    batched: bool,
    on_decode_error: Callable[[], None],
    too_old: Callable[[Item], Exception | None] | None = None,
) -> list[Unit]:
    """The calls to make, in the records' order: records that cannot be decoded each fail
    alone (one bad payload must not sink a batch; each is reported to ``on_decode_error``); the
    others are called together (a batch: the records between two bad ones) or one by one.

    In order, so that a bad record's dead letter is written after the records before it were
    handled and before the ones after it: a reader of the dead-letter stream sees each key in
    the order a handler without batches would give (and an exactly-once sink's commits never
    pass a record not handled yet). ``too_old``: the error of a record past ``max_record_age``
    (it fails alone, like a bad payload, before decoding)."""
    made: list[Unit] = []
    ready: list[Item] = []
    values: list[Any] = []

    def flush() -> None:
        if ready:
            made.append(Unit(list(ready), list(values)))
            ready.clear()
            values.clear()

    for item in items:
        failure: Exception | None = item.error
        if failure is None and too_old is not None:
            failure = too_old(item)
        value: Any = item.original
        if failure is None and decoder is not None:
            try:
                value = decoder(item.original)
            except Exception as error:
                on_decode_error()
                failure = error
        if failure is not None:
            flush()
            made.append(Unit([item], [], failure))
            continue
        ready.append(item)
        values.append(value)
        if not batched:
            flush()
    flush()
    return made


def halves(unit: Unit) -> tuple[Unit, Unit]:
    """A batch of two or more records split in two, in order (bisect-on-error)."""
    middle = len(unit.items) // 2
    return (
        Unit(unit.items[:middle], unit.values[:middle]),
        Unit(unit.items[middle:], unit.values[middle:]),
    )


def due_time(items: list[Item]) -> float:
    """When the whole call may run: the latest due time of its items (0: now)."""
    return max((item.due for item in items), default=0.0)


class Outcome(enum.Enum):
    """What happens to a record whose retries are spent; the value is the counted outcome."""

    STOP = "failed"
    DISCARD = "discarded"
    DEAD_LETTER = "dead_lettered"
    RETRY_LATER = "retry_later"


@dataclass(frozen=True)
class Step:
    """One record's next step: for writes, the stream and the envelope to put there."""

    item: Item
    outcome: Outcome
    stream: str = ""
    envelope: DeadLetterEnvelope | None = None
    #: Why RetryLater fell back to its ``then`` action early (logged), else "".
    note: str = ""


@dataclass(frozen=True)
class Identity:
    """Who writes envelopes: the handler's name, the group and the member."""

    handler: str
    app: str
    client_id: str


def plan(
    items: list[Item],
    policy: FailurePolicy,
    error: BaseException,
    attempts: int,
    failed_at_ms: int,
    identity: Identity,
) -> list[Step]:
    """The step of every item of a call that failed with ``error`` after ``attempts`` calls.

    A record whose RetryLater envelope would not fit in a Kinesis record (its data would be cut,
    and a cut record cannot be handled again) takes ``then``'s action at once; so does a payload
    that did not decode (the same bytes will not decode later either).
    """
    steps = []
    for item in items:
        action = final_action(policy, item.round)
        note = ""
        if isinstance(action, RetryLater) and isinstance(error, DecodeError):
            note = "a payload that does not decode is not retried later"
            action = action.then
        elif isinstance(action, RetryLater) and isinstance(error, RecordTooOldError):
            note = "a record past max_record_age is not retried later"
            action = action.then
        if isinstance(action, RetryLater):
            envelope = _envelope(
                item, error, "retry_later", item.round + 1, attempts, failed_at_ms, identity
            )
            if not envelope.data_truncated:
                steps.append(Step(item, Outcome.RETRY_LATER, action.stream, envelope))
                continue
            note = "too large for a retry-later envelope"
            action = action.then
        steps.append(_terminal(item, action, error, attempts, failed_at_ms, identity, note))
    return steps


def _terminal(
    item: Item,
    action: Stop | Discard | DeadLetter,
    error: BaseException,
    attempts: int,
    failed_at_ms: int,
    identity: Identity,
    note: str,
) -> Step:
    if isinstance(action, Stop):
        return Step(item, Outcome.STOP, note=note)
    if isinstance(action, Discard):
        return Step(item, Outcome.DISCARD, note=note)
    envelope = _envelope(item, error, "dead_letter", item.round, attempts, failed_at_ms, identity)
    return Step(item, Outcome.DEAD_LETTER, action.stream, envelope, note)


def _envelope(
    item: Item,
    error: BaseException,
    kind: str,
    round_number: int,
    attempts: int,
    failed_at_ms: int,
    identity: Identity,
) -> DeadLetterEnvelope:
    return make_envelope(
        item.original,
        error,
        kind=kind,
        handler=identity.handler,
        attempts=attempts,
        round_number=round_number,
        failed_at_ms=failed_at_ms,
        app=identity.app,
        client_id=identity.client_id,
    )


def end_of(records: Sequence[Record]) -> Position:
    """The position of a call's last record: what a sink commits with it."""
    last = records[-1]
    return Position(last.sequence_number, last.sub_sequence_number)


def unit_end(unit: Unit) -> Position:
    """The position of a unit's last record: what a sink commits with the unit's writes."""
    return end_of([item.delivered for item in unit.items])


def describe_items(items: list[Item]) -> str:
    """The records of a unit, for a log line."""
    first = describe(items[0].original)
    return first if len(items) == 1 else f"{len(items)} records from {first}"


def worth_a_warning(attempts: int, first: int) -> bool:
    """Whether a blocked record's retry logs a WARNING: when it starts blocking, then every 100
    tries (a log line a minute or so at the default cap, not one per try)."""
    return attempts == first or attempts % 100 == 0
