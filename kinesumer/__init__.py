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
    ConfigError,
    ConsumerClosedError,
    CorruptStateError,
    DecodeError,
    EnhancedFanOutNotInstalledError,
    KinesisError,
    KinesumerError,
    MetricsNotInstalledError,
    StateStoreError,
    StateTableNotFoundError,
    StateTableSchemaError,
    StreamNotFoundError,
    TransientAWSError,
)
from .models import Record
from .stats import ConsumerStats, ShardStatus

__all__ = [
    "AccessDeniedError",
    "AsyncKinesumer",
    "Config",
    "ConfigError",
    "ConsumerClosedError",
    "ConsumerStats",
    "CorruptStateError",
    "DecodeError",
    "EnhancedFanOutNotInstalledError",
    "KinesisError",
    "Kinesumer",
    "KinesumerError",
    "MetricsNotInstalledError",
    "Record",
    "ShardStatus",
    "StateStoreError",
    "StateTableNotFoundError",
    "StateTableSchemaError",
    "StreamNotFoundError",
    "TransientAWSError",
    "__version__",
    "create_state_table",
]
