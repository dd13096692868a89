"""kinesumer.testing's in-memory handler driver: records built with ``record``/``aggregate``,
the same policies, decoding and dead letters as ``run()`` on a clock the test moves, and the
driver checked against the real ``run()`` on moto with the same records."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from support.group import create_stream, kinesis, make_config, setup_table

from kinesumer import Kinesumer, Record
from kinesumer.handlers import Batch, DeadLetter, Message, Retry, RetryLater, Stop
from kinesumer.handlers.deadletter import read_envelope
from kinesumer.sinks import DynamoDBTransaction, DynamoDBTransactions
from kinesumer.testing import HandlerDriver, aggregate, record


@dataclass
class Order:
    id: int
    amount: int


def test_aggregate_gives_the_user_records_as_the_reader_unpacks_them() -> None:
    records = aggregate([("a", b"one"), ("b", "two"), {"three": 3}])
    assert [r.data for r in records] == [b"one", b"two", b'{"three": 3}']
    assert [r.partition_key for r in records] == ["a", "b", "key-2"]
    assert [r.sub_sequence_number for r in records] == [0, 1, 2]
    assert len({r.sequence_number for r in records}) == 1
    later = record(b"x")
    assert int(later.sequence_number) > int(records[0].sequence_number)


def test_typed_decoding_and_a_dead_letter_for_what_does_not_decode() -> None:
    got: list[Order] = []
    driver = HandlerDriver(
        lambda message: got.append(message.value),
        decode=Order,
        on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=1)),
    )
    driver.deliver([record({"id": 1, "amount": 5}), record(b"not json"), record({"id": 2})])
    assert got == [Order(1, 5)]
    letters = driver.dead_letters("orders-dlq")
    assert [letter.data for letter in letters] == [b"not json", b'{"id": 2}']
    assert {letter.error_type for letter in letters} == {"kinesumer.errors.DecodeError"}
    assert driver.counts["ok"] == 1


def test_retries_back_off_on_the_virtual_clock_not_the_wall() -> None:
    failures = iter([ValueError("1"), ValueError("2")])

    def flaky(rec: Any) -> None:
        error = next(failures, None)
        if error is not None:
            raise error

    driver = HandlerDriver(
        flaky, on_failure=Stop(retry=Retry(attempts=3, backoff=100.0, max_backoff=1000.0))
    )
    began, wall = driver.clock.now, time.monotonic()
    driver.deliver([record(b"x")])
    assert driver.counts == {"ok": 1, "retried": 2}
    assert driver.clock.now - began >= 75.0 + 150.0  # jitter at 0.5: 3/4 of each ceiling
    assert time.monotonic() - wall < 30  # nothing slept a virtual second


def test_stop_raises_the_handlers_exception_as_run_does() -> None:
    def refuse(rec: Any) -> None:
        raise KeyError("refused")

    driver = HandlerDriver(refuse, on_failure=Stop(retry=Retry(attempts=2, backoff=0.0)))
    with pytest.raises(KeyError, match="refused"):
        driver.deliver([record(b"x"), record(b"y")])
    assert driver.counts == {"retried": 1, "failed": 1}


def test_retry_later_comes_back_when_the_test_moves_the_clock() -> None:
    calls: list[bytes] = []

    def once_late(rec: Any) -> None:
        calls.append(rec.data)
        if len(calls) == 1:
            raise TimeoutError("downstream busy")

    policy = RetryLater(
        "orders-retry", delay=60.0, then=DeadLetter("orders-dlq"), retry=Retry(attempts=1)
    )
    driver = HandlerDriver(once_late, on_failure=policy)
    driver.deliver([record(b"late")])
    assert calls == [b"late"] and len(driver.written("orders-retry")) == 1
    driver.advance(30.0)
    assert calls == [b"late"]  # not due yet
    driver.advance(31.0)
    assert calls == [b"late", b"late"]
    assert driver.counts["ok"] == 1
    assert driver.dead_letters("orders-dlq") == []


def test_an_async_batch_handler_with_a_sink_keeps_each_transaction() -> None:
    async def total(messages: list[Message[Order]], tx: DynamoDBTransaction) -> None:
        amount = sum(m.value.amount for m in messages)
        tx.update("totals", {"pk": "all"}, "ADD n :n", values={":n": amount})

    driver = HandlerDriver(
        total, batch=Batch(max_size=2), decode=Order, sink=DynamoDBTransactions()
    )
    records = [record({"id": i, "amount": i}) for i in range(1, 4)]
    asyncio.run(driver.deliver_async(records))
    assert driver.sink is not None
    assert [end.sequence_number for end, _ in driver.sink.commits] == [
        records[1].sequence_number,
        records[2].sequence_number,
    ]
    amounts = [w[0]["Update"]["ExpressionAttributeValues"][":n"] for _, w in driver.sink.commits]
    assert amounts == [{"N": "3"}, {"N": "3"}]


# ---- the driver against the real run() on the same records -------------------------------

VALUES = [b'{"id": 1, "amount": 1}', b"garbage", b'{"id": 3, "amount": 3}', b'{"id": 4}']
VALUES += [b'{"id": 5, "amount": 5}', b'{"id": 6, "amount": 6}']


def handler_of(seen: list[Order]) -> Callable[[Message[Order]], None]:
    def handle(message: Message[Order]) -> None:
        if message.value.id == 3:
            raise ValueError("order 3 is refused")
        seen.append(message.value)

    return handle


def letters_of(envelopes: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (e.data, e.error_type, e.error_message, e.attempts, e.round, e.handler, e.partition_key)
        for e in envelopes
    ]


def read_stream(client: Any, stream: str) -> list[Record]:
    """Every record of a one-shard ``stream``, as kinesumer's records."""
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    return [
        record(
            r["Data"],
            stream=stream,
            shard_id=shard,
            partition_key=r["PartitionKey"],
            sequence_number=r["SequenceNumber"],
        )
        for r in client.get_records(ShardIterator=iterator)["Records"]
    ]


def test_the_driver_delivers_and_dead_letters_as_run_does(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    stream, dlq = unique_name("orders"), unique_name("dlq")
    create_stream(moto_url, stream, 1)
    create_stream(moto_url, dlq, 1)
    config = make_config(moto_url, moto_url, unique_name("app"), unique_name("state"))
    setup_table(config)
    client = kinesis(moto_url)
    for index, data in enumerate(VALUES):
        client.put_record(StreamName=stream, Data=data, PartitionKey=f"k{index}")
    policy = DeadLetter(dlq, retry=Retry(attempts=2, backoff=0.0))

    by_run: list[Order] = []
    with Kinesumer(config) as consumer:

        def close_when_done() -> None:
            while not stop.wait(0.1):
                handled = consumer.stats().handled.get("orders", {})
                if handled.get("ok", 0) + handled.get("dead_lettered", 0) >= len(VALUES):
                    break
            consumer.close()

        stop = threading.Event()
        closer = threading.Thread(target=close_when_done, daemon=True)
        closer.start()
        try:
            consumer.run(
                [stream], handler_of(by_run), decode=Order, on_failure=policy, name="orders"
            )
        finally:
            stop.set()
            closer.join()
    run_letters = [read_envelope(r.data) for r in read_stream(client, dlq)]
    # The driver gets the very records run() read: same shard, sequence numbers and keys.
    source = read_stream(client, stream)

    by_driver: list[Order] = []
    driver = HandlerDriver(handler_of(by_driver), decode=Order, on_failure=policy, name="orders")
    driver.deliver(source)
    assert by_driver == by_run == [Order(1, 1), Order(5, 5), Order(6, 6)]
    assert letters_of(driver.dead_letters(dlq)) == letters_of(run_letters)
    assert len(run_letters) == 3
