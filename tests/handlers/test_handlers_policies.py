"""Failure policies, typed payloads and the invocation's decisions, unit-level: a fake handler and
a fake Kinesis client (through the ClientFactory seam); real writes are in
test_handlers_deadletter.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, TypedDict

import msgspec
import pydantic
import pytest
from botocore.exceptions import ClientError
from support.invocation import (
    FAST,
    Failing,
    FakeKinesis,
    FakeSink,
    LeaseLost,
    invocation,
    lease,
    read_back,
    record,
)

from kinesumer.errors import ConfigError, DecodeError
from kinesumer.handlers.deadletter import (
    MAX_RECORD_BYTES,
    DeadLetterWriteError,
    encode,
    make_envelope,
    read_envelope,
)
from kinesumer.handlers.decode import Message, make_decoder
from kinesumer.handlers.policies import (
    AbandonedError,
    Block,
    DeadLetter,
    Discard,
    HandlerFailedError,
    Retry,
    RetryLater,
    backoff_delay,
)
from kinesumer.models import Record

# ---- the policies' arguments and pure decisions ----------------------------------------------


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Retry(attempts=0), "Retry.attempts"),
        (lambda: Retry(attempts=True), "Retry.attempts"),
        (lambda: Retry(backoff=-1), "Retry.backoff"),
        (lambda: Retry(backoff=2.0, max_backoff=1.0), "Retry.max_backoff"),
        (lambda: DeadLetter("no spaces allowed"), "DeadLetter.stream"),
        (lambda: RetryLater("retries", rounds=0), "RetryLater.rounds"),
        (lambda: RetryLater("retries", delay=float("nan")), "RetryLater.delay"),
        (lambda: RetryLater("retries", then=Block()), "RetryLater.then"),
        (lambda: RetryLater("retries", then=DeadLetter("retries")), "RetryLater.then"),
        (lambda: Discard(retry=3), "Discard.retry"),
        (lambda: make_decoder("xml"), "decode"),
        (lambda: make_decoder(42), "decode"),
    ],
)
def test_bad_arguments_name_the_field(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert caught.value.field == field


def test_backoff_grows_exponentially_to_its_cap_and_jitters_in_the_upper_half() -> None:
    steady = Retry(backoff=0.1, max_backoff=0.5, jitter=False)
    assert [backoff_delay(steady, n) for n in (1, 2, 3, 4, 100)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.5, 0.5]
    )
    jittered = Retry(backoff=0.1, max_backoff=0.5)
    assert backoff_delay(jittered, 3, lambda: 0.0) == pytest.approx(0.2)
    assert backoff_delay(jittered, 3, lambda: 0.999) == pytest.approx(0.4, rel=0.01)


# ---- each policy ------------------------------------------------------------------------------


def test_stop_raises_after_one_attempt_with_the_original_error() -> None:
    handler = Failing()
    call, counters = invocation(handler)
    with pytest.raises(HandlerFailedError) as caught:
        call.call_sync([record()], lease(), threading.Event())
    assert len(handler.calls) == 1
    assert isinstance(caught.value.error, RuntimeError) and str(caught.value.error) == "boom 1"
    assert caught.value.record == record() and caught.value.handler == "orders.handle"
    assert counters.counts == {"failed": 1}


def test_retry_counts_extra_attempts_and_the_success() -> None:
    handler = Failing(failures=2)
    call, counters = invocation(handler, on_failure=Discard(retry=FAST))
    call.call_sync([record()], lease(), threading.Event())
    assert len(handler.calls) == 3
    assert counters.counts == {"retried": 2, "ok": 1}


def test_block_retries_until_success() -> None:
    handler = Failing(failures=7)
    call, counters = invocation(handler, on_failure=Block(retry=FAST))
    call.call_sync([record()], lease(), threading.Event())
    assert counters.counts == {"retried": 7, "ok": 1}


def test_block_abandons_when_the_run_is_closing() -> None:
    stopping = threading.Event()

    def handler(argument: Record) -> None:
        if len(calls) == 9:
            stopping.set()  # close() from another thread, while the record is blocking
        calls.append(argument)
        raise RuntimeError("down")

    calls: list[Record] = []
    call, counters = invocation(
        handler, on_failure=Block(retry=Retry(backoff=0.001, max_backoff=0.002))
    )
    with pytest.raises(AbandonedError):
        call.call_sync([record()], lease(), stopping)
    assert len(calls) == 10 and "ok" not in counters.counts


def test_discard_counts_and_logs_a_warning_naming_record_and_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call, counters = invocation(Failing(), on_failure=Discard(retry=FAST))
    with caplog.at_level(logging.WARNING, logger="kinesumer.handlers"):
        call.call_sync([record()], lease(), threading.Event())
    assert counters.counts == {"retried": 2, "discarded": 1}
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("orders.handle" in m and "orders/shardId-000000000001/100" in m for m in warning)


def test_dead_letter_writes_the_envelope_with_the_original_key() -> None:
    client = FakeKinesis()
    call, counters = invocation(Failing(), client, on_failure=DeadLetter("dlq", retry=FAST))
    call.call_sync([record(key="customer-7")], lease(), threading.Event())
    assert counters.counts == {"retried": 2, "dead_lettered": 1}
    [put] = client.puts
    assert put["StreamName"] == "dlq" and put["PartitionKey"] == "customer-7"
    envelope = read_envelope(put["Data"])
    assert envelope.kind == "dead_letter" and envelope.attempts == 3 and envelope.round == 0
    assert envelope.error_type == "builtins.RuntimeError" and envelope.error_message == "boom 3"
    assert envelope.original_record() == record(key="customer-7")


def test_a_dead_letter_write_refused_stops_the_run_with_a_named_error() -> None:
    refused = ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "PutRecord")
    call, counters = invocation(
        Failing(), FakeKinesis([refused]), on_failure=DeadLetter("dlq", retry=FAST)
    )
    with pytest.raises(HandlerFailedError) as caught:
        call.call_sync([record()], lease(), threading.Event())
    assert isinstance(caught.value.error, DeadLetterWriteError)
    assert "dlq" in str(caught.value.error) and counters.counts["failed"] == 1


def test_retry_later_redelivers_the_original_and_then_succeeds() -> None:
    client = FakeKinesis()
    handler = Failing(failures=1)
    policy = RetryLater("orders-retry", delay=0.0, retry=Retry(attempts=1))
    call, counters = invocation(handler, client, on_failure=policy)
    assert call.extra_streams == ("orders-retry",)
    call.call_sync([record()], lease(), threading.Event())
    assert counters.counts == {"retry_later": 1}
    envelope = read_envelope(client.puts[0]["Data"])
    assert (envelope.kind, envelope.round, client.puts[0]["PartitionKey"]) == (
        "retry_later",
        1,
        "k1",
    )
    call.call_sync([read_back(client, 0)], lease(), threading.Event())
    assert handler.calls == [record(), record()]  # the original, rebuilt from the envelope
    assert counters.counts == {"retry_later": 1, "ok": 1}


def test_retry_later_applies_then_after_its_rounds() -> None:
    client = FakeKinesis()
    policy = RetryLater(
        "orders-retry", delay=0.0, rounds=2, then=Discard(), retry=Retry(attempts=1)
    )
    call, counters = invocation(Failing(), client, on_failure=policy)
    call.call_sync([record()], lease(), threading.Event())
    call.call_sync([read_back(client, 0)], lease(), threading.Event())
    assert read_envelope(client.puts[1]["Data"]).round == 2
    call.call_sync([read_back(client, 1)], lease(), threading.Event())
    assert len(client.puts) == 2
    assert counters.counts == {"retry_later": 2, "discarded": 1}


def test_retry_later_waits_for_the_due_time_and_abandons_on_close() -> None:
    client = FakeKinesis()
    policy = RetryLater("orders-retry", delay=3600.0, retry=Retry(attempts=1))
    call, _ = invocation(Failing(), client, on_failure=policy)
    call.call_sync([record()], lease(), threading.Event())
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(AbandonedError):
        call.call_sync([read_back(client, 0)], lease(), stopping)


def test_a_foreign_record_on_the_retry_stream_goes_to_then() -> None:
    policy = RetryLater("orders-retry", delay=0.0, then=Discard(), retry=Retry(attempts=1))
    handler = Failing(failures=0)
    call, counters = invocation(handler, on_failure=policy)
    call.call_sync([record(b"not an envelope", stream="orders-retry")], lease(), threading.Event())
    assert handler.calls == [] and counters.counts == {"discarded": 1}


def test_a_payload_that_does_not_decode_skips_the_retry_rounds() -> None:
    client = FakeKinesis()
    policy = RetryLater("orders-retry", then=DeadLetter("dlq"), retry=Retry(attempts=1))
    call, counters = invocation(Failing(), client, on_failure=policy, decode="json")
    call.call_sync([record(b"{")], lease(), threading.Event())
    assert [put["StreamName"] for put in client.puts] == ["dlq"]
    assert counters.counts == {"decode_error": 1, "dead_lettered": 1}


def test_a_record_too_large_for_retry_later_takes_then_at_once() -> None:
    client = FakeKinesis()
    policy = RetryLater("orders-retry", then=DeadLetter("dlq"), retry=Retry(attempts=1))
    call, counters = invocation(Failing(), client, on_failure=policy)
    call.call_sync([record(b"x" * MAX_RECORD_BYTES)], lease(), threading.Event())
    assert counters.counts == {"dead_lettered": 1}
    [put] = client.puts
    envelope = read_envelope(put["Data"])
    assert put["StreamName"] == "dlq" and envelope.data_truncated
    assert envelope.data_bytes == MAX_RECORD_BYTES and envelope.data == b"x" * len(envelope.data)
    assert len(put["Data"]) + len(put["PartitionKey"]) <= MAX_RECORD_BYTES


def test_an_envelope_keeps_a_long_error_message_short() -> None:
    envelope = make_envelope(
        record(),
        RuntimeError("e" * 10_000),
        kind="dead_letter",
        handler="h",
        attempts=1,
        round_number=0,
        failed_at_ms=1,
        app="a",
        client_id="c",
    )
    assert len(envelope.error_message) == 2000 and not envelope.data_truncated
    assert read_envelope(encode(envelope)) == envelope


# ---- typed payloads ---------------------------------------------------------------------------


@dataclasses.dataclass
class OrderClass:
    id: int


class OrderStruct(msgspec.Struct):
    id: int


class OrderDict(TypedDict):
    id: int


class OrderModel(pydantic.BaseModel):
    id: int


@pytest.mark.parametrize(
    ("decode", "expected"),
    [
        ("json", {"id": 1}),
        (OrderClass, OrderClass(1)),
        (OrderStruct, OrderStruct(1)),
        (OrderDict, {"id": 1}),
        (OrderModel, OrderModel(id=1)),
        (lambda data: data.upper(), b'{"ID": 1}'),
    ],
)
def test_the_handler_gets_a_message_of_the_decoded_type(decode: Any, expected: Any) -> None:
    seen: list[Message[Any]] = []
    call, counters = invocation(seen.append, decode=decode)
    call.call_sync([record()], lease(), threading.Event())
    assert seen == [Message(expected, record())] and counters.counts == {"ok": 1}


@pytest.mark.parametrize("decode", ["json", OrderClass, OrderStruct, OrderModel])
def test_a_payload_that_does_not_decode_goes_through_the_policy_unretried(decode: Any) -> None:
    handler = Failing(failures=0)
    call, counters = invocation(handler, decode=decode)
    with pytest.raises(HandlerFailedError) as caught:
        call.call_sync([record(b'{"id": "one"')], lease(), threading.Event())
    error = caught.value.error
    assert isinstance(error, DecodeError) and isinstance(error, ValueError)
    assert "orders/shardId-000000000001/100" in str(error)
    assert handler.calls == [] and counters.counts == {"decode_error": 1, "failed": 1}


def test_one_bad_payload_does_not_sink_its_batch() -> None:
    batches: list[list[Message[Any]]] = []
    call, counters = invocation(
        batches.append, decode=OrderStruct, batch=object(), on_failure=Discard(retry=FAST)
    )
    good = [record(b'{"id": %d}' % i, seq=str(100 + i)) for i in range(3)]
    call.call_sync([good[0], record(b"{", seq="101"), *good[1:]], lease(), threading.Event())
    # The records on either side of the bad one are handled, in two batches: the bad one's
    # policy acts between them (per-key order, see test_handlers_batch_order.py).
    assert [[m.value.id for m in batch] for batch in batches] == [[0], [1, 2]]
    assert counters.counts == {"decode_error": 1, "discarded": 1, "ok": 3}


# ---- sinks and the async face -----------------------------------------------------------------


def test_with_a_sink_handler_errors_take_the_policy_and_the_sink_refusal_passes_through() -> None:
    sink = FakeSink()
    call, counters = invocation(Failing(failures=1), sink=sink, on_failure=Discard(retry=FAST))
    call.call_sync([record()], lease(), threading.Event())
    assert [end for end, _ in sink.commits] == [("100", 0)] and counters.counts["ok"] == 1
    call, counters = invocation(lambda r, tx: tx.append(r), sink=FakeSink(refuse=True))
    with pytest.raises(LeaseLost):
        call.call_sync([record()], lease(), threading.Event())
    assert counters.counts == {}


def test_the_async_face_shares_the_decisions() -> None:
    attempts: list[Record] = []

    async def handler(argument: Record) -> None:
        attempts.append(argument)
        raise RuntimeError("async boom")

    call, counters = invocation(handler, on_failure=Discard(retry=FAST))

    async def main() -> None:
        await call.call_async([record()], lease(), asyncio.Event())
        stopping = asyncio.Event()
        stopping.set()
        blocked, _ = invocation(handler, on_failure=Block(retry=FAST))
        with pytest.raises(AbandonedError):
            await blocked.call_async([record()], lease(), stopping)
        await call.close_async()

    asyncio.run(main())
    assert counters.counts == {"retried": 2, "discarded": 1}
