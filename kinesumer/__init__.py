"""kinesumer: consume Amazon Kinesis streams as a consumer group, checkpointed in DynamoDB.

::

    from kinesumer import Config, Kinesumer

    config = Config(app="orders-etl", dynamodb_table="kinesumer-state", region="eu-west-1")
    with Kinesumer(config) as consumer:
        for record in consumer.consume(["orders"]):
            handle(record)
"""

from ._version import __version__
from .admin import create_state_table
from .config import Config
from .consumer.aio import AsyncKinesumer
from .consumer.sync import Kinesumer
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
from .models import Record
from .producer import AsyncProducer, LatencySummary, Producer, ProducerStats, PutResult
from .stats import ConsumerStats, ShardStatus
from .topics import Topic

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
