"""The Prometheus metric families kinesumer exports (the ``metrics`` extra), in one place:
:class:`.metrics.PrometheusMetrics` records into them, and the bucket boundaries are
shared with :mod:`.otel_metrics` so both paths describe the same histograms."""

from __future__ import annotations

from typing import Any

# Seconds; GetRecords usually answers in tens of milliseconds, DynamoDB in single digits.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HANDOFF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Families:
    """The metric families, created once per registry (a registry refuses duplicates)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        member = ["app", "client_id"]
        shard = [*member, "stream", "shard_id"]
        call = [*member, "service", "operation"]
        kw = {"registry": registry}
        self.records = Counter(
            "kinesumer_records", "Records handed to the application.", shard, **kw
        )
        self.bytes = Counter(
            "kinesumer_bytes", "Bytes of record data handed to the application.", shard, **kw
        )
        self.behind = Gauge(
            "kinesumer_millis_behind_latest",
            "MillisBehindLatest of the last GetRecords on each shard this member reads.",
            shard,
            **kw,
        )
        self.calls = Counter(
            "kinesumer_aws_requests",
            "AWS requests, every attempt, by outcome ('ok' or the error code).",
            [*call, "outcome"],
            **kw,
        )
        self.latency = Histogram(
            "kinesumer_aws_request_seconds",
            "Latency of AWS requests (GetRecords, DynamoDB, ...).",
            call,
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.efo_stalls = Counter(
            "kinesumer_efo_stalls",
            "Enhanced fan-out subscriptions that gave no event for 10 s (read by polling after "
            "Config.efo_stall_limit in a row).",
            shard,
            **kw,
        )
        self.throttles = Counter(
            "kinesumer_throttles", "AWS requests refused for throughput.", call, **kw
        )
        self.capacity = Counter(
            "kinesumer_dynamodb_consumed_capacity",
            "DynamoDB capacity units consumed (ReturnConsumedCapacity=TOTAL).",
            [*member, "operation"],
            **kw,
        )
        self.checkpoints = Counter(
            "kinesumer_checkpoint_writes",
            "Checkpoint writes that landed.",
            [*member, "stream"],
            **kw,
        )
        self.conflicts = Counter(
            "kinesumer_checkpoint_conflicts",
            "Checkpoint writes refused because another member owns the shard.",
            [*member, "stream"],
            **kw,
        )
        self.owned = Gauge("kinesumer_owned_shards", "Shards this member reads.", member, **kw)
        self.leader = Gauge(
            "kinesumer_leader", "1 while this member leads its group, else 0.", member, **kw
        )
        self.rebalances = Counter(
            "kinesumer_rebalances", "Changes of this member's assignment.", member, **kw
        )
        self.handoff = Histogram(
            "kinesumer_handoff_seconds",
            "Graceful handoff of a shard: from revoke to the release write.",
            member,
            buckets=HANDOFF_BUCKETS,
            **kw,
        )
        self.handled = Counter(
            "kinesumer_handler_records",
            "Records given to a run() handler, by handler and outcome.",
            [*member, "handler", "outcome"],
            **kw,
        )
        self.handler_seconds = Histogram(
            "kinesumer_handler_seconds",
            "Duration of run() handler calls (each attempt), whatever their outcome.",
            [*member, "handler"],
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.efo_subscriptions = Counter(
            "kinesumer_efo_subscriptions",
            "Enhanced fan-out subscriptions (SubscribeToShard) begun, per shard.",
            shard,
            **kw,
        )
        self.efo_failures = Counter(
            "kinesumer_efo_subscription_failures",
            "Enhanced fan-out subscriptions that failed, by error (subscribed again later).",
            [*member, "stream", "error"],
            **kw,
        )
        self.unaggregated = Counter(
            "kinesumer_unaggregated_records",
            "Records delivered unaggregated: KPL magic and digest, but not a valid aggregate.",
            [*member, "stream"],
            **kw,
        )
        self.corrupt = Counter(
            "kinesumer_corrupt_state_items",
            "State table items skipped because they cannot be read back, by kind.",
            [*member, "kind"],
            **kw,
        )

        stream = [*member, "stream"]
        self.produced = Counter(
            "kinesumer_produced_records", "Records a Producer wrote.", stream, **kw
        )
        self.produced_bytes = Counter(
            "kinesumer_produced_bytes", "Bytes (data and key) a Producer wrote.", stream, **kw
        )
        self.produce_failures = Counter(
            "kinesumer_produce_failures",
            "Records a Producer could not write, by error.",
            [*stream, "error"],
            **kw,
        )
        self.produce_retries = Counter(
            "kinesumer_produce_retries", "PutRecords entries a Producer sent again.", stream, **kw
        )
        self.produce_throttled = Counter(
            "kinesumer_produce_throttled_entries",
            "PutRecords entries refused for throughput.",
            stream,
            **kw,
        )
        self.produce_latency = Histogram(
            "kinesumer_produce_seconds",
            "Per PutRecords answer: from the put of its oldest record to the answer.",
            stream,
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.produce_buffered = Gauge(
            "kinesumer_produce_buffered_records",
            "Records Producers put and not yet written or failed (their buffer).",
            member,
            **kw,
        )
        self.produce_buffered_bytes = Gauge(
            "kinesumer_produce_buffered_bytes",
            "Bytes (data and key) of the records Producers buffer.",
            member,
            **kw,
        )
        self.outbox_relayed = Counter(
            "kinesumer_outbox_relayed", "Outbox rows acknowledged by Kinesis.", stream, **kw
        )
        self.outbox_moved_aside = Counter(
            "kinesumer_outbox_moved_aside",
            "Outbox rows Kinesis refuses for good, moved to the dead-letter table.",
            stream,
            **kw,
        )
        self.outbox_pending = Gauge(
            "kinesumer_outbox_pending", "Outbox rows not yet acknowledged by Kinesis.", member, **kw
        )
        self.outbox_oldest = Gauge(
            "kinesumer_outbox_oldest_pending_seconds",
            "Age of the oldest outbox row not yet acknowledged (0 when none).",
            member,
            **kw,
        )
