"""A dead-letter stream that does not exist is ``run()``'s ConfigError at the join, before a
record is read: not a write that fails (after its retries) when the first record fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, make_config, setup_table
from support.standins import NodeStandIn

from kinesumer import AsyncKinesumer, Kinesumer
from kinesumer.errors import AccessDeniedError, ConfigError
from kinesumer.group.member import check_written_streams
from kinesumer.handlers.policies import DeadLetter, Retry, RetryLater


@pytest.fixture
def group(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> dict[str, Any]:
    stream = unique_name("orders")
    create_stream(kinesalite.url, stream, 1)
    config = make_config(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"),
        initial_position="LATEST",
    )  # fmt: skip
    setup_table(config)
    return {"config": config, "stream": stream, "url": kinesalite.url, "missing": unique_name("dl")}


def failing(record: Any) -> None:
    raise AssertionError("no record may reach the handler: the run must not start")


def test_run_refuses_a_missing_dead_letter_stream_before_reading(group: dict[str, Any]) -> None:
    with Kinesumer(group["config"]) as consumer, pytest.raises(ConfigError) as refused:
        consumer.run(
            [group["stream"]],
            failing,
            on_failure=DeadLetter(group["missing"], retry=Retry(attempts=5)),
        )
    message = str(refused.value)
    assert message.startswith("run(on_failure): failed records are written to stream"), message
    assert repr(group["missing"]) in message and "does not exist" in message


def test_run_refuses_a_missing_dead_letter_behind_retry_later(
    group: dict[str, Any], unique_name: Callable[[str], str]
) -> None:
    retry_stream = unique_name("retry")
    create_stream(group["url"], retry_stream, 1)
    policy = RetryLater(retry_stream, delay=1.0, then=DeadLetter(group["missing"]))
    with Kinesumer(group["config"]) as consumer, pytest.raises(ConfigError) as refused:
        consumer.run([group["stream"]], failing, on_failure=policy)
    assert repr(group["missing"]) in str(refused.value)


def test_an_added_handlers_missing_dead_letter_stream_is_refused_by_run(
    group: dict[str, Any],
) -> None:
    with Kinesumer(group["config"]) as consumer:
        consumer.add_handler("audit", failing, on_failure=DeadLetter(group["missing"]))
        with pytest.raises(ConfigError) as refused:
            consumer.run([group["stream"]], failing)
    assert repr(group["missing"]) in str(refused.value)


async def test_the_async_face_refuses_it_too(group: dict[str, Any]) -> None:
    async def handler(record: Any) -> None:
        raise AssertionError("no record may reach the handler")

    async with AsyncKinesumer(group["config"]) as consumer:
        with pytest.raises(ConfigError) as refused:
            await consumer.run([group["stream"]], handler, on_failure=DeadLetter(group["missing"]))
    assert repr(group["missing"]) in str(refused.value)


class DeniedDescribe:
    """A reader whose principal may write to the dead-letter stream but not describe it."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    async def check_stream(self, stream: str) -> None:
        self.checked.append(stream)
        raise AccessDeniedError(f"AWS denied kinesis:DescribeStreamSummary on stream {stream!r}")


async def test_a_dead_letter_stream_that_may_not_be_described_is_not_refused() -> None:
    """A policy of an earlier release grants PutRecord alone on dead-letter streams: the run
    starts (the write tells whether the stream is there), it is not refused at the join."""
    reader = DeniedDescribe()
    await check_written_streams(reader, ("orders-dlq",))  # type: ignore[arg-type]
    assert reader.checked == ["orders-dlq"]
