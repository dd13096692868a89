"""Public snapshots of what a consumer is doing: :class:`ConsumerStats` and :class:`ShardStatus`.

``consumer.stats()`` returns one; it is safe to call from any thread. The command line, the Spark
integration and the tests read these instead of the engine's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ShardStatus:
    """One shard this member holds a lease on, as the engine sees it now."""

    #: The stream the shard belongs to.
    stream: str
    #: The shard's id.
    shard_id: str
    #: The lease's state: ``"active"``, ``"revoking"``, ``"lost"`` or ``"released"``.
    status: str
    #: The sequence number last written to the checkpoint (None: none written yet).
    checkpoint: str | None
    #: MillisBehindLatest of the shard's last GetRecords (None until the first read).
    millis_behind: int | None
    #: The last GetRecords came back empty at the tip: nothing more to fetch now.
    caught_up: bool = False
    #: The shard's GetRecords reached SHARD_END: every record of the shard was fetched.
    ended: bool = False
    #: The shard was checkpointed finished (its children may be read).
    finished: bool = False
    #: Enhanced fan-out: how many times the shard's subscriptions stalled (no event for 10 s,
    #: refused or failing included) while this member held it.
    efo_stalls: int = 0
    #: Enhanced fan-out: the shard is read by polling (GetRecords) for now, after
    #: ``Config.efo_stall_limit`` stalls in a row; subscriptions are tried again later.
    efo_polling: bool = False


@dataclass(frozen=True)
class ConsumerStats:
    """A snapshot of what the engine is doing, for the application and for tests."""

    #: This member's client id.
    client_id: str
    #: Whether this member is the group's leader (index 0 of the sorted live ids).
    leader: bool
    #: The live members' ids, sorted, as last read.
    live_members: tuple[str, ...]
    #: The shards this member holds leases on, sorted by (stream, shard id).
    shards: tuple[ShardStatus, ...]
    #: Checkpoint writes attempted (refused ones included).
    checkpoint_writes: int
    #: Checkpoint writes refused because another member owns the shard.
    checkpoint_conflicts: int
    #: How many times this member's assignment changed.
    rebalances: int
    #: Retried AWS errors, by ``operation:error code``.
    retries: dict[str, int] = field(default_factory=dict)
    #: The last AWS error seen (repr), if any.
    last_error: str | None = None
    #: AWS requests made (every attempt), by ``service:Operation``.
    requests: dict[str, int] = field(default_factory=dict)
    #: Throttled AWS requests, by ``service:Operation``.
    throttles: dict[str, int] = field(default_factory=dict)
    #: DynamoDB capacity units consumed, by operation (heartbeats included).
    dynamodb_capacity: dict[str, float] = field(default_factory=dict)
    #: The engine's lifecycle state: "new", "joining", "running", "closing", "closed", "failed".
    state: str = "new"
    #: The coordinator wants shards it has not claimed yet (their claims are not settled).
    claims_pending: bool = False
    #: Coordinator ticks run so far (each reads the members and rebalances).
    coordinator_ticks: int = 0
    #: Records fetched and waiting in the buffer for delivery.
    buffered_records: int = 0
    #: Bytes fetched and waiting in the buffer for delivery, as counted against
    #: ``max_buffered_bytes``: data, partition keys and a fixed overhead per record.
    buffered_bytes: int = 0
    #: ``run()`` handlers: handler name -> outcome -> records (outcomes: ``ok``, ``retried``,
    #: ``discarded``, ``dead_lettered``, ``retry_later``, ``failed``, ``decode_error``).
    handled: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Records delivered as they came (``data``: the whole record, its own partition key)
    #: because they carried the KPL magic and digest but were not a valid aggregate.
    unaggregated_records: int = 0
    #: State table items skipped because they cannot be read back, by kind (``client``,
    #: ``checkpoint``, ``shard_cache``, ``view``): each counted once per item and problem.
    corrupt_state_items: dict[str, int] = field(default_factory=dict)
    #: ``stream/shard_id`` -> what is wrong: shards this member does not read because their
    #: checkpoint item is corrupt (never overwritten; repair it with ``kinesumer checkpoints``).
    unreadable_shards: dict[str, str] = field(default_factory=dict)
