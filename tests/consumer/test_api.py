"""The public API on moto server: sync generator, named errors at start, errors from the engine
reaching the caller, KPL records end to end, and cross-account reading through a role ARN."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator
from botocore.exceptions import ClientError
from support.group import (
    create_stream,
    kinesis,
    kinesis_in_account_of,
    make_config,
    put,
    setup_table,
)
from support.wait import eventually

from kinesumer import (
    AccessDeniedError,
    AsyncKinesumer,
    ConsumerClosedError,
    Kinesumer,
    KinesumerError,
    Record,
    StateTableNotFoundError,
    StateTableSchemaError,
    StreamNotFoundError,
)
from kinesumer.aws import AwsClients, ClientFactory, RequestStats
from kinesumer.cli.status import open_table
from kinesumer.statestore.dynamodb.store import DynamoDBStateStore

Names = Callable[[str], str]


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("s")
    config = make_config(moto_url, moto_url, app, table)
    return {"url": moto_url, "config": config, "stream": stream, "table": table}


def test_sync_generator_reads_everything_and_resumes(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 3)
    produced = put(env["url"], env["stream"], 0, 90)
    got: list[Record] = []
    with Kinesumer(env["config"]) as consumer:
        for record in consumer.consume([env["stream"]]):
            got.append(record)
            if len(got) == 60:
                break
    produced += put(env["url"], env["stream"], 90, 10)
    with Kinesumer(env["config"]) as consumer:
        for record in consumer.consume([env["stream"]]):
            got.append(record)
            if len(got) == 100:
                break
    assert sorted(r.data for r in got) == sorted(produced)  # no loss, no duplicate


def test_close_from_another_thread_ends_the_generator(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 1)
    put(env["url"], env["stream"], 0, 5)
    consumer = Kinesumer(env["config"])
    got: list[Record] = []
    five = threading.Event()

    def run() -> None:
        for record in consumer.consume([env["stream"]]):
            got.append(record)
            if len(got) == 5:
                five.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert five.wait(30)
    consumer.close()  # the consuming thread is blocked waiting for records
    thread.join(10)
    assert not thread.is_alive()
    assert len(got) == 5
    with pytest.raises(ConsumerClosedError):
        next(iter(consumer.consume([env["stream"]])))


def test_missing_table_is_named_at_start(env: dict[str, Any]) -> None:
    create_stream(env["url"], env["stream"], 1)
    with Kinesumer(env["config"]) as consumer, pytest.raises(StateTableNotFoundError) as info:
        consumer.consume([env["stream"]])
    assert env["table"] in str(info.value) and "create-table" in str(info.value)


def test_wrong_key_schema_is_named_at_start(env: dict[str, Any]) -> None:
    boto3.client("dynamodb", endpoint_url=env["url"]).create_table(
        TableName=env["table"],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    create_stream(env["url"], env["stream"], 1)
    with Kinesumer(env["config"]) as consumer, pytest.raises(StateTableSchemaError, match="pk"):
        consumer.consume([env["stream"]])
    with pytest.raises(StateTableSchemaError):
        setup_table(env["config"])  # create_state_table refuses a table with other keys


def test_missing_stream_is_named_at_start(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    with Kinesumer(env["config"]) as consumer, pytest.raises(StreamNotFoundError, match="nope"):
        consumer.consume(["nope"])


async def test_access_denied_is_named() -> None:
    class DeniedClient:
        async def describe_table(self, **kwargs: Any) -> Any:
            raise ClientError(
                {"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "DescribeTable"
            )

    store = DynamoDBStateStore(DeniedClient(), "state-table", "app", RequestStats())
    with pytest.raises(AccessDeniedError, match=r"dynamodb:DescribeTable.*state-table"):
        await store.check()


async def test_stream_deleted_while_reading_reaches_the_caller(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 1)
    put(env["url"], env["stream"], 0, 3)
    consumer = AsyncKinesumer(env["config"])
    got = []
    with pytest.raises(KinesumerError) as info:
        async for record in consumer.consume([env["stream"]]):
            got.append(record)
            if len(got) == 3:
                kinesis(env["url"]).delete_stream(StreamName=env["stream"])
    assert isinstance(info.value, StreamNotFoundError)
    await consumer.aclose()


def aggregated(pairs: list[tuple[str, bytes]]) -> bytes:
    agg = RecordAggregator()
    for key, data in pairs:
        agg.add_user_record(key, data)
    _, _, blob = agg.clear_and_get().get_contents()
    return bytes(blob)


async def test_kpl_records_unpacked_and_checkpointed_by_sub_sequence(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 1)
    client = kinesis(env["url"])
    for n in range(3):  # three aggregates of four user records each
        blob = aggregated([(f"k{n}", f"{n}-{i}".encode()) for i in range(4)])
        client.put_record(StreamName=env["stream"], Data=blob, PartitionKey=f"k{n}")
    config = env["config"].replace(auto_commit=False)
    consumer = AsyncKinesumer(config)
    first: list[Record] = []
    async for record in consumer.consume([env["stream"]]):
        first.append(record)
        if len(first) == 6:  # stop inside the second aggregate
            await consumer.commit()
            break
    await consumer.aclose()
    assert [r.data for r in first] == [b"0-0", b"0-1", b"0-2", b"0-3", b"1-0", b"1-1"]
    assert [r.sub_sequence_number for r in first] == [0, 1, 2, 3, 0, 1]
    consumer = AsyncKinesumer(config)
    rest: list[Record] = []
    async for record in consumer.consume([env["stream"]]):
        rest.append(record)
        if len(rest) == 6:
            await consumer.commit()
            break
    await consumer.aclose()
    assert [r.data for r in rest] == [b"1-2", b"1-3", b"2-0", b"2-1", b"2-2", b"2-3"]


async def test_role_arn_reads_kinesis_with_refreshing_assumed_credentials(
    env: dict[str, Any],
) -> None:
    """The stream lives in another account (moto keeps accounts apart by credentials); the state
    table stays in the caller's."""
    setup_table(env["config"])
    role = "arn:aws:iam::210987654321:role/stream-reader"
    other = kinesis_in_account_of(env["url"], role)
    other.create_stream(StreamName=env["stream"], ShardCount=1)
    produced = [str(i).encode() for i in range(10)]
    for data in produced:
        other.put_record(StreamName=env["stream"], Data=data, PartitionKey="k")
    with pytest.raises(StreamNotFoundError):  # not in the caller's own account
        async for _ in AsyncKinesumer(env["config"]).consume([env["stream"]]):
            pass
    config = env["config"].replace(
        role_arn=role,
        external_id="ext-1234",
        sts_endpoint=env["url"],
    )
    consumer = AsyncKinesumer(config)
    got = []
    async for record in consumer.consume([env["stream"]]):
        got.append(record.data)
        if len(got) == 10:
            break
    assert got == produced
    await consumer.aclose()
    # The clients the engine builds from this config (the same factory, built here: the
    # consumer's own are not reachable from outside, on purpose).
    aws = AwsClients(config, RequestStats())
    await aws.open()
    kinesis_creds = aws.kinesis._request_signer._credentials
    dynamodb_creds = aws.dynamodb._request_signer._credentials
    assert kinesis_creds.method == "sts-assume-role"
    first = await kinesis_creds.get_frozen_credentials()
    assert first.access_key != "testing"  # assumed-role keys, not the caller's
    assert (await dynamodb_creds.get_frozen_credentials()).access_key == "testing"
    # Near expiry, botocore refreshes through our AssumeRole call before signing.
    kinesis_creds._expiry_time = datetime.now(timezone.utc) + timedelta(seconds=30)
    refreshed = await kinesis_creds.get_frozen_credentials()
    assert refreshed.access_key != first.access_key
    assert kinesis_creds._expiry_time > datetime.now(timezone.utc) + timedelta(minutes=14)
    await aws.close()


def test_blocking_kinesis_client_writes_through_the_role(env: dict[str, Any]) -> None:
    """Dead letters written from handler threads go where the engine reads: through role_arn."""
    role = "arn:aws:iam::210987654321:role/stream-reader"
    other = kinesis_in_account_of(env["url"], role)
    other.create_stream(StreamName=env["stream"], ShardCount=1)
    config = env["config"].replace(role_arn=role, sts_endpoint=env["url"])
    client = ClientFactory(config).sync_kinesis(attempts=1)
    client.put_record(StreamName=env["stream"], Data=b"dead", PartitionKey="k")
    shard = other.describe_stream(StreamName=env["stream"])["StreamDescription"]["Shards"][0]
    iterator = other.get_shard_iterator(
        StreamName=env["stream"], ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    assert [r["Data"] for r in other.get_records(ShardIterator=iterator)["Records"]] == [b"dead"]
    own = ClientFactory(env["config"]).sync_kinesis(attempts=1)
    with pytest.raises(own.exceptions.ResourceNotFoundException):  # not the caller's account
        own.put_record(StreamName=env["stream"], Data=b"x", PartitionKey="k")


def test_poll_returns_batches_bounded_by_count_and_time(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 2)
    produced = put(env["url"], env["stream"], 0, 250)
    config = env["config"].replace(auto_commit=False)
    got: list[Record] = []
    with Kinesumer(config) as consumer:
        with pytest.raises(RuntimeError, match="subscribe"):
            consumer.poll()
        consumer.subscribe([env["stream"]])
        while len(got) < 250:
            # At most 100, and no more than are left: the poll returns once they are in (a
            # fixed 5 s for 100 could end before the group's first read on a loaded machine).
            batch = consumer.poll(max_records=min(100, 250 - len(got)), timeout=30)
            assert 0 < len(batch) <= 100
            got.extend(batch)
            consumer.commit()
        assert consumer.poll(max_records=100, timeout=0.3) == []  # nothing left: times out
    assert sorted(r.data for r in got) == sorted(produced)
    with Kinesumer(config) as consumer:  # everything was committed: nothing comes back
        consumer.subscribe([env["stream"]])
        assert consumer.poll(max_records=10, timeout=1.5) == []


async def test_async_poll_auto_commit_processes_previous_poll(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 1)
    produced = put(env["url"], env["stream"], 0, 30)
    consumer = AsyncKinesumer(env["config"])
    await consumer.subscribe([env["stream"]])
    # Each poll returns once its 10 are in: a long timeout costs nothing when nothing is wrong.
    first = await consumer.poll(max_records=10, timeout=30)
    second = await consumer.poll(max_records=10, timeout=30)  # first poll's 10 are processed
    # Closed from a task that polled, not one that iterated consume(): the second poll's 10
    # were not finished (auto-commit counts them processed only at the next poll).
    await consumer.aclose()
    assert [r.data for r in first + second] == produced[:20]
    consumer = AsyncKinesumer(env["config"])
    await consumer.subscribe([env["stream"]])
    again = await consumer.poll(max_records=20, timeout=30)  # 0-9 again would come first
    await consumer.aclose()
    assert [r.data for r in again] == produced[10:30]


def test_leaving_on_an_exception_redelivers_only_the_record_in_hand(env: dict[str, Any]) -> None:
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 1)
    produced = put(env["url"], env["stream"], 0, 10)
    got: list[bytes] = []
    with pytest.raises(RuntimeError, match="sink down"), Kinesumer(env["config"]) as consumer:
        for record in consumer.consume([env["stream"]]):
            got.append(record.data)
            if len(got) == 5:
                raise RuntimeError("sink down")  # record 4 was not processed
    with Kinesumer(env["config"]) as consumer:
        for record in consumer.consume([env["stream"]]):
            got.append(record.data)
            if len(got) == 11:
                break
    assert got == produced[:5] + produced[4:]  # only the failed record comes again


async def start_joining(env: dict[str, Any]) -> tuple[AsyncKinesumer, asyncio.Task[None]]:
    """A consumer iterating in a task, returned while it is joining (registered, claiming, not
    started yet): a 20 ms poll lands inside the join."""
    setup_table(env["config"])
    create_stream(env["url"], env["stream"], 2)
    consumer = AsyncKinesumer(env["config"])

    async def run() -> None:
        async for _ in consumer.consume([env["stream"]]):
            pass

    task = asyncio.create_task(run())
    await eventually(lambda: consumer.stats().state == "joining", what="joining")
    return consumer, task


async def assert_left_and_released(env: dict[str, Any]) -> None:
    async with open_table(env["config"]) as (_, store):
        assert await store.list_clients() == []  # it left the group
        checkpoints = await store.get_checkpoints(env["stream"])
    assert checkpoints and all(c.owner is None for c in checkpoints.values())  # and released


async def test_close_while_joining_hands_off_and_ends_the_iteration(env: dict[str, Any]) -> None:
    consumer, task = await start_joining(env)
    await consumer.aclose()  # waits for the join, then hands off what it claimed
    await asyncio.wait_for(task, 10)
    await assert_left_and_released(env)


async def test_a_close_cancelled_during_the_join_can_be_repeated(env: dict[str, Any]) -> None:
    consumer, task = await start_joining(env)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(consumer.aclose(), 0.001)  # given up while the join runs
    await consumer.aclose()  # a second close still hands off what the join claimed
    await asyncio.wait_for(task, 10)
    await assert_left_and_released(env)
