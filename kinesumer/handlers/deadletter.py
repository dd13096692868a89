"""The dead-letter envelope (what DeadLetter and RetryLater write to Kinesis) and its writers.

An envelope is one JSON object per Kinesis record, put with the ORIGINAL partition key (so records
of one key stay in order on the retry stream). Its fields:

=============================== ============================================================
``kinesumer_envelope``          1: marks (and versions) the format
``kind``                        ``"dead_letter"`` or ``"retry_later"``
``stream``                      the stream the record was read from (its original one)
``shard_id``                    its shard
``sequence_number``             its sequence number (a decimal string)
``sub_sequence_number``         its index in a KPL-aggregated record (0 for plain records)
``partition_key``               its partition key
``data``                        its payload, base64 (standard alphabet, padded)
``data_bytes``                  the payload's length in bytes
``data_truncated``              true when ``data`` holds only the payload's first bytes: the
                                envelope would have passed Kinesis' 1 MiB record limit (the
                                whole record is still in ``stream`` at ``sequence_number``)
``approximate_arrival_timestamp`` when it reached its stream, epoch milliseconds (or null)
``handler``                     the handler's name (``run(name=...)``, default its qualname)
``error_type``                  the exception's qualified class name
``error_message``               ``str(exception)``, cut to 2,000 characters
``attempts``                    handler calls made in the last round
``round``                       RetryLater rounds already behind it (0: never retried later)
``failed_at``                   when the last attempt failed, epoch milliseconds
``app``, ``client_id``          the consumer group and the member that wrote it
=============================== ============================================================

:func:`read_envelope` decodes one (for tools that read a dead-letter stream) and
:meth:`DeadLetterEnvelope.original_record` rebuilds the record it carries. Writes go through the
library's retry policy (transient errors retried with backoff); one that keeps failing, or fails
for good, raises :class:`DeadLetterWriteError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from datetime import datetime, timezone
from typing import Any

import msgspec
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from ..aws.accounting import RequestStats
from ..aws.clients import ClientFactory
from ..aws.retry import call_with_retry, error_code, is_transient
from ..errors import KinesumerError
from ..models import Record

log = logging.getLogger("kinesumer.handlers")

#: Kinesis' limit on one record: data plus partition key.
MAX_RECORD_BYTES = 1024 * 1024
MAX_ERROR_MESSAGE = 2000
#: Attempts of one PutRecord before the write is given up (about 10 s of backoff in all).
WRITE_ATTEMPTS = 8


class DeadLetterWriteError(KinesumerError):
    """A dead-letter (or retry-later) write kept failing or was refused: the run stops (nothing
    at or after the record is checkpointed). The cause is chained."""

    def __init__(self, stream: str, record: Record, cause: BaseException) -> None:
        self.stream = stream
        super().__init__(
            f"could not write {record.stream}/{record.shard_id}/{record.sequence_number} to "
            f"{stream}: {error_code(cause)}: {cause}"
        )


class DeadLetterEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """One dead-letter record (fields: see the module's table)."""

    kinesumer_envelope: int = 1
    kind: str
    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    data: bytes
    data_bytes: int
    data_truncated: bool = False
    approximate_arrival_timestamp: int | None
    handler: str
    error_type: str
    error_message: str
    attempts: int
    round: int
    failed_at: int
    app: str
    client_id: str

    def original_record(self) -> Record:
        """The record this envelope carries, as it was read from its original stream."""
        arrival = self.approximate_arrival_timestamp
        return Record(
            self.stream,
            self.shard_id,
            self.sequence_number,
            self.sub_sequence_number,
            self.partition_key,
            self.data,
            None if arrival is None else datetime.fromtimestamp(arrival / 1000, timezone.utc),
        )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(DeadLetterEnvelope)


def make_envelope(
    record: Record,
    error: BaseException,
    *,
    kind: str,
    handler: str,
    attempts: int,
    round_number: int,
    failed_at_ms: int,
    app: str,
    client_id: str,
) -> DeadLetterEnvelope:
    """The envelope of ``record`` that failed with ``error``, fitted to Kinesis' record limit."""
    arrival = record.approximate_arrival_timestamp
    message = str(error)
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[: MAX_ERROR_MESSAGE - 3] + "..."
    kind_of_error = type(error)
    envelope = DeadLetterEnvelope(
        kind=kind,
        stream=record.stream,
        shard_id=record.shard_id,
        sequence_number=record.sequence_number,
        sub_sequence_number=record.sub_sequence_number,
        partition_key=record.partition_key,
        data=record.data,
        data_bytes=len(record.data),
        approximate_arrival_timestamp=None if arrival is None else int(arrival.timestamp() * 1000),
        handler=handler,
        error_type=f"{kind_of_error.__module__}.{kind_of_error.__qualname__}",
        error_message=message,
        attempts=attempts,
        round=round_number,
        failed_at=failed_at_ms,
        app=app,
        client_id=client_id,
    )
    return fit(envelope)


def fit(envelope: DeadLetterEnvelope) -> DeadLetterEnvelope:
    """``envelope``, or a copy whose ``data`` is cut (``data_truncated``) so that the encoded
    envelope and its partition key fit in one Kinesis record."""
    budget = MAX_RECORD_BYTES - len(envelope.partition_key.encode())
    if len(encode(envelope)) <= budget:
        return envelope
    empty = msgspec.structs.replace(envelope, data=b"", data_truncated=True)
    room = budget - len(encode(empty)) - 8  # base64 padding and slack
    return msgspec.structs.replace(empty, data=envelope.data[: max(room, 0) * 3 // 4])


def encode(envelope: DeadLetterEnvelope) -> bytes:
    return _encoder.encode(envelope)


def read_envelope(data: bytes) -> DeadLetterEnvelope:
    """Decode a dead-letter record's data; ValueError (msgspec's) when it is not an envelope."""
    return _decoder.decode(data)


class DeadLetterWriter:
    """Writes envelopes with a blocking boto3 Kinesis client (through ``Config.role_arn`` when set),
    made on first use; safe to share between threads."""

    def __init__(self, factory: ClientFactory, *, attempts: int = WRITE_ATTEMPTS) -> None:
        self._factory = factory
        self._attempts = attempts
        self._kinesis: Any = None
        self._lock = threading.Lock()

    def put(self, stream: str, record: Record, envelope: DeadLetterEnvelope) -> None:
        """PutRecord ``envelope`` to ``stream`` with ``record``'s partition key, retried on
        transient errors; DeadLetterWriteError when it cannot land."""
        with self._lock:
            if self._kinesis is None:
                # One attempt per call: the retry policy is this writer's (as in aws.retry).
                self._kinesis = self._factory.sync_kinesis(attempts=1)
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0),
            before_sleep=lambda state: _log_retry(stream, state.outcome),
            reraise=True,
        )
        try:
            retrying(
                self._kinesis.put_record,
                StreamName=stream,
                Data=encode(envelope),
                PartitionKey=record.partition_key,
            )
        except Exception as exc:
            raise DeadLetterWriteError(stream, record, exc) from exc


class AsyncDeadLetterWriter:
    """Writes envelopes with an aiobotocore Kinesis client of the factory (through
    ``Config.role_arn`` when set), opened on first use and closed by :meth:`close`."""

    def __init__(self, factory: ClientFactory, *, attempts: int = WRITE_ATTEMPTS) -> None:
        self._factory = factory
        self._attempts = attempts
        self._stats = factory.stats if factory.stats is not None else RequestStats()
        self._stack = contextlib.AsyncExitStack()
        self._kinesis: Any = None
        self._lock = asyncio.Lock()

    async def put(self, stream: str, record: Record, envelope: DeadLetterEnvelope) -> None:
        """As :meth:`DeadLetterWriter.put`."""
        async with self._lock:
            if self._kinesis is None:
                self._kinesis = await self._stack.enter_async_context(self._factory.kinesis())
        data = encode(envelope)
        try:
            await call_with_retry(
                "kinesis.PutRecord",
                lambda: self._kinesis.put_record(
                    StreamName=stream, Data=data, PartitionKey=record.partition_key
                ),
                self._stats,
                attempts=self._attempts,
            )
        except Exception as exc:
            raise DeadLetterWriteError(stream, record, exc) from exc

    async def close(self) -> None:
        self._kinesis = None
        await self._stack.aclose()


def _log_retry(stream: str, outcome: Any) -> None:
    exc = outcome.exception() if outcome is not None else None
    code = error_code(exc) if isinstance(exc, BaseException) else "?"
    log.warning("writing to %s failed (%s: %s): retrying", stream, code, exc)
