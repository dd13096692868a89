"""Request accounting: every request an AWS client of kinesumer makes, counted where
``consumer.stats()`` and the metrics can read it.

:func:`instrument` hooks a client's botocore events (boto3 and aiobotocore clients emit the same
ones); :class:`RequestStats` holds the counts: every request (each attempt), retried errors
among them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from ..observability.metrics import Metrics

#: Error codes AWS answers with when a caller goes faster than its limits allow.
THROTTLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "KMSThrottlingException",
        "TooManyRequestsException",
    }
)


class RequestStats:
    """What an engine's AWS clients did, shared across the engine and readable through
    ``consumer.stats()``: retried errors by (operation, error code), every request by
    ``service:Operation`` (each attempt: the engine's clients do not retry inside botocore; the
    heartbeat thread's client makes one quick retry of its own, counted with its call),
    throttled requests, DynamoDB capacity consumed. Also forwards each
    request to the engine's :class:`~kinesumer.observability.metrics.Metrics`."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.retries: Counter[tuple[str, str]] = Counter()
        self.last_error: BaseException | None = None
        self.requests: Counter[str] = Counter()
        self.throttles: Counter[str] = Counter()
        self.capacity: dict[str, float] = {}  # DynamoDB capacity units by operation
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()  # the heartbeat thread's client reports here too
        # What the engine refused to trust (see the methods below): shown by consumer.stats().
        self.unaggregated_records = 0
        self.corrupt_items: Counter[str] = Counter()
        self.unreadable_shards: dict[str, str] = {}

    def counts(self) -> dict[str, Any]:
        """Copies of the request, throttle and capacity counts (another thread adds to them)."""
        with self._lock:
            return {
                "requests": dict(self.requests),
                "throttles": dict(self.throttles),
                "dynamodb_capacity": dict(self.capacity),
                "unaggregated_records": self.unaggregated_records,
                "corrupt_state_items": dict(self.corrupt_items),
                "unreadable_shards": dict(sorted(self.unreadable_shards.items())),
            }

    def request(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        key = f"{service}:{operation}"
        with self._lock:
            self.requests[key] += 1
            if capacity:
                self.capacity[operation] = self.capacity.get(operation, 0.0) + capacity
            if error in THROTTLE_CODES:
                self.throttles[key] += 1
        self.metrics.aws_call(service, operation, seconds, error, capacity)
        if error in THROTTLE_CODES:
            self.metrics.throttled(service, operation)

    # -- hostile input ------------------------------------------------------------------------
    def unaggregated(self, stream: str, shard_id: str) -> None:
        """A record with the KPL magic and digest was not a valid aggregate: delivered as is
        (:func:`kinesumer.kinesis.kpl.to_records`)."""
        with self._lock:
            self.unaggregated_records += 1
        self.metrics.unaggregated(stream, shard_id)

    def corrupt_item(self, kind: str) -> None:
        """A state item of ``kind`` (client, checkpoint, shard_cache, view) could not be read
        and was skipped: counted once per item and problem (the state store logs it once)."""
        with self._lock:
            self.corrupt_items[kind] += 1
        self.metrics.corrupt_state_item(kind)

    def shard_unreadable(self, shard: str, problem: str | None) -> None:
        """``shard`` ("stream/shard id") is not read because its checkpoint is corrupt;
        ``problem`` None: it reads back again (repaired or deleted)."""
        with self._lock:
            if problem is None:
                self.unreadable_shards.pop(shard, None)
            else:
                self.unreadable_shards[shard] = problem


#: DynamoDB operations that can report the capacity they consumed.
_CAPACITY_OPERATIONS = frozenset(
    {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem"}
    | {"BatchWriteItem", "TransactGetItems", "TransactWriteItems"}
)


def _consumed(parsed: dict[str, Any]) -> float:
    consumed = parsed.get("ConsumedCapacity")
    if isinstance(consumed, dict):
        consumed = [consumed]
    return float(sum(c.get("CapacityUnits", 0) or 0 for c in consumed or ()))


def instrument(client: Any, stats: RequestStats) -> Any:
    """Account every request ``client`` makes (boto3 or aiobotocore: the same events) in
    ``stats``: count, latency, error code and, for DynamoDB, the capacity it consumed (asked for
    with ``ReturnConsumedCapacity=TOTAL``, which costs nothing). Returns ``client``."""
    service = client.meta.service_model.service_id.hyphenize()  # "dynamodb", "kinesis", "sts"
    events = client.meta.events
    key = "kinesumer_call"

    def before_parameter_build(params: dict[str, Any], model: Any, context: Any, **_: Any) -> None:
        if service == "dynamodb" and model.name in _CAPACITY_OPERATIONS:
            params.setdefault("ReturnConsumedCapacity", "TOTAL")
        context[key] = (model.name, time.perf_counter())

    def after_call(http_response: Any, parsed: Any, context: Any, **_: Any) -> None:
        operation, started = context.get(key, ("unknown", time.perf_counter()))
        failed = http_response.status_code >= 300
        error = str(parsed.get("Error", {}).get("Code", "") or "HTTP") if failed else None
        seconds = time.perf_counter() - started
        stats.request(service, operation, seconds, error, _consumed(parsed))

    def after_call_error(exception: BaseException, context: Any, **_: Any) -> None:
        operation, started = context.get(key, ("unknown", time.perf_counter()))
        seconds = time.perf_counter() - started
        stats.request(service, operation, seconds, type(exception).__name__, 0.0)

    events.register(f"before-parameter-build.{service}", before_parameter_build)
    events.register(f"after-call.{service}", after_call)
    events.register(f"after-call-error.{service}", after_call_error)
    return client
