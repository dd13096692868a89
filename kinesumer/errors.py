"""The one exception tree of kinesumer.

Everything the library raises on purpose derives from :class:`KinesumerError`::

    KinesumerError
    ├── ConfigError                 a Config field or a run() argument is invalid (names it)
    ├── DecodeError                 a record's payload did not decode (run(decode=...); names
    │                               the stream, shard and sequence; also ValueError)
    ├── ConsumerClosedError         the consumer was closed; make a new one
    ├── StateStoreError             DynamoDB state table problems
    │   ├── StateTableNotFoundError     the table does not exist
    │   ├── StateTableSchemaError       the table has the wrong key schema
    │   ├── RewindConflictError         a rewind's shard kept changing under it (says which
    │   │                               shards moved and which did not)
    │   └── CorruptStateError           an item in the table cannot be read back
    ├── KinesisError                Kinesis stream problems
    │   └── StreamNotFoundError         a stream does not exist
    ├── AccessDeniedError           AWS refused a call (names the call and resource)
    │   └── AccountAccessError          a stream's account cannot be reached: no access
    │                                   configured, or its role cannot be assumed, at subscribe
    │                                   or at a renewal of its credentials (names the account,
    │                                   the role and the action)
    ├── TransientAWSError           AWS kept failing (throttling, 5xx, network) past retries
    ├── ProducerError               a record could not be (or was not) written (Producer)
    │   ├── InvalidRecordError          bad input at put(): key, payload type, hash key (also
    │   │   │                           ValueError)
    │   │   ├── RecordTooLargeError         data + key over the stream's maximum record
    │   │   │                               size (1 MiB unless raised; 10 MiB at most)
    │   │   └── ReadOnlyStreamError         put() named a DynamoDB table's stream (written
    │   │                                   through its table only)
    │   ├── BufferFullError             put(block=False) met a full buffer
    │   ├── DeliveryTimeoutError        not written within delivery_timeout
    │   ├── RecordRejectedError         Kinesis refused the entry for good (names its code)
    │   ├── ProducerClosedError         the producer was closed; make a new one
    │   └── FlushError                  flush() found records that failed (counts by error)
    ├── OutboxError                 the PostgreSQL outbox (kinesumer.outbox) cannot work
    │   ├── OutboxTableNotFoundError    the outbox table does not exist (create_table())
    │   └── OutboxConnectionError       publish() got a closed or broken connection, or one
    │                                   outside a transaction
    ├── MetricsNotInstalledError    Config.metrics without prometheus_client (also ImportError)
    ├── EnhancedFanOutNotInstalledError  Config.enhanced_fan_out without httpx[http2] (also
    │                               ImportError)
    ├── InProcessMockUnsupportedError  moto's in-process mock_aws cannot carry this (EFO)
    └── SparkNotInstalledError      kinesumer.spark without pyspark/pyarrow (also ImportError;
                                    defined in kinesumer.spark, which may not be importable)

Errors raised inside the engine's background tasks are re-raised to the caller of
``consume()`` (or ``commit()`` / ``close()``), never left to die in a task.
"""

from __future__ import annotations

from typing import Any


class KinesumerError(Exception):
    """Base class of every error kinesumer raises on purpose."""


class ConfigError(KinesumerError, ValueError):
    """A :class:`~kinesumer.Config` field, or an argument of a call such as ``run()``, is
    invalid. ``where`` names the call (``"run"``: the message reads ``run(concurrency): ...``);
    without it the field is a Config field (``Config.app: ...``)."""

    def __init__(self, field: str, message: str, where: str | None = None) -> None:
        self.field = field
        self.where = where
        prefix = f"{where}({field})" if where else f"Config.{field}"
        super().__init__(f"{prefix}: {message}")


class DecodeError(KinesumerError, ValueError):
    """A record's payload could not be decoded into the handler's type (``run(decode=...)``).

    The message names the stream, shard and sequence number and the decoder's own message; the
    record goes through the handler's failure policy like a handler error.
    """

    def __init__(self, stream: str, shard_id: str, sequence_number: str, message: str) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self.sequence_number = sequence_number
        super().__init__(f"record {stream}/{shard_id}/{sequence_number} did not decode: {message}")


class ConsumerClosedError(KinesumerError):
    """The consumer was closed; create a new one to consume again."""


class StateStoreError(KinesumerError):
    """A problem with the DynamoDB state table."""


class StateTableNotFoundError(StateStoreError):
    """The state table does not exist."""


class StateTableSchemaError(StateStoreError):
    """The state table exists but its key schema is not the one kinesumer needs."""


class RewindConflictError(StateStoreError):
    """A rewind (:func:`kinesumer.admin.rewind_group`) stopped: one shard's checkpoint item kept
    changing between its read and the conditional write (members claiming it or writing its
    checkpoint) past the attempts allowed. Nothing was overwritten. ``moved`` names the shards
    already moved (ancestors first), ``not_moved`` the rest, the failing one first: run the
    rewind again (it moves every shard again, so the result is the same as one clean run)."""

    def __init__(self, message: str, moved: tuple[str, ...], not_moved: tuple[str, ...]) -> None:
        self.moved = moved
        self.not_moved = not_moved
        super().__init__(message)


class CorruptStateError(StateStoreError):
    """An item in the state table holds a value kinesumer cannot read back.

    ``pk`` and ``sk`` name the item when the error comes from decoding one (None otherwise).
    A member skips what it cannot read rather than stopping: a corrupt client item is ignored,
    a shard whose checkpoint is corrupt is not read (and its checkpoint never overwritten), a
    corrupt shard cache leaves the member's last good one in place; each is logged once and
    counted in ``consumer.stats()``. Where reading cannot go on, the member stops with it.
    """

    def __init__(self, message: str, *, pk: str | None = None, sk: str | None = None) -> None:
        self.pk = pk
        self.sk = sk
        super().__init__(message)


class KinesisError(KinesumerError):
    """A problem with a Kinesis stream."""


class StreamNotFoundError(KinesisError):
    """A stream to consume does not exist."""


class AccessDeniedError(KinesumerError):
    """AWS denied a call: the message names the call and the resource."""


class AccountAccessError(AccessDeniedError):
    """A stream given by ARN lives in an account the member cannot reach: neither the config's
    own nor the caller's, and not in ``Config.accounts``; or its role cannot be assumed.
    ``account``, ``role_arn`` (None when none is configured) and ``action`` name what failed;
    raised at subscribe (the join or refresh that adds the stream), and by a running member
    whose renewal of an account's role credentials (``Config.accounts`` or ``role_arn``) STS
    refuses: the member fails as a whole, as on any access error (STS throttled or failing
    is not a refusal: reading pauses and tries again)."""

    def __init__(
        self, message: str, *, account: str, role_arn: str | None = None, action: str = ""
    ) -> None:
        super().__init__(message)
        self.account = account
        self.role_arn = role_arn
        self.action = action


class TransientAWSError(KinesumerError):
    """AWS kept failing with throttling, server errors or network errors past all retries."""


class MetricsNotInstalledError(KinesumerError, ImportError):
    """Metrics were asked for but ``prometheus_client`` is missing: install
    ``kinesumer[metrics]``."""


class EnhancedFanOutNotInstalledError(KinesumerError, ImportError):
    """Enhanced fan-out was asked for (``Config(enhanced_fan_out=True)``) but its HTTP/2 client
    (``httpx`` with ``h2``) is missing: install ``kinesumer[efo]``."""


class InProcessMockUnsupportedError(KinesumerError):
    """moto's in-process ``mock_aws`` cannot carry this call (enhanced fan-out's HTTP/2 event
    stream), and moto serves no SubscribeToShard in server mode either: test enhanced fan-out
    against a kinesis-mock endpoint (LocalStack, kinesis-local), the rest with it off."""


class ProducerError(KinesumerError):
    """A record could not be written by a :class:`~kinesumer.Producer` (its future holds the
    error), or the producer cannot take it."""


class InvalidRecordError(ProducerError, ValueError):
    """``put()`` was given something Kinesis cannot take: an empty or over-long partition key, a
    payload that is not bytes (without a topic to encode it), a bad explicit hash key, or a
    stream outside the producer's topics. The message says what to fix."""


class ReadOnlyStreamError(InvalidRecordError):
    """``put()`` named a DynamoDB table's stream ARN: such a stream is written through its table
    (PutItem, UpdateItem, ...), never by a producer. ``stream``: the ARN as given."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"put(stream): {stream!r} is a DynamoDB table's stream, which only its table "
            f"writes: write the table's items, or put to a Kinesis stream (by name or by "
            f"arn:aws:kinesis:<region>:<account>:stream/<name>)"
        )
        self.stream = stream


class RecordTooLargeError(InvalidRecordError):
    """A record's data plus its partition key exceed what its stream takes: 1 MiB, unless the
    stream's maximum record size (``MaxRecordSizeInKiB``) was raised, and 10 MiB at most.

    ``size``: the record's bytes (data plus UTF-8 key); ``limit``: the most it could have been;
    ``stream``: the stream whose limit refused it (None: no stream takes it).
    """

    def __init__(
        self, message: str, *, size: int = 0, limit: int = 0, stream: str | None = None
    ) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.stream = stream

    def __reduce__(self) -> tuple[Any, ...]:
        # Its fields survive pickling (Spark hands a task's error to the driver).
        return (type(self), (str(self),), self.__dict__)


class BufferFullError(ProducerError):
    """``put(..., block=False)`` (or ``Producer(block=False)``) met a full buffer: the producer
    holds ``max_buffered_records`` or ``max_buffered_bytes`` unwritten already."""


class DeliveryTimeoutError(ProducerError):
    """A record was not written within the producer's ``delivery_timeout`` (Kinesis kept
    refusing it, or the network kept failing); it was not sent again."""


class RecordRejectedError(ProducerError):
    """Kinesis refused an entry with an error that retrying will not heal (``code`` names it,
    e.g. ``KMSDisabledException`` or ``ValidationException``)."""

    def __init__(self, stream: str, code: str, message: str) -> None:
        self.stream = stream
        self.code = code
        super().__init__(f"Kinesis refused a record on {stream}: {code}: {message}")


class ProducerClosedError(ProducerError):
    """The producer was closed; create a new one to put again."""


class FlushError(ProducerError):
    """``flush()`` (or ``close()``) found records that were not written since the last flush.
    ``failures`` counts them by error name; each record's future holds its own error."""

    def __init__(self, failures: dict[str, int], first: BaseException | None) -> None:
        self.failures = dict(failures)
        self.first = first
        total = sum(failures.values())
        detail = ", ".join(f"{name}: {count}" for name, count in sorted(failures.items()))
        super().__init__(
            f"{total} record(s) were not written ({detail}); first: {first}; each record's "
            f"future holds its error"
        )


class OutboxError(KinesumerError):
    """The PostgreSQL outbox (:mod:`kinesumer.outbox`) cannot do what was asked; the message
    says what to fix. A payload its topic cannot encode raises
    :class:`InvalidRecordError` at ``publish()``, as at ``Producer.put()``."""


class OutboxTableNotFoundError(OutboxError):
    """The outbox table does not exist in the database: create it with
    ``PostgresOutbox.create_table()`` or ``kinesumer outbox create-table``."""


class OutboxConnectionError(OutboxError):
    """``publish()`` was given a connection it cannot write the row on: closed, broken, or
    not inside a transaction (the row would commit on its own, apart from the caller's
    changes)."""
