"""The operator's calls on the state table: creating it, for local work and tests (production
provisions it with Terraform from ``infra/``, and the consumer never needs create-table rights),
and the group's operator controls (pins, step-downs, forced rebalances).

The controls are one item per app (:mod:`kinesumer.statestore.dynamodb.controls`), changed by a
read-modify-write conditional on the version read: a change that races another one is read
again and retried, never lost. Members read the item every ``max(10 s, heartbeat_interval)``, in
time slots aligned on the wall clock, so a control takes effect everywhere within about one slot
and one tick. Members of a version without controls ignore them: while one is live, the others
suspend pins and step-downs too (:mod:`kinesumer.group.controls`).

And the group's lag read from the streams themselves, so it is there with no member running
(:func:`group_lag`, :class:`LagProbe`): per shard the age of the oldest record not yet
checkpointed, by Kinesis's clock (:mod:`kinesumer.kinesis.lag_probe`, rules in
:mod:`kinesumer.core.lag`). Read-only; its reads count against the per-shard read limits every
reader of the stream shares.

And rewinding the group on a stream to a time (:func:`rewind_group`), by writes conditional on
the items as read, so that it works while the group runs.

Every name is importable from here; each concept lives in a module of its own:
:mod:`kinesumer.admin.controls` (the table, the controls, deregistering a consumer),
:mod:`kinesumer.admin.lag`, :mod:`kinesumer.admin.rewind`.
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
