"""Exactly-once sinks at their edges: a DynamoDB transaction whose outcome is in doubt, a shard
read to its end under a sink (parents before children), and a sink offered to a broadcast member.

Kinesis is kinesalite (it reports SHARD_END after a split); DynamoDB is moto in server mode (the
stand-in with TransactWriteItems). The handler adds 1 per record to a counter item, so a record
committed twice shows 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from support.group import create_stream, kinesis, put, state_store
from support.sink_driver import SinkMember
from support.sinks import counts, recorder
from support.standins import MotoStandIn
from support.wait import eventually

from kinesumer import AsyncKinesumer, ConfigError, Record
from kinesumer.aws import RequestStats, call_with_retry
from kinesumer.consumer.base import engine_of
from kinesumer.models import Position
from kinesumer.sinks import DynamoDBTransaction, DynamoDBTransactions, PostgresPositions


async def test_a_transaction_in_progress_is_asked_about_with_its_own_token(
    group: dict[str, Any], moto_server: MotoStandIn
) -> None:
    """A retry with the same token finds the first request still in progress
    (TransactionInProgressException): it may yet commit, so the sink asks again with that token
    (DynamoDB then answers for the one transaction) and never sends the writes under a new one."""
    config, stream, table = group["config"], group["stream"], group["table"]
    put(group["kinesis"], stream, 0, 2)
    sink = DynamoDBTransactions()
    member = SinkMember(config, stream, sink, recorder(table)).start()
    try:
        await eventually(lambda: member.check() or member.committed == 2, 30, "2 records")
        lease = next(x for x in member.engine.leases.values() if x.claim.checkpointed is not None)
        assert lease.claim.checkpointed is not None
        end = Position(str(int(lease.claim.checkpointed.sequence_number) + 1), 0)
        client = member.engine.aws.dynamodb
        real = client.transact_write_items
        tokens: list[str] = []
        answers: dict[str, Any] = {}

        async def in_doubt(**kwargs: Any) -> Any:
            token = kwargs["ClientRequestToken"]
            tokens.append(token)
            if token not in answers:  # DynamoDB applies a token once (its idempotency)
                answers[token] = await real(**kwargs)
            if len(tokens) == 1:  # it landed, but the answer says "still in progress"
                error = {"Code": "TransactionInProgressException", "Message": "in progress"}
                raise ClientError({"Error": error}, "TransactWriteItems")
            return answers[token]

        async def body(tx: DynamoDBTransaction) -> None:
            tx.update(
                table,
                {"pk": "once"},
                "ADD deliveries :one SET #d = :data",
                names={"#d": "data"},
                values={":one": 1, ":data": "once"},
            )

        client.transact_write_items = in_doubt
        try:
            await sink.transact_async(lease, end, body)
        finally:
            client.transact_write_items = real
        assert len(tokens) == 2 and tokens[0] == tokens[1]
        assert counts(moto_server.url, table)["once"] == 1
        assert lease.claim.checkpointed == end
    finally:
        await member.close()


async def test_a_shard_read_to_its_end_under_a_sink_finishes_and_its_children_follow(
    group: dict[str, Any], moto_server: MotoStandIn, unique_name: Callable[[str], str]
) -> None:
    """The checkpointer writes no position under a DynamoDB sink, yet a split parent read to
    SHARD_END is checkpointed finished, and its children start only after every parent record
    was committed; each record once."""
    config, table, url = group["config"], group["table"], group["kinesis"]
    stream = unique_name("split")
    create_stream(url, stream, 1)
    put(url, stream, 0, 30)
    calls: list[tuple[str, list[str]]] = []
    commit = recorder(table)

    def handle(records: list[Record], tx: DynamoDBTransaction) -> None:
        calls.append((records[0].shard_id, [r.data.decode() for r in records]))
        commit(records, tx)

    member = SinkMember(config, stream, DynamoDBTransactions(), handle, runner=True).start()
    try:

        def committed(n: int) -> Callable[[], bool]:
            return lambda: member.check() or len(counts(moto_server.url, table)) >= n

        await eventually(committed(30), 30, "the parent's first 30 records")
        client = kinesis(url)
        parent = client.list_shards(StreamName=stream)["Shards"][0]
        high = int(parent["HashKeyRange"]["EndingHashKey"])
        client.split_shard(
            StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(high // 2)
        )
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
        put(url, stream, 30, 40)
        await eventually(committed(70), 30, "the children's records")
        found = counts(moto_server.url, table)
        assert sorted(found, key=int) == [str(i) for i in range(70)]
        assert {d: n for d, n in found.items() if n != 1} == {}, "records committed twice"
        children = {shard for shard, _ in calls} - {parent["ShardId"]}
        assert len(children) == 2, calls
        last_parent = max(i for i, (shard, _) in enumerate(calls) if shard == parent["ShardId"])
        first_child = min(i for i, (shard, _) in enumerate(calls) if shard in children)
        assert last_parent < first_child
        async with state_store(config) as store:
            stored = await store.get_checkpoints(stream, [parent["ShardId"]])
        assert stored[parent["ShardId"]].finished
    finally:
        await member.close()


async def test_a_sink_is_refused_under_broadcast(group: dict[str, Any]) -> None:
    """Broadcast members hold no fenced leases: run(sink=...) is a ConfigError before anything
    starts, for either sink."""
    consumer = AsyncKinesumer(group["config"].replace(broadcast=True))

    async def handle(record: Record, tx: DynamoDBTransaction) -> None:
        raise AssertionError("nothing may be read")

    with pytest.raises(ConfigError, match=r"run\(sink\)"):
        await consumer.run([group["stream"]], handle, sink=DynamoDBTransactions())
    with pytest.raises(ConfigError, match="broadcast"):
        PostgresPositions("postgresql://unused").attach(engine_of(consumer))
    await consumer.aclose()


async def test_a_plain_write_meeting_a_sink_transaction_is_tried_again() -> None:
    """Under a DynamoDB sink every commit is a transaction on the shard's checkpoint item: a
    plain write to that item meanwhile (the owner's release or finish, another member's claim)
    is refused with TransactionConflictException (HTTP 400). It is transient: tried again, not
    an error that stops the engine."""
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            error = {"Code": "TransactionConflictException", "Message": "ongoing transaction"}
            meta = {"HTTPStatusCode": 400}
            raise ClientError({"Error": error, "ResponseMetadata": meta}, "UpdateItem")
        return "written"

    assert await call_with_retry("dynamodb.UpdateItem", write, RequestStats()) == "written"
    assert calls == 2


async def test_a_transaction_whose_answer_was_lost_is_committed_once(
    kinesalite: Any,
    moto_url: str,
    fault_proxy: Callable[[str], Any],
    unique_name: Callable[[str], str],
) -> None:
    """TransactWriteItems lands but its answer is lost (moto behind the fault proxy, which
    forwards the request and resets the connection): the library's retry sends it again with the
    same ClientRequestToken, and the writes apply once, as DynamoDB's idempotency makes them
    (moto ignored the token and applied the transaction twice: a record counted 2)."""
    from support.faultproxy import Fault
    from support.group import make_config, setup_table
    from support.sinks import SHARDS, sink_table

    proxy = fault_proxy(moto_url)
    config = make_config(kinesalite.url, proxy.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream, table = unique_name("s"), unique_name("sink")
    create_stream(kinesalite.url, stream, SHARDS)
    sink_table(moto_url, table)
    put(kinesalite.url, stream, 0, 20)
    rule = proxy.add_rule(
        Fault.lost_response(), service="dynamodb", operation="TransactWriteItems", count=2
    )
    member = SinkMember(config, stream, DynamoDBTransactions(), recorder(table)).start()
    try:
        await eventually(
            lambda: member.check() or len(counts(moto_url, table)) >= 20, 60, "20 records"
        )
        await eventually(lambda: member.check() or member.committed >= 20, 30, "every commit")
        assert rule.fired == 2
        found = counts(moto_url, table)
        assert sorted(found, key=int) == [str(i) for i in range(20)]
        assert {d: n for d, n in found.items() if n != 1} == {}, "records committed twice"
    finally:
        await member.close()
