"""kinesumer: consume Amazon Kinesis streams as a consumer group, checkpointed in DynamoDB.

::

    from kinesumer import Config, Kinesumer

    config = Config(app="orders-etl", dynamodb_table="kinesumer-state", region="eu-west-1")
    with Kinesumer(config) as consumer:
        for record in consumer.consume(["orders"]):
            handle(record)
"""

# Importing the package is cheap: the errors and ``__version__`` are bound at once, every other
# name is imported from its module on first use (PEP 562) and then kept. Spark executors, the
# command line and the pytest plugin import ``kinesumer`` (as the parent of what they need) in
# every process; they should not pay for the engine, the consumers, the producer and boto3 unless
# they use them.
import typing as _typing

from ._version import __version__
from .errors import (
    AccessDeniedError,
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
    RecordRejectedError,
    RecordTooLargeError,
    StateStoreError,
    StateTableNotFoundError,
    StateTableSchemaError,
    StreamNotFoundError,
    TransientAWSError,
)

if _typing.TYPE_CHECKING:  # what mypy and IDEs see; at run time, __getattr__ below binds these
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


def __getattr__(name: str) -> object:
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module_name, __name__), name)
    globals()[name] = value  # the next access is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AccessDeniedError",
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
    "Record",
    "RecordRejectedError",
    "RecordTooLargeError",
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
