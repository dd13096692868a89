"""Producing to Kinesis streams given by ARN, of other accounts and regions (issue 36), on moto in
server mode (streams kept per account and region; an assumed role's credentials act in the
role's account): ``Producer.put`` by ARN lands in the ARN's account and region, read back with
boto3 there; a dead letter written to a stream ARN of another account lands there too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.accounts import A, B, arn, create, datas, role_in_b, three_places
from support.group import make_config, setup_table
from support.wait import eventually

from kinesumer import (
    AccountAccess,
    AccountAccessError,
    AsyncKinesumer,
    AsyncProducer,
    FlushError,
    Producer,
    ReadOnlyStreamError,
)
from kinesumer.handlers.deadletter import read_envelope
from kinesumer.handlers.policies import DeadLetter, Retry

Names = Callable[[str], str]

ROLE_B = role_in_b("orders-writer")


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    name = unique_name("orders")
    clients = three_places(moto_url, name, ROLE_B)
    return {"url": moto_url, "name": name, "clients": clients}


def producer_of(url: str, **options: Any) -> Producer:
    return Producer(
        region="us-east-1",
        kinesis_endpoint=url,
        sts_endpoint=url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
        linger=0.0,
        **options,
    )


def test_put_by_arn_lands_in_the_arns_account_and_region(env: dict[str, Any]) -> None:
    name, clients = env["name"], env["clients"]
    with producer_of(env["url"]) as producer:
        futures = [
            producer.put(name, b"a-us by name", partition_key="k"),
            producer.put(arn("us-east-1", A, name), b"a-us by arn", partition_key="k"),
            producer.put(arn("eu-west-1", A, name), b"a-eu", partition_key="k"),
            producer.put(arn("us-east-1", B, name), b"b-us", partition_key="k"),
        ]
        producer.flush()
    assert all(f.result().shard_id for f in futures)
    assert datas(clients["a-us"], name) == [b"a-us by name", b"a-us by arn"]
    assert datas(clients["a-eu"], name) == [b"a-eu"]
    assert datas(clients["b-us"], name) == [b"b-us"]


def test_the_async_producer_puts_by_arn_into_another_account(env: dict[str, Any]) -> None:
    name = env["name"]

    async def main() -> None:
        async with AsyncProducer(
            region="us-east-1",
            kinesis_endpoint=env["url"],
            sts_endpoint=env["url"],
            accounts={B: AccountAccess(role_arn=ROLE_B)},
            linger=0.0,
        ) as producer:
            future = await producer.put(arn("us-east-1", B, name), b"async b", partition_key="k")
            await producer.flush()
            assert (await future).shard_id

    asyncio.run(main())
    assert datas(env["clients"]["b-us"], name) == [b"async b"]
    assert datas(env["clients"]["a-us"], name) == []


def test_a_dynamodb_stream_arn_is_refused_at_put(env: dict[str, Any]) -> None:
    table_stream = f"arn:aws:dynamodb:us-east-1:{A}:table/orders/stream/2026-01-01T00:00:00.000"
    with producer_of(env["url"]) as producer, pytest.raises(ReadOnlyStreamError) as err:
        producer.put(table_stream, b"x", partition_key="k")
    assert err.value.stream == table_stream and "its table" in str(err.value)


def test_a_stream_of_an_account_with_no_access_fails_its_records_naming_the_account(
    env: dict[str, Any],
) -> None:
    stranger = "222222222222"
    with producer_of(env["url"]) as producer:
        future = producer.put(arn("us-east-1", stranger, env["name"]), b"x", partition_key="k")
        with pytest.raises(FlushError):
            producer.flush()
        error = future.exception()
    assert isinstance(error, AccountAccessError) and error.account == stranger


def test_a_dead_letter_stream_given_by_arn_is_written_in_its_account(
    env: dict[str, Any], unique_name: Names
) -> None:
    url, name = env["url"], env["name"]
    dlq = unique_name("dlq")
    create(env["clients"]["b-us"], dlq)
    config = make_config(
        url,
        url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
    )
    setup_table(config)
    for n in range(4):
        env["clients"]["a-us"].put_record(StreamName=name, Data=str(n).encode(), PartitionKey="k")

    async def handle(record: Any) -> None:
        if record.data == b"2":
            raise RuntimeError("two")

    async def main() -> None:
        async with AsyncKinesumer(config) as consumer:
            policy = DeadLetter(arn("us-east-1", B, dlq), retry=Retry(attempts=1))
            running = asyncio.create_task(consumer.run([name], handle, on_failure=policy, name="h"))

            def dead() -> int:
                return int(consumer.stats().handled.get("h", {}).get("dead_lettered", 0))

            await eventually(lambda: dead() == 1, 30, "one dead letter")
            await consumer.aclose()
            await running

    asyncio.run(main())
    envelopes = [read_envelope(d) for d in datas(env["clients"]["b-us"], dlq)]
    assert [(e.original_record().data, e.stream) for e in envelopes] == [(b"2", name)]
