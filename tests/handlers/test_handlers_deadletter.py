"""Dead-letter and retry-later writes against a real Kinesis stand-in (kinesalite), through the
library's client factory: every envelope field read back, a transient error retried, a write that
keeps failing stopping the run with a named error, retry-later re-delivery after its delay."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.examples import run_example
from support.faultproxy import Fault
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.handlers import read_stream
from support.invocation import Counters, Failing, Options, lease, record
from support.wait import wait_until

from kinesumer.aws import ClientFactory
from kinesumer.handlers.deadletter import DeadLetterWriteError, read_envelope
from kinesumer.handlers.invoke import CallEnvironment, Invocation
from kinesumer.handlers.policies import DeadLetter, HandlerFailedError, Retry, RetryLater
from kinesumer.models import Record

NO_RETRY = Retry(attempts=1)


@pytest.fixture
def setup(kinesalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    """A dead-letter and a retry stream on kinesalite, and a config reaching it at ``endpoint``
    (kinesalite itself unless a test passes a fault proxy's URL)."""
    dlq, retries = unique_name("dlq"), unique_name("retry")
    create_stream(kinesalite.url, dlq, 1)
    create_stream(kinesalite.url, retries, 1)

    def invocation(
        policy: Any, handler: Any = None, endpoint: str | None = None, is_async: bool = False
    ) -> tuple[Invocation, Counters]:
        config = make_config(endpoint or kinesalite.url, "http://127.0.0.1:1", "shop", "state")
        counters = Counters()
        made = Invocation(
            handler or Failing(),
            Options(on_failure=policy),
            ClientFactory(config.replace(client_id="member-9")),
            counters,
            is_async,
            environment=CallEnvironment(write_attempts=3),
        )
        return made, counters

    return {"url": kinesalite.url, "dlq": dlq, "retries": retries, "invocation": invocation}


def test_dead_letter_envelope_read_back_field_by_field(setup: dict[str, Any]) -> None:
    call, counters = setup["invocation"](DeadLetter(setup["dlq"], retry=Retry(2, backoff=0.0)))
    before = int(time.time() * 1000)
    original = record(b"\x00\xffpayload", key="customer-42")
    call.call_sync([original], lease(), threading.Event())
    assert counters.counts == {"retried": 1, "dead_lettered": 1}
    [written] = read_stream(setup["url"], setup["dlq"])
    assert written.partition_key == "customer-42"  # the original key: per-key order kept
    envelope = read_envelope(written.data)
    assert envelope.kinesumer_envelope == 1 and envelope.kind == "dead_letter"
    assert (envelope.stream, envelope.shard_id) == ("orders", "shardId-000000000001")
    assert (envelope.sequence_number, envelope.sub_sequence_number) == ("100", 0)
    assert envelope.partition_key == "customer-42"
    assert envelope.data == b"\x00\xffpayload" and envelope.data_bytes == 9
    assert not envelope.data_truncated
    assert envelope.approximate_arrival_timestamp == 1767323045678  # 2026-01-02T03:04:05.678Z
    assert envelope.handler == "orders.handle"
    assert envelope.error_type == "builtins.RuntimeError" and envelope.error_message == "boom 2"
    assert (envelope.attempts, envelope.round) == (2, 0)
    assert before <= envelope.failed_at <= int(time.time() * 1000)
    assert (envelope.app, envelope.client_id) == ("shop", "member-9")
    assert envelope.original_record() == original


def test_a_transient_error_writing_a_dead_letter_is_retried(
    setup: dict[str, Any], fault_proxy: Callable[[str], Any]
) -> None:
    proxy = fault_proxy(setup["url"])
    rule = proxy.add_rule(Fault.throttle(), service="kinesis", operation="PutRecord", count=2)
    call, counters = setup["invocation"](
        DeadLetter(setup["dlq"], retry=NO_RETRY), endpoint=proxy.url
    )
    call.call_sync([record()], lease(), threading.Event())
    assert rule.fired == 2 and counters.counts == {"dead_lettered": 1}
    assert len(read_stream(setup["url"], setup["dlq"])) == 1


def test_a_dead_letter_write_that_keeps_failing_stops_the_run(
    setup: dict[str, Any], fault_proxy: Callable[[str], Any]
) -> None:
    proxy = fault_proxy(setup["url"])
    rule = proxy.add_rule(Fault.http_503(), service="kinesis", operation="PutRecord")
    call, counters = setup["invocation"](
        DeadLetter(setup["dlq"], retry=NO_RETRY), endpoint=proxy.url
    )
    with pytest.raises(HandlerFailedError) as caught:
        call.call_sync([record()], lease(), threading.Event())
    assert isinstance(caught.value.error, DeadLetterWriteError)
    assert setup["dlq"] in str(caught.value.error)
    assert rule.fired == 3  # write_attempts: one policy of retries, botocore's own are off
    assert counters.counts == {"failed": 1} and read_stream(setup["url"], setup["dlq"]) == []


def test_the_async_face_writes_the_same_envelope(setup: dict[str, Any]) -> None:
    async def handler(argument: Record) -> None:
        raise ValueError("async boom")

    call, counters = setup["invocation"](
        DeadLetter(setup["dlq"], retry=NO_RETRY), handler, is_async=True
    )

    async def main() -> None:
        try:
            await call.call_async([record()], lease(), asyncio.Event())
        finally:
            await call.close_async()

    asyncio.run(main())
    [written] = read_stream(setup["url"], setup["dlq"])
    envelope = read_envelope(written.data)
    assert envelope.error_type == "builtins.ValueError" and envelope.original_record() == record()
    assert counters.counts == {"dead_lettered": 1}


def test_retry_later_redelivers_after_the_delay_then_succeeds(setup: dict[str, Any]) -> None:
    handled_at: list[float] = []

    def handler(argument: Record) -> None:
        handled_at.append(time.time())
        if len(handled_at) == 1:
            raise RuntimeError("not yet")

    policy = RetryLater(setup["retries"], delay=0.3, retry=NO_RETRY)
    call, counters = setup["invocation"](policy, handler)
    call.call_sync([record()], lease(), threading.Event())
    [again] = read_stream(setup["url"], setup["retries"])
    envelope = read_envelope(again.data)
    assert envelope.kind == "retry_later" and envelope.round == 1
    call.call_sync([again], lease(), threading.Event())
    assert handled_at[1] >= envelope.failed_at / 1000 + 0.3  # not before it was due
    assert counters.counts == {"retry_later": 1, "ok": 1}


def test_retry_later_dead_letters_after_its_rounds(setup: dict[str, Any]) -> None:
    handler = Failing()
    policy = RetryLater(
        setup["retries"], delay=0.0, rounds=1, then=DeadLetter(setup["dlq"]), retry=NO_RETRY
    )
    call, counters = setup["invocation"](policy, handler)
    call.call_sync([record()], lease(), threading.Event())
    [again] = read_stream(setup["url"], setup["retries"])
    call.call_sync([again], lease(), threading.Event())
    assert handler.calls == [record(), record()]
    [dead] = read_stream(setup["url"], setup["dlq"])
    envelope = read_envelope(dead.data)
    assert (envelope.kind, envelope.round, envelope.error_message) == ("dead_letter", 1, "boom 2")
    assert envelope.original_record() == record()
    assert counters.counts == {"retry_later": 1, "dead_lettered": 1}


def test_the_dead_letter_example_handles_orders_and_dead_letters_the_bad_ones(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    """examples/handler_dead_letter.py as a user runs it, on kinesalite and dynalite."""
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("orders")
    setup_table(make_config(kinesalite.url, dynalite.url, app, table))
    create_stream(kinesalite.url, stream, 2)
    create_stream(kinesalite.url, f"{stream}-dlq", 1)
    orders = [json.dumps({"id": i, "amount": -1 if i == 3 else 10 * i}).encode() for i in range(6)]
    for i, data in enumerate([*orders, b"not an order"]):
        kinesis(kinesalite.url).put_record(StreamName=stream, Data=data, PartitionKey=f"c{i}")
    environ = {
        **os.environ,
        "AWS_ENDPOINT_URL_KINESIS": kinesalite.url,
        "AWS_ENDPOINT_URL_DYNAMODB": dynalite.url,
        "KINESUMER_APP": app,
        "KINESUMER_TABLE": table,
        "KINESUMER_STREAMS": stream,
        "KINESUMER_INITIAL_POSITION": "TRIM_HORIZON",
    }
    proc = run_example("handler_dead_letter.py", environ, "7")
    assert "done: 5 handled, 2 dead-lettered, 2 retries" in proc.output, proc.output
    envelopes = [read_envelope(r.data) for r in read_stream(kinesalite.url, f"{stream}-dlq")]
    failures = sorted((e.partition_key, e.error_type, e.attempts) for e in envelopes)
    assert failures == [
        ("c3", "builtins.ValueError", 3),
        ("c6", "kinesumer.errors.DecodeError", 1),
    ]
    assert {e.handler for e in envelopes} == {"orders"}


def test_run_retries_later_through_its_own_stream_then_dead_letters(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    """Kinesumer.run end to end: the retry stream is consumed by the run itself; record 5
    succeeds on its first round back, record 7 fails every round and ends in the dead letters."""
    from support.handlers import Run

    from kinesumer import Kinesumer

    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream, retries, dlq = unique_name("orders"), unique_name("retry"), unique_name("dlq")
    create_stream(kinesalite.url, stream, 2)
    create_stream(kinesalite.url, retries, 1)
    create_stream(kinesalite.url, dlq, 1)
    put(kinesalite.url, stream, 0, 20, key=lambda i: f"k{i % 6}")
    calls: dict[int, int] = {}
    handled: set[int] = set()
    lock = threading.Lock()

    def handle(record: Record) -> None:
        number = int(record.data)
        assert record.stream == stream  # the original, never the envelope
        with lock:
            calls[number] = calls.get(number, 0) + 1
            if number == 7 or (number == 5 and calls[number] <= 2):
                raise RuntimeError(f"cannot handle {number} yet")
            handled.add(number)

    policy = RetryLater(
        retries, delay=0.2, rounds=2, then=DeadLetter(dlq), retry=Retry(attempts=2, backoff=0.0)
    )
    consumer = Kinesumer(config)
    run = Run(
        consumer, [stream], handle, concurrency=4, ordering="key", on_failure=policy, name="handle"
    )
    wait_until(
        lambda: len(handled) == 19 and len(read_stream(kinesalite.url, dlq)) == 1,
        30,
        "every record handled but 7, and 7 dead-lettered",
    )
    counts = consumer.stats().handled["handle"]
    run.stop()
    assert handled == set(range(20)) - {7}
    assert calls[5] == 3 and calls[7] == 6  # 2 attempts a round: first, then 2 retry rounds
    [dead] = read_stream(kinesalite.url, dlq)
    envelope = read_envelope(dead.data)
    assert (envelope.kind, envelope.round, envelope.attempts) == ("dead_letter", 2, 2)
    assert envelope.original_record().data == b"7" and envelope.stream == stream
    assert len(read_stream(kinesalite.url, retries)) == 3  # 5 once, 7 twice
    assert counts["ok"] == 19 and counts["retry_later"] == 3 and counts["dead_lettered"] == 1


def test_async_run_dead_letters_what_keeps_failing(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    """AsyncKinesumer.run end to end with DeadLetter and decode="json": a coroutine handler
    failing on one record, and a payload that is not JSON; both land in the dead letters."""
    from support.wait import eventually

    from kinesumer import AsyncKinesumer

    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream, dlq = unique_name("orders"), unique_name("dlq")
    create_stream(kinesalite.url, stream, 2)
    create_stream(kinesalite.url, dlq, 1)
    put(kinesalite.url, stream, 0, 10)
    kinesis(kinesalite.url).put_record(StreamName=stream, Data=b"{", PartitionKey="bad")
    handled: list[int] = []

    async def handle(message: Any) -> None:
        if message.value == 4:
            raise RuntimeError("four")
        handled.append(message.value)

    async def main() -> dict[str, int]:
        async with AsyncKinesumer(config) as consumer:
            policy = DeadLetter(dlq, retry=Retry(attempts=2, backoff=0.0))
            running = asyncio.create_task(
                consumer.run(
                    [stream], handle, concurrency=4, decode="json", on_failure=policy, name="h"
                )
            )

            def counts() -> dict[str, int]:
                return consumer.stats().handled.get("h", {})

            await eventually(lambda: counts().get("dead_lettered") == 2, 30, "two dead letters")
            await consumer.aclose()
            await running
            return counts()

    counts = asyncio.run(main())
    assert sorted(handled) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    envelopes = sorted(
        (read_envelope(r.data) for r in read_stream(kinesalite.url, dlq)),
        key=lambda e: e.partition_key,
    )
    assert [(e.partition_key, e.error_type, e.attempts) for e in envelopes] == [
        ("4", "builtins.RuntimeError", 2),
        ("bad", "kinesumer.errors.DecodeError", 1),
    ]
    assert counts == {"ok": 9, "retried": 1, "decode_error": 1, "dead_lettered": 2}
