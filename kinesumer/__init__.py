"""kinesumer: consume Amazon Kinesis streams as a consumer group, checkpointed in DynamoDB.

::

    from kinesumer import Config, Kinesumer

    config = Config(app="orders-etl", dynamodb_table="kinesumer-state", region="eu-west-1")
    with Kinesumer(config) as consumer:
        for record in consumer.consume(["orders"]):
            handle(record)
"""

# Only the errors (no imports of their own) and __version__ are bound here; every other name is
# imported on first use: see kinesumer.lazy_imports for why.
import typing as _typing

from . import lazy_imports as _lazy_imports
from ._version import __version__
from .errors import (
    AccessDeniedError,
    AccountAccessError,
    BufferFullError,
    ConfigError,
    ConsumerClosedError,
    CorruptStateError,
    DecodeError,
    DeliveryTimeoutError,
    EnhancedFanOutNotInstalledError,
    FlushError,
    InvalidRecordError,
    KinesisError,
    KinesumerError,
    MetricsNotInstalledError,
    OutboxConnectionError,
    OutboxError,
    OutboxTableNotFoundError,
    ProducerClosedError,
    ProducerError,
    ReadOnlyStreamError,
    RecordRejectedError,
    RecordTooLargeError,
    RewindConflictError,
    StateStoreError,
    StateTableNotFoundError,
    StateTableSchemaError,
    StreamNotFoundError,
    TransientAWSError,
)

if _typing.TYPE_CHECKING:  # what mypy and IDEs see; at run time, __getattr__ below binds these
    from .accounts import AccountAccess
    from .admin import create_state_table
    from .config import Config
    from .consumer.aio import AsyncKinesumer
    from .consumer.sync import Kinesumer
    from .models import Record
    from .producer import AsyncProducer, LatencySummary, Producer, ProducerStats, PutResult
    from .stats import ConsumerStats, ShardStatus
    from .topics import Topic

#: The lazily bound names, each with the module that defines it (relative to this package).
_LAZY_NAMES = {
    "AccountAccess": ".accounts",
    "AsyncKinesumer": ".consumer.aio",
    "AsyncProducer": ".producer",
    "Config": ".config",
    "ConsumerStats": ".stats",
    "Kinesumer": ".consumer.sync",
    "LatencySummary": ".producer",
    "Producer": ".producer",
    "ProducerStats": ".producer",
    "PutResult": ".producer",
    "Record": ".models",
    "ShardStatus": ".stats",
    "Topic": ".topics",
    "create_state_table": ".admin",
}


if not _typing.TYPE_CHECKING:  # so that a misspelt name stays a type error
    __getattr__ = _lazy_imports.module_getattr(__name__, _LAZY_NAMES)
__dir__ = _lazy_imports.module_dir(__name__, _LAZY_NAMES)

__all__ = [
    "AccessDeniedError",
    "AccountAccess",
    "AccountAccessError",
    "AsyncKinesumer",
    "AsyncProducer",
    "BufferFullError",
    "Config",
    "ConfigError",
    "ConsumerClosedError",
    "ConsumerStats",
    "CorruptStateError",
    "DecodeError",
    "DeliveryTimeoutError",
    "EnhancedFanOutNotInstalledError",
    "FlushError",
    "InvalidRecordError",
    "KinesisError",
    "Kinesumer",
    "KinesumerError",
    "LatencySummary",
    "MetricsNotInstalledError",
    "OutboxConnectionError",
    "OutboxError",
    "OutboxTableNotFoundError",
    "Producer",
    "ProducerClosedError",
    "ProducerError",
    "ProducerStats",
    "PutResult",
    "ReadOnlyStreamError",
    "Record",
    "RecordRejectedError",
    "RecordTooLargeError",
    "RewindConflictError",
    "ShardStatus",
    "StateStoreError",
    "StateTableNotFoundError",
    "StateTableSchemaError",
    "StreamNotFoundError",
    "Topic",
    "TransientAWSError",
    "__version__",
    "create_state_table",
]
