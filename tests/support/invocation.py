"""A handler's invocation at the unit level: fake handlers and a fake Kinesis client, a lease,
records, the counters and options an invocation is built with, and a fake sink."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kinesumer import Config
from kinesumer.handlers.invoke import CallEnvironment, Invocation
from kinesumer.handlers.policies import (
    Retry,
    Stop,
)
from kinesumer.models import Checkpoint, Record
from kinesumer.read.progress import ShardLease, shard_lease

FAST = Retry(attempts=3, backoff=0.0, max_backoff=0.0)


@dataclasses.dataclass(frozen=True)
class Options:
    """What run() hands an invocation (the runner's RunOptions has the same fields)."""

    on_failure: Any = dataclasses.field(default_factory=Stop)
    batch: Any = None
    decode: Any = None
    sink: Any = None
    name: str | None = "orders.handle"
    max_record_age: float | None = None


class Counters:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, outcome: str, n: int = 1) -> None:
        with self.lock:
            self.counts[outcome] += n


class FakeKinesis:
    """put_record recorded; ``failures`` raised first, one per call."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.puts: list[dict[str, Any]] = []
        self.failures = failures or []

    def put_record(self, **kwargs: Any) -> dict[str, Any]:
        if self.failures:
            raise self.failures.pop(0)
        self.puts.append(kwargs)
        return {"ShardId": "shardId-000000000000", "SequenceNumber": str(len(self.puts))}


class FakeFactory:
    """The ClientFactory seam: the config and a blocking Kinesis client."""

    def __init__(self, client: FakeKinesis) -> None:
        self.config = Config(app="shop", dynamodb_table="state", client_id="member-1")
        self.stats = None
        self.client = client

    def sync_kinesis(self, attempts: int | None = None) -> FakeKinesis:
        return self.client


def record(
    data: bytes = b'{"id": 1}', stream: str = "orders", seq: str = "100", key: str = "k1"
) -> Record:
    arrival = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    return Record(stream, "shardId-000000000001", seq, 0, key, data, arrival)


def lease() -> ShardLease:
    return shard_lease(Checkpoint("orders", "shardId-000000000001"))


def invocation(
    handler: Callable[..., Any], client: FakeKinesis | None = None, **options: Any
) -> tuple[Invocation, Counters]:
    counters = Counters()
    factory: Any = FakeFactory(client or FakeKinesis())
    made = Invocation(
        handler,
        Options(**options),
        factory,
        counters,
        False,
        environment=CallEnvironment(write_attempts=2),
    )
    return made, counters


class Failing:
    """A handler failing its first ``failures`` calls (forever with None)."""

    def __init__(self, failures: int | None = None) -> None:
        self.failures = failures
        self.calls: list[Any] = []

    def __call__(self, argument: Any, *rest: Any) -> None:
        self.calls.append(argument)
        if self.failures is None or len(self.calls) <= self.failures:
            raise RuntimeError(f"boom {len(self.calls)}")


def read_back(client: FakeKinesis, index: int) -> Record:
    """The record the run would read from the retry stream for the client's ``index``-th put."""
    put = client.puts[index]
    return Record(
        put["StreamName"],
        "shardId-000000000000",
        f"9{index}",
        0,
        put["PartitionKey"],
        put["Data"],
        None,
    )


class LeaseLost(Exception):
    pass


class FakeSink:
    def __init__(self, refuse: bool = False) -> None:
        self.commits: list[Any] = []
        self.refuse = refuse

    def transact_sync(self, lease: ShardLease, end: Any, body: Callable[[Any], None]) -> None:
        tx: list[Any] = []
        body(tx)
        if self.refuse:
            raise LeaseLost("fenced")
        self.commits.append((end, tx))
