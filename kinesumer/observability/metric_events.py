"""What the engine reports about itself: :class:`Metrics`, the interface every metrics backend
implements (:class:`.metrics.PrometheusMetrics`,
:class:`.otel_metrics.OpenTelemetryMetrics`). This base records nothing (metrics off,
the default); it needs nothing, so both backends build on it without importing each other."""

from __future__ import annotations


class Metrics:
    """What the engine reports. This base records nothing."""

    #: Whether :meth:`handler_call` records anything: handlers are only timed when it does.
    times_handlers = False

    def delivered(self, stream: str, shard_id: str, records: int, nbytes: int) -> None:
        """A batch of ``records`` (``nbytes`` of data) handed to the application."""

    def behind(self, stream: str, shard_id: str, millis: int | None) -> None:
        """MillisBehindLatest of the last GetRecords on a shard."""

    def shard_dropped(self, stream: str, shard_id: str) -> None:
        """The shard left this member: forget its series."""

    def aws_call(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        """One AWS request (every attempt, retries included), its error code if it failed and
        the DynamoDB capacity it consumed."""

    def throttled(self, service: str, operation: str) -> None:
        """One AWS request refused for throughput."""

    def checkpoint(self, stream: str, conflict: bool) -> None:
        """A checkpoint write landed, or was refused because another member owns the shard."""

    def membership(self, owned: int, leader: bool) -> None:
        """Shards this member reads now, and whether it leads."""

    def rebalanced(self) -> None:
        """This member's assignment changed."""

    def handoff(self, seconds: float) -> None:
        """A shard was handed off: from revoke to the release write."""

    def handled(self, handler: str, outcome: str, records: int) -> None:
        """``records`` records given to ``run()``'s ``handler`` had ``outcome`` (ok,
        retried, discarded, dead_lettered, retry_later, failed, decode_error)."""

    def handler_call(self, handler: str, seconds: float) -> None:
        """One call of ``run()``'s ``handler`` (an attempt: a retry is a call of its own) took
        ``seconds``, whatever its outcome."""

    def efo_subscribed(self, stream: str, shard_id: str) -> None:
        """Enhanced fan-out: a SubscribeToShard subscription of a shard began (one per shard
        every 5 minutes while all is well)."""

    def efo_subscribe_failed(self, stream: str, error: str) -> None:
        """Enhanced fan-out: a subscription failed with ``error`` (subscribed again later)."""

    def efo_stalled(self, stream: str, shard_id: str) -> None:
        """Enhanced fan-out: a subscription of the shard stalled (no event for 10 s)."""

    def unaggregated(self, stream: str, shard_id: str) -> None:
        """A record had the KPL magic and digest but was not a valid aggregate: delivered as
        is."""

    def corrupt_state_item(self, kind: str) -> None:
        """A state item of ``kind`` could not be read back and was skipped."""

    def produced(self, stream: str, records: int, nbytes: int, seconds: float) -> None:
        """Producer, once per PutRecords answer: ``records`` written to ``stream``; ``seconds``
        from the put of the oldest of them to the answer."""

    def produce_failed(self, stream: str, error: str) -> None:
        """Producer: a record failed for good (its future holds ``error``; rare)."""

    def produce_retried(self, stream: str, entries: int, throttled: int) -> None:
        """Producer, once per answer with refusals: entries to send again, ``throttled`` of
        them refused for throughput."""

    def produce_buffer_changed(self, records: int, nbytes: int) -> None:
        """Producer, at most about twice a second while its buffer changes, and at each flush
        and close: how its records put and not yet resolved changed since its last call
        (signed), so that several producers of one process add up; each returns to 0."""

    def outbox_relayed(self, stream: str, records: int) -> None:
        """Outbox relay, once per cycle and stream: rows acknowledged by Kinesis."""

    def outbox_moved_aside(self, stream: str) -> None:
        """Outbox relay: a row Kinesis refuses for good moved to the dead-letter table."""

    def outbox_lag(self, pending: int, oldest_seconds: float | None) -> None:
        """Outbox relay, about once a second: rows not yet acknowledged, the oldest's age."""

    def close(self) -> None:
        """The member left."""
