"""kinesumer under moto's in-process ``mock_aws``: the test a new user writes the way moto's
documentation shows (no server, no endpoint), for the blocking and async consumers, ``run()``
with a DynamoDB sink and a failure policy, and the producer.

moto's in-process mock answers with botocore's response type, which aiobotocore cannot await
(aio-libs/aiobotocore#1320): :mod:`kinesumer.aws.moto_adapter` adapts it while a mock is active.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from kinesumer import AsyncKinesumer, Config, Kinesumer, create_state_table
from kinesumer.handlers import DeadLetter, Discard, Retry
from kinesumer.producer import AsyncProducer, Producer
from kinesumer.sinks import DynamoDBTransaction, DynamoDBTransactions
from kinesumer.testing import InProcessMockUnsupportedError

REGION = "us-east-1"


@pytest.fixture
def mocked() -> Iterator[Any]:
    with mock_aws():
        kinesis = boto3.client("kinesis", region_name=REGION)
        kinesis.create_stream(StreamName="orders", ShardCount=2)
        kinesis.get_waiter("stream_exists").wait(StreamName="orders")
        yield kinesis


def config(**overrides: Any) -> Config:
    options: dict[str, Any] = {
        "app": "mocked",
        "dynamodb_table": "kinesumer-state",
        "region": REGION,
        "initial_position": "TRIM_HORIZON",
        **overrides,
    }
    made = Config(**options)
    return made


def put(kinesis: Any, stream: str, values: list[int]) -> None:
    for value in values:
        kinesis.put_record(StreamName=stream, Data=str(value).encode(), PartitionKey=str(value))


def test_blocking_consumer_reads_a_mocked_stream(mocked: Any) -> None:
    settings = config()
    create_state_table(settings)
    put(mocked, "orders", list(range(10)))
    seen: list[int] = []
    with Kinesumer(settings) as consumer:
        consumer.subscribe(["orders"])
        for _ in range(50):
            seen += [int(r.data) for r in consumer.poll(timeout=0.2)]
            if len(seen) >= 10:
                break
        consumer.commit()
    assert sorted(seen) == list(range(10))


def test_async_consumer_reads_a_mocked_stream(mocked: Any) -> None:
    settings = config()
    create_state_table(settings)
    put(mocked, "orders", list(range(6)))

    async def consume() -> list[int]:
        seen: list[int] = []
        async with AsyncKinesumer(settings) as consumer:
            async for record in consumer.consume(["orders"]):
                seen.append(int(record.data))
                if len(seen) == 6:
                    break
        return seen

    assert sorted(asyncio.run(consume())) == list(range(6))


def test_run_with_a_dynamodb_sink_and_a_dead_letter_policy(mocked: Any) -> None:
    settings = config()
    create_state_table(settings)
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    dynamodb.create_table(
        TableName="totals",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    mocked.create_stream(StreamName="orders-dlq", ShardCount=1)
    put(mocked, "orders", list(range(8)))
    handled: list[int] = []

    def count(record: Any, tx: DynamoDBTransaction) -> None:
        value = int(record.data)
        if value == 3:
            raise ValueError("three is refused")
        handled.append(value)
        tx.update("totals", {"pk": "all"}, "ADD n :one", values={":one": 1})

    with Kinesumer(settings) as consumer:

        def close_when_done() -> None:
            while len(handled) < 7 and not done.wait(0.1):
                pass
            consumer.close()

        done = threading.Event()
        closer = threading.Thread(target=close_when_done, daemon=True)
        closer.start()
        try:
            consumer.run(
                ["orders"],
                count,
                sink=DynamoDBTransactions(),
                on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=2, backoff=0.0)),
            )
        finally:
            done.set()
            closer.join()
    assert sorted(handled) == [0, 1, 2, 4, 5, 6, 7]
    total = dynamodb.get_item(TableName="totals", Key={"pk": {"S": "all"}})["Item"]["n"]["N"]
    assert total == "7"
    shard = mocked.list_shards(StreamName="orders-dlq")["Shards"][0]["ShardId"]
    iterator = mocked.get_shard_iterator(
        StreamName="orders-dlq", ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    letters = mocked.get_records(ShardIterator=iterator)["Records"]
    assert len(letters) == 1
    assert "three is refused" in json.dumps(json.loads(letters[0]["Data"]))


@pytest.mark.parametrize("face", ["blocking", "async"])
def test_producer_writes_to_a_mocked_stream(mocked: Any, face: str) -> None:
    async def produce() -> None:
        async with AsyncProducer(region=REGION) as producer:
            for value in range(5):
                await producer.put("orders", str(value).encode(), partition_key=str(value))

    if face == "async":
        asyncio.run(produce())
    else:
        with Producer(region=REGION) as producer:
            for value in range(5):
                producer.put("orders", str(value).encode(), partition_key=str(value))
    values: list[int] = []
    for shard in mocked.list_shards(StreamName="orders")["Shards"]:
        iterator = mocked.get_shard_iterator(
            StreamName="orders", ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        values += [int(r["Data"]) for r in mocked.get_records(ShardIterator=iterator)["Records"]]
    assert sorted(values) == list(range(5))


def test_enhanced_fan_out_under_an_in_process_mock_says_what_to_use(mocked: Any) -> None:
    pytest.importorskip("httpx")
    settings = config(enhanced_fan_out=True, consumer_name="mocked-efo")
    create_state_table(settings)
    consumer = Kinesumer(settings)
    try:
        with pytest.raises(InProcessMockUnsupportedError, match="enhanced_fan_out=False"):
            consumer.subscribe(["orders"])
            consumer.poll(timeout=1.0)
    finally:
        consumer.close()


def test_without_moto_nothing_is_adapted_and_moto_is_not_imported() -> None:
    program = (
        "import sys\n"
        "from kinesumer.aws.clients import botocore_session\n"
        "botocore_session()\n"
        "assert 'moto' not in sys.modules, 'moto imported'\n"
        "assert 'kinesumer.aws.moto_adapter' not in sys.modules, 'adapter imported'\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)


def test_async_run_with_a_sink_and_a_discard_policy(mocked: Any) -> None:
    settings = config()
    create_state_table(settings)
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName="seen",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    put(mocked, "orders", list(range(5)))
    handled: list[int] = []

    async def note(record: Any, tx: DynamoDBTransaction) -> None:
        if record.data == b"2":
            raise ValueError("two is dropped")
        handled.append(int(record.data))
        tx.put("seen", {"pk": record.data.decode()})

    async def consume() -> dict[str, int]:
        async with AsyncKinesumer(settings) as consumer:
            running = asyncio.create_task(
                consumer.run(
                    ["orders"],
                    note,
                    sink=DynamoDBTransactions(),
                    on_failure=Discard(retry=Retry(attempts=1)),
                    name="note",
                )
            )
            for _ in range(300):
                counts = consumer.stats().handled.get("note", {})
                if counts.get("ok", 0) + counts.get("discarded", 0) >= 5:
                    break
                await asyncio.sleep(0.1)
            await consumer.aclose()
            await running
            return dict(consumer.stats().handled.get("note", {}))

    counts = asyncio.run(consume())
    assert sorted(handled) == [0, 1, 3, 4]
    assert counts.get("ok") == 4 and counts.get("discarded") == 1
    items = boto3.client("dynamodb", region_name=REGION).scan(TableName="seen")["Items"]
    assert sorted(item["pk"]["S"] for item in items) == ["0", "1", "3", "4"]
