"""DynamoDBTransactions: each record lands exactly once in a DynamoDB sink table, through a
rebalance, a zombie's late commit and a member killed mid-stream.

Kinesis is kinesalite (real 56-digit sequence numbers); DynamoDB is moto in server mode, the one
stand-in with TransactWriteItems and cancellation reasons (dynalite has no transactions).
Members run ``AsyncKinesumer.run(..., sink=DynamoDBTransactions())`` (:mod:`support.sink_driver`),
or drive the sink directly where a test calls it itself. The handler adds 1 to a counter item per
record (``ADD deliveries :one``): a record committed twice would show 2, so the test can fail on a
duplicate (a plain put would overwrite it silently)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from support.group import put, state_store
from support.sink_driver import SinkMember
from support.sinks import (
    SHARDS,
    counts,
    recorder,
)
from support.standins import MotoStandIn
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.group.checkpointer import Checkpointer
from kinesumer.models import Checkpoint, Position
from kinesumer.read.progress import shard_lease
from kinesumer.sinks import (
    DynamoDBTransaction,
    DynamoDBTransactions,
    LeaseLostError,
    TransactionCanceledError,
    TransactionTooLargeError,
)


async def test_exactly_once_through_zombie_rebalance_and_crash(
    group: dict[str, Any], moto_server: MotoStandIn
) -> None:
    config, stream, table, url = group["config"], group["stream"], group["table"], group["kinesis"]
    members: list[SinkMember] = []

    def done(n: int) -> Callable[[], bool]:
        def check() -> bool:
            for member in members:
                member.check()
            return len(counts(moto_server.url, table)) >= n

        return check

    put(url, stream, 0, 100)
    a = SinkMember(config, stream, DynamoDBTransactions(), recorder(table), pace=0.02, runner=True)
    members.append(a.start())
    await eventually(done(100), 30, "member A committing the first 100 records")

    # A zombie: another member claims one of A's shards (lease + 1) while A still holds its lease
    # object. A's late commit is refused by the checkpoint's fence and writes nothing.
    shard = sorted(a.owned())[0]
    old = a.engine.leases[(stream, shard)]
    async with state_store(config) as store:
        seen = (await store.get_checkpoints(stream, [shard]))[shard]
        assert await store.claim(stream, shard, "intruder", seen) is not None

    async def marker(tx: DynamoDBTransaction) -> None:
        tx.put(table, {"pk": "zombie", "data": "zombie", "deliveries": 1})

    end = Position(seen.sequence_number or "0", seen.sub_sequence_number)
    with pytest.raises(LeaseLostError):
        await a.sink.transact_async(old, end, marker)
    assert "zombie" not in counts(moto_server.url, table)
    await eventually(lambda: shard in a.owned(), 30, "A claiming the shard back from the intruder")

    b = SinkMember(config, stream, DynamoDBTransactions(), recorder(table), pace=0.02, runner=True)
    members.append(b.start())
    await eventually(lambda: len(a.owned()) == len(b.owned()) == 1, 30, "a rebalance to A and B")
    put(url, stream, 100, 300)
    await eventually(done(130), 30, "both committing again")
    await a.crash()  # mid-stream: records delivered to A and not committed are read again by B
    members.remove(a)
    await eventually(lambda: len(b.owned()) == SHARDS, 30, "B taking the crashed member's shard")
    try:
        await eventually(done(400), 60, "every record committed")
        found = counts(moto_server.url, table)
        assert sorted(found, key=int) == [str(i) for i in range(400)]
        assert {d: n for d, n in found.items() if n != 1} == {}, "records committed twice"
        assert b.engine.checkpointer.conflicts == 0
    finally:
        await b.close()


async def test_refusals_sync_face(group: dict[str, Any], moto_server: MotoStandIn) -> None:
    """transact_sync on a worker thread: a handler's own failed condition is a
    TransactionCanceledError (nothing committed, the lease stays), a handler adding more than 99
    writes a TransactionTooLargeError, an empty body still moves the position."""
    config, stream, table, url = group["config"], group["stream"], group["table"], group["kinesis"]
    put(url, stream, 0, 4)
    sink = DynamoDBTransactions()
    member = SinkMember(config, stream, sink, recorder(table), sync=True).start()
    try:
        await eventually(lambda: member.committed == 4, 30, "4 records committed")
        assert len(counts(moto_server.url, table)) == 4
        lease = next(x for x in member.engine.leases.values() if x.claim.checkpointed is not None)
        committed = lease.claim.checkpointed
        assert committed is not None
        further = Position(str(int(committed.sequence_number) + 1), 0)

        def refused(tx: DynamoDBTransaction) -> None:
            tx.put(table, {"pk": "x", "data": "x", "deliveries": 1})
            tx.check(table, {"pk": "missing"}, "attribute_exists(pk)")

        with pytest.raises(TransactionCanceledError) as caught:
            await asyncio.to_thread(sink.transact_sync, lease, further, refused)
        assert [r["Code"] for r in caught.value.reasons][1] == "ConditionalCheckFailed"
        assert "x" not in counts(moto_server.url, table) and lease.claim.deliverable

        def too_many(tx: DynamoDBTransaction) -> None:
            for i in range(100):
                tx.put(table, {"pk": f"many{i}"})

        with pytest.raises(TransactionTooLargeError):
            await asyncio.to_thread(sink.transact_sync, lease, further, too_many)

        await asyncio.to_thread(sink.transact_sync, lease, further, lambda tx: None)
        async with state_store(config) as store:
            stored = (await store.get_checkpoints(stream, [lease.key[1]]))[lease.key[1]]
        assert stored.sequence_number == further.sequence_number
    finally:
        await member.close()


class RecordingStore:
    """The one StateStore call the checkpointer makes, recorded (the rest is not needed)."""

    def __init__(self) -> None:
        self.writes: list[tuple[Position | None, bool, bool]] = []

    async def write_checkpoint(
        self, checkpoint: Any, position: Position | None, *, finished: bool, release: bool
    ) -> bool:
        self.writes.append((position, finished, release))
        return True


async def test_checkpointer_writes_no_position_when_a_sink_does() -> None:
    """With sink-written positions a flush writes nothing and a release only releases: a
    position read before a transaction committed a newer one can never land after it."""
    store = RecordingStore()
    checkpointer = Checkpointer(store, "me")  # type: ignore[arg-type]
    checkpointer.positions_by_sink = True
    lease = shard_lease(Checkpoint("s", "shard", "1", owner="me", lease=3))
    lease.progress.mark_processed(Position("5"))
    assert await checkpointer.write(lease)  # the periodic flush
    assert await checkpointer.write(lease, finished=True, release=True)
    assert store.writes == [(None, True, True)]
    assert lease.claim.checkpointed == Position("1")  # the sink marks it after its commits

    checkpointer.positions_by_sink = False  # the iterator's and plain handlers' behaviour
    assert await checkpointer.write(lease)
    assert store.writes[-1] == (Position("5"), False, False)


async def test_a_claim_hook_that_raises_stops_run(
    group: dict[str, Any], moto_server: MotoStandIn
) -> None:
    """The engine seam: a sink's claim hook failing (its database unreachable past its retries)
    stops the engine, and run() raises that error."""

    class BrokenSink(DynamoDBTransactions):
        def attach(self, engine: Any) -> None:
            super().attach(engine)

            async def hook(lease: Any) -> None:
                raise RuntimeError("the sink's store is unreachable")

            engine.claim_hook = hook

    config, stream = group["config"], group["stream"]
    put(group["kinesis"], stream, 0, 2)

    async def handle(record: Record, tx: DynamoDBTransaction) -> None:
        raise AssertionError("no record may be read before the hook succeeded")

    consumer = AsyncKinesumer(config)
    try:
        with pytest.raises(RuntimeError, match="unreachable"):
            await asyncio.wait_for(consumer.run([stream], handle, sink=BrokenSink()), 30)
    finally:
        with contextlib.suppress(Exception):
            await consumer.aclose()
