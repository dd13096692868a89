"""The operator's calls: the state table and the group's operator controls (pins, step-downs,
forced rebalances; :mod:`kinesumer.admin.controls`), the group's lag read from the streams
themselves, so it is there with no member running (:mod:`kinesumer.admin.lag`), and rewinding
the group on a stream to a time while it runs (:mod:`kinesumer.admin.rewind`). The controls
and the rewind write conditionally on what they read, so both work while the group runs; the
lag only reads.

Every name is importable from here.
"""

from __future__ import annotations

# What callers meet in the functions' arguments, results and errors: importable from here too
# (not in __all__: the API reference documents each where it is defined).
from ..config import Config as Config
from ..core.controls import Controls as Controls
from ..core.controls import StepDown as StepDown
from ..core.lag import GroupLag as GroupLag
from ..core.lag import ShardLag as ShardLag
from ..core.rewind import LATEST as LATEST
from ..core.rewind import TRIM_HORIZON as TRIM_HORIZON
from ..core.rewind import RewindTarget as RewindTarget
from ..core.rewind import ShardRewind as ShardRewind
from ..errors import AccessDeniedError as AccessDeniedError
from ..errors import ConfigError as ConfigError
from ..errors import RewindConflictError as RewindConflictError
from ..errors import StateStoreError as StateStoreError
from ..errors import StateTableNotFoundError as StateTableNotFoundError
from ..errors import StateTableSchemaError as StateTableSchemaError
from ..errors import StreamNotFoundError as StreamNotFoundError
from ..kinesis.efo.consumers import deregister_stream_consumer as deregister_stream_consumer
from ..kinesis.lag_probe import MAX_PAGES as MAX_PAGES
from ..kinesis.transport import KinesisTransport as KinesisTransport
from ..statestore.dynamodb.store import DynamoDBStateStore as DynamoDBStateStore
from ..statestore.group_view import TableReads as TableReads
from .controls import (
    CONTROLS_ATTEMPTS,
    STEP_DOWN_GC_MS,
    create_state_table,
    deregister_consumer,
    force_rebalance,
    list_pins,
    pin_shard,
    read_controls,
    step_down,
    unpin_shard,
    update_controls,
)
from .lag import DEFAULT_LAG_INTERVAL, LagProbe, group_lag, live_members, probe_group_lag
from .rewind import (
    CACHE_ATTEMPTS,
    FUTURE_SLACK_MS,
    REWIND_ATTEMPTS,
    RewindResult,
    rewind_group,
    rewind_stream,
)
from .shards import PROBE_CONCURRENCY

__all__ = [
    "CACHE_ATTEMPTS",
    "CONTROLS_ATTEMPTS",
    "DEFAULT_LAG_INTERVAL",
    "FUTURE_SLACK_MS",
    "PROBE_CONCURRENCY",
    "REWIND_ATTEMPTS",
    "STEP_DOWN_GC_MS",
    "LagProbe",
    "RewindResult",
    "create_state_table",
    "deregister_consumer",
    "force_rebalance",
    "group_lag",
    "list_pins",
    "live_members",
    "pin_shard",
    "probe_group_lag",
    "read_controls",
    "rewind_group",
    "rewind_stream",
    "step_down",
    "unpin_shard",
    "update_controls",
]
