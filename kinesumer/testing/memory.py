"""The in-memory stand-ins :class:`~.driver.HandlerDriver` runs a handler with: a clock the
test moves, a client factory that hands out :class:`~.kinesis.MemoryKinesis` (which keeps what
dead-letter and retry-later writers put) as botocore-shaped clients, a sink that keeps each
call's DynamoDB transaction instead of sending it, and call ends whose waits move the clock
instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from ..aws.clients import ClientFactory
from ..config import Config
from ..handlers.stopping import AsyncCallEnds
from ..kinesis.transport import PutRecordAnswer
from ..models import Position, Record
from ..read.progress import ShardLease
from ..sinks.dynamodb import DynamoDBTransaction
from .kinesis import MemoryKinesis


class VirtualClock:
    """Epoch seconds that move only when told: :meth:`advance`, or a handler call's wait."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        #: The clock never runs past this: a wait beyond it gives the call up (as a close would).
        self.horizon = self.now + 86_400.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.horizon = max(self.horizon, self.now + 86_400.0)


class _SyncKinesisClient:
    """The botocore-shaped PutRecord a synchronous dead-letter writer calls, on ``memory``."""

    def __init__(self, memory: MemoryKinesis) -> None:
        self.memory = memory

    def put_record(
        self, *, StreamName: str, Data: bytes, PartitionKey: str, **request: Any
    ) -> PutRecordAnswer:
        return self.memory.put(
            StreamName, Data, PartitionKey, explicit_hash_key=request.get("ExplicitHashKey")
        )


class _AsyncKinesisClient:
    """:class:`_SyncKinesisClient` for an async dead-letter writer."""

    def __init__(self, memory: MemoryKinesis) -> None:
        self.memory = memory

    async def put_record(
        self, *, StreamName: str, Data: bytes, PartitionKey: str, **request: Any
    ) -> PutRecordAnswer:
        return await self.memory.put_record(
            StreamName, Data, PartitionKey, explicit_hash_key=request.get("ExplicitHashKey")
        )


class MemoryClients(ClientFactory):
    """A client factory whose Kinesis is :class:`MemoryKinesis`; no other client exists."""

    def __init__(self, config: Config, kinesis: MemoryKinesis) -> None:
        super().__init__(config)
        self.memory = kinesis

    def sync_kinesis(self, *, attempts: int | None = None) -> Any:
        return _SyncKinesisClient(self.memory)

    @asynccontextmanager
    async def kinesis(self) -> AsyncIterator[Any]:
        yield _AsyncKinesisClient(self.memory)


class MemorySink:
    """An exactly-once sink that keeps each call's transaction: ``commits`` holds (the shard's
    position committed, the DynamoDB writes the handler added) per call, in order."""

    def __init__(self) -> None:
        self.commits: list[tuple[Position, list[dict[str, Any]]]] = []

    def attach(self, engine: Any) -> None:
        """No engine here."""

    def transact_sync(self, lease: ShardLease, end: Position, body: Callable[[Any], None]) -> None:
        tx = DynamoDBTransaction()
        body(tx)
        self.commits.append((end, tx.elements))

    async def transact_async(
        self, lease: ShardLease, end: Position, body: Callable[[Any], Any]
    ) -> None:
        tx = DynamoDBTransaction()
        await body(tx)
        self.commits.append((end, tx.elements))


def virtual_ends(clock: VirtualClock, base: type[Any]) -> Callable[..., Any]:
    """Call ends whose waits move ``clock`` instead of sleeping."""

    def wait(seconds: float) -> bool:
        if clock.now + seconds > clock.horizon:
            return True  # a Block that never succeeds: give up, as a close would
        clock.advance(max(seconds, 0.0))
        return False

    async def wait_async(seconds: float) -> bool:
        return wait(seconds)

    def make(stopping: Any, lease: ShardLease, records: list[Record]) -> Any:
        ends = base(stopping, lease, records)
        ends.wait = wait_async if base is AsyncCallEnds else wait
        return ends

    return make
