"""A hung endpoint (it accepts the connection and never answers: the fault proxy's blackhole)
is an outage from the first hung call's send, for the Spark source and for members alike.

The source: ``outage_timeout`` counts from the moment the first hung call was sent, and a call
still waiting when the budget ends is cut, so :class:`SourceOutageError` comes by then (its
``since`` no later than the first hung request reached the proxy), not after every try of the
call waited out botocore's 10 s read timeout (six tries: over a minute) and a second round of
tries after that. A member: a retried call gives up within its retry window
(:func:`kinesumer.aws.retry.retry_window`) of its first hung try's send, and the member reports
the outage as it does for quick failures (its WARNING, ``stats().last_error``).

Upper bounds are stated with generous margins for a busy machine; the order of events (the
outage's start against the first hung request) is what each test holds first. Kinesalite and
dynalite behind the fault proxy, ``initial_position`` LATEST (the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _faultproxy import Fault, FaultProxy, Rule
from _group import create_stream, make_config, put, setup_table
from _spark_fakes import SoloMember
from _wait import wait_until

from kinesumer import AsyncKinesumer
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.outage import SourceOutageError
from kinesumer.spark.source.planner import Planner

#: botocore's read timeout on kinesumer's clients: how long one try waits for an answer.
CALL_TIMEOUT = 10.0
#: Allowance for a busy machine (two cores shared with Spark and other suites) on every bound.
MARGIN = 20.0
#: The outage budget of the planner-level tests: far below one try's read timeout.
OUTAGE = 4.0
NAMES = {"kinesis": "Kinesis", "dynamodb": "DynamoDB"}
#: The calls blackholed per service: the source's own (SoloMember lists shards with boto3
#: through the same proxy, and must keep doing so).
HUNG = {"kinesis": ("GetShardIterator", "GetRecords"), "dynamodb": (None,)}


@pytest.fixture
def proxied(kinesalite: Any, dynalite: Any, unique_name: Any) -> Iterator[dict[str, Any]]:
    kinesis, dynamodb = FaultProxy(kinesalite.url), FaultProxy(dynalite.url)
    config = make_config(
        kinesis.url, dynamodb.url, unique_name("app"), unique_name("state"),
        initial_position="LATEST",
    )  # fmt: skip
    setup_table(config.replace(dynamodb_endpoint=dynalite.url))
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    try:
        yield {
            "config": config, "stream": stream, "url": kinesalite.url,
            "kinesis": kinesis, "dynamodb": dynamodb,
        }  # fmt: skip
    finally:
        kinesis.stop()
        dynamodb.stop()


def hang(proxied: dict[str, Any], service: str) -> list[Rule]:
    proxy: FaultProxy = proxied[service]
    return [proxy.add_rule(Fault.blackhole(), service=service, operation=op) for op in HUNG[service]]


def first_hung(rules: list[Rule]) -> float:
    fired = [r.first_fired_at for r in rules if r.first_fired_at is not None]
    assert fired, "no call reached the hung endpoint"
    return min(fired)


def planner_at_latest(proxied: dict[str, Any]) -> tuple[Planner, dict[str, Any]]:
    """A query's planner, its first batch planned (the shard pinned at LATEST), and records
    put after the pin (kinesalite's AT_TIMESTAMP answers only when some arrived after it)."""
    options = SourceOptions(
        config=proxied["config"], streams=(proxied["stream"],), outage_timeout=OUTAGE
    )
    planner = Planner(options, SoloMember)  # type: ignore[arg-type]
    planner.initial_offset()
    end = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
    time.sleep(1.1)  # AT_TIMESTAMP is sent in whole seconds
    put(proxied["url"], proxied["stream"], 0, 5)
    return planner, end


def read(planner: Planner, end: dict[str, Any]) -> list[bytes]:
    from kinesumer.spark.source.executor import read_partition

    out: list[bytes] = []
    for partition in planner.partitions(end):
        for batch in read_partition(partition):
            out.extend(bytes(d) for d in batch.column("data").to_pylist())
    return out


def fails_by_the_bound(
    step: Callable[[], Any], rules: list[Rule], service: str, hung_at: float
) -> None:
    """``step()`` raises SourceOutageError naming ``service``; the outage began when the first
    hung call was sent (after ``hung_at``, no later than the proxy got it), and the error came
    not later than ``OUTAGE`` + one read timeout + ``MARGIN`` after that."""
    with pytest.raises(SourceOutageError) as caught:
        step()
    raised = time.time()
    first = first_hung(rules)
    error = caught.value
    assert str(error).startswith(f"{NAMES[service]} unavailable since "), str(error)
    since = error.since.timestamp()
    # The order of events: the outage counts from the first hung call's send.
    assert hung_at - 0.5 <= since <= first + 0.5, (hung_at, since, first, str(error))
    assert raised - first <= OUTAGE + CALL_TIMEOUT + MARGIN, (raised - first, str(error))


@pytest.mark.parametrize("service", ["kinesis", "dynamodb"])
def test_an_executor_read_hung_on_a_service_fails_by_outage_timeout_from_the_first_hung_call(
    proxied: dict[str, Any], service: str
) -> None:
    planner, end = planner_at_latest(proxied)
    try:
        hung_at = time.time()
        rules = hang(proxied, service)
        fails_by_the_bound(lambda: read(planner, end), rules, service, hung_at)
    finally:
        proxied[service].clear()
        planner.close()


@pytest.mark.parametrize("service", ["kinesis", "dynamodb"])
def test_the_driver_hung_on_a_service_fails_by_outage_timeout_from_the_first_hung_call(
    proxied: dict[str, Any], service: str
) -> None:
    """The next batch's planning: the ledger read (DynamoDB), or the probe of a caught-up
    shard for new records (Kinesis: GetShardIterator)."""
    planner, end = planner_at_latest(proxied)
    try:
        assert len(read(planner, end)) == 5  # caught up: the next planning probes the shard
        hung_at = time.time()
        rules = hang(proxied, service)
        fails_by_the_bound(lambda: planner.latest_offset(end, None), rules, service, hung_at)
    finally:
        proxied[service].clear()
        planner.close()
