"""Outages of Kinesis and of DynamoDB while the source runs (planner, executor reads and ledger
on kinesalite + dynalite behind the fault proxy, the stand-in member of :mod:`support.spark_fakes`):
down and back within ``outage_timeout``, the step goes on and nothing is lost; down for good,
:class:`SourceOutageError` names the service and since when.

Every fault is a 503 on every call of the service, held for longer than the library's own
retries (about eight seconds), so only the source's riding out can bridge it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember

from kinesumer.errors import AccessDeniedError, StreamNotFoundError, TransientAWSError
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.outage import SourceOutageError, ride_out

pytest.importorskip("pyarrow")

#: Longer than call_with_retry's six attempts (about 8 s of backoff).
OUTAGE = 11.0


@pytest.fixture
def proxied(kinesalite: Any, dynalite: Any, unique_name: Any) -> Iterator[dict[str, Any]]:
    kinesis, dynamodb = FaultProxy(kinesalite.url), FaultProxy(dynalite.url)
    config = make_config(kinesis.url, dynamodb.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 20)
    try:
        yield {"config": config, "stream": stream, "kinesis": kinesis, "dynamodb": dynamodb}
    finally:
        kinesis.stop()
        dynamodb.stop()


def planner_of(proxied: dict[str, Any], outage_timeout: float) -> Planner:
    options = SourceOptions(
        config=proxied["config"], streams=(proxied["stream"],), outage_timeout=outage_timeout
    )
    planner = Planner(options, SoloMember)  # type: ignore[arg-type]
    planner.initial_offset()
    return planner


def first_batch(planner: Planner) -> dict[str, Any]:
    return planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)


def read(planner: Planner, end: dict[str, Any]) -> list[bytes]:
    from kinesumer.spark.source.executor.read import read_partition

    out: list[bytes] = []
    for partition in planner.partitions(end):
        for batch in read_partition(partition):
            out.extend(bytes(d) for d in batch.column("data").to_pylist())
    return sorted(out)


def down_for(proxy: FaultProxy, service: str, seconds: float) -> threading.Thread:
    rule = proxy.add_rule(Fault.http_503(), service=service)
    timer = threading.Timer(seconds, rule.remove)
    timer.start()
    return timer


@pytest.mark.parametrize("service", ["kinesis", "dynamodb"])
def test_a_read_rides_out_an_outage_and_loses_nothing(
    proxied: dict[str, Any], service: str, caplog: pytest.LogCaptureFixture
) -> None:
    planner = planner_of(proxied, outage_timeout=120)
    try:
        end = first_batch(planner)
        timer = down_for(proxied[service], service, OUTAGE)
        with caplog.at_level("WARNING", logger="kinesumer.spark.source"):
            got = read(planner, end)
        timer.join()
    finally:
        planner.close()
    assert got == sorted(str(i).encode() for i in range(20))
    name = {"kinesis": "Kinesis", "dynamodb": "DynamoDB"}[service]
    assert f"{name} unavailable since " in caplog.text


def test_the_driver_rides_out_a_dynamodb_outage(
    proxied: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    planner = planner_of(proxied, outage_timeout=120)
    try:
        end = first_batch(planner)
        assert len(read(planner, end)) == 20
        put(proxied["kinesis"].url, proxied["stream"], 20, 5)
        timer = down_for(proxied["dynamodb"], "dynamodb", OUTAGE)
        with caplog.at_level("WARNING", logger="kinesumer.spark.source"):
            second = planner.latest_offset(end, None)  # reads batch 1's ledger: DynamoDB
        timer.join()
        assert second["batch"] == 2
        assert read(planner, second) == sorted(str(i).encode() for i in range(20, 25))
    finally:
        planner.close()
    assert "DynamoDB unavailable since " in caplog.text


@pytest.mark.parametrize("service", ["kinesis", "dynamodb"])
def test_down_for_good_fails_with_the_named_error(proxied: dict[str, Any], service: str) -> None:
    planner = planner_of(proxied, outage_timeout=2)
    try:
        end = first_batch(planner)
        proxied[service].add_rule(Fault.http_503(), service=service)
        with pytest.raises(SourceOutageError) as caught:
            read(planner, end)
    finally:
        proxied[service].clear()
        planner.close()
    name = {"kinesis": "Kinesis", "dynamodb": "DynamoDB"}[service]
    assert str(caught.value).startswith(f"{name} unavailable since 20"), str(caught.value)
    assert "outage_timeout" in str(caught.value)


@pytest.mark.parametrize(
    "error",
    [AccessDeniedError("kinesis.GetRecords denied"), StreamNotFoundError("kinesis: no stream s")],
)
def test_an_error_that_will_not_heal_is_never_ridden_out(error: Exception) -> None:
    """Only TransientAWSError is tried again: a denied call or a missing stream fails at once
    (no retry, no wait), whatever outage_timeout says."""
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        ride_out(step, 300.0, "read")
    assert calls == [1]


def test_a_transient_error_is_tried_again_until_it_heals() -> None:
    answers: list[Exception | str] = [TransientAWSError("dynamodb.Query kept failing"), "ok"]

    def step() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert ride_out(step, 300.0, "ledger read") == "ok" and not answers
