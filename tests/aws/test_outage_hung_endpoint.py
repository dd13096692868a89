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
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy, Rule
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember
from support.wait import eventually

from kinesumer import AsyncKinesumer
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.outage import SourceOutageError

# Hung endpoints: each test waits out read timeouts and retry windows on purpose.
pytestmark = pytest.mark.slow

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
    return [
        proxy.add_rule(Fault.blackhole(), service=service, operation=op) for op in HUNG[service]
    ]


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
    from kinesumer.spark.source.executor.read import read_partition

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
    print(f"\n{service} hung: SourceOutageError {raised - first:.1f} s after the first hung call")


async def test_a_call_that_never_answers_is_cut_at_the_budget_the_outage_dated_from_its_send() -> (
    None
):
    """No network: a call that never answers, under an outage clock of 0.5 s. Its first try is
    given up when the budget ends (without the clock it would wait for ever: botocore's read
    timeout is what bounds a real first try), no second try is sent past the budget, and the
    outage is dated from the first try's send."""
    from kinesumer.aws import RequestStats
    from kinesumer.aws.retry import OutageClock, call_with_retry, outage_clock
    from kinesumer.errors import TransientAWSError

    sends: list[float] = []

    async def never_answers() -> None:
        sends.append(time.monotonic())
        await asyncio.Event().wait()

    clock = OutageClock(0.5)
    with outage_clock(clock), pytest.raises(TransientAWSError) as caught:
        await call_with_retry("kinesis.GetRecords", never_answers, RequestStats())
    # Dated from the try's send (taken just before the call began), not from its cut.
    assert clock.since is not None and 0 <= sends[0] - clock.since < 0.25, (clock.since, sends)
    assert len(sends) == 1  # nothing left of the budget for a second try
    assert "no answer within 0.5 s" in str(caught.value), str(caught.value)


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


#: The Spark query's outage budget (option ``outage_timeout``).
SPARK_OUTAGE = 10.0


def test_a_spark_query_at_latest_fails_with_the_outage_error_when_kinesis_hangs(
    proxied: dict[str, Any],
) -> None:
    """The issue's trial, with the hang made by the proxy: a default (LATEST) query whose
    Kinesis reads hang from the start fails with SourceOutageError, its outage counted from the
    first hung call, not later than ``outage_timeout`` + one read timeout + ``MARGIN`` after
    it. ``local[2]``: a failed task fails the query (no task retries, each with a clock of its
    own). Before: the clock began after the first call's six tries (over a minute). Its length
    (about 20 s) is a Spark session and the query's ``outage_timeout`` running out."""
    pytest.importorskip("pyspark")
    from support.spark_source import Collector, local_spark, start_query

    config = proxied["config"].replace(
        client_timeout=6.0, heartbeat_interval=0.5, handoff_timeout=30.0
    )  # the JVM starting beside the member must not make it look dead
    rules = hang(proxied, "kinesis")
    with local_spark("local[2]") as spark:
        for _attempt in range(3):
            with tempfile.TemporaryDirectory() as folder:
                query = start_query(
                    spark, config, [proxied["stream"]], Collector(), folder,
                    outage_timeout=str(SPARK_OUTAGE),
                )  # fmt: skip
                try:
                    with pytest.raises(Exception) as caught:  # StreamingQueryException
                        # Generous: Spark's start, then the bound asserted below.
                        if not query.awaitTermination(240):
                            raise AssertionError("the query still runs after 240 s")
                    ended = time.time()
                finally:
                    if query.isActive:
                        query.stop()
            text = str(caught.value)
            # Spark waits a fixed 10 s for the source's Python process to connect back; on a
            # machine busy enough that its imports take longer, the query fails before the
            # source ran at all (no Kinesis call made): that start is tried again.
            if "Python worker failed to connect back" in text and all(
                rule.first_fired_at is None for rule in rules
            ):
                continue
            break
    assert "SourceOutageError" in text and "outage_timeout" in text, text[:2000]
    found = re.search(r"Kinesis unavailable since (\S+) \(", text)
    assert found, text[:2000]
    since = datetime.fromisoformat(found.group(1)).timestamp()  # whole seconds, rounded down
    first = first_hung(rules)
    assert since <= first + 0.5, (since, first, text[:2000])
    assert ended - first <= SPARK_OUTAGE + CALL_TIMEOUT + MARGIN, (ended - first, text[:2000])
    print(f"\nSpark query: failed {ended - first:.1f} s after the first hung call")


#: A member's GetRecords: 15 tries, backoff from 0.2 s up to 5 s (kinesumer.kinesis.reader).
GET_RECORDS_WINDOW = sum(min(0.2 * 2**n + 1.0, 5.0) for n in range(14)) + CALL_TIMEOUT


async def test_a_member_reports_hung_get_records_within_the_calls_retry_window(
    proxied: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A member rides out a Kinesis outage (it never fails for one) and reports it: the
    fetcher's WARNING "GetRecords failing" and ``stats().last_error``. With GetRecords hung,
    the report comes when the call's tries give up: not later than its retry window (its
    backoff, about 56 s, plus one read timeout) + ``MARGIN`` after the first hung call. Before:
    each of its 15 tries waited out the read timeout (about 3.5 minutes). Its length (about a
    minute) is the call's retry window at the defaults it pins."""
    rule = proxied["kinesis"].add_rule(Fault.blackhole(), service="kinesis", operation="GetRecords")
    consumer = AsyncKinesumer(proxied["config"])

    async def read() -> None:
        async for _ in consumer.consume([proxied["stream"]]):
            pass

    def reported() -> bool:
        return "GetRecords failing" in caplog.text

    reader = asyncio.ensure_future(read())
    try:
        with caplog.at_level("WARNING"):
            await eventually(lambda: rule.first_fired_at is not None, 60, "the first GetRecords")
            limit = GET_RECORDS_WINDOW + MARGIN + 30  # beyond the bound: fail by the assert
            await eventually(lambda: reported() or reader.done(), limit, "the member's report")
            reported_at = time.time()
        assert not reader.done() or reader.result() is None
        assert reported(), caplog.text[-3000:]
        first = first_hung([rule])
        assert reported_at - first <= GET_RECORDS_WINDOW + MARGIN, reported_at - first
        print(f"\nmember: reported {reported_at - first:.1f} s after the first hung call")
        assert consumer.stats().last_error is not None
    finally:
        proxied["kinesis"].clear()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        await consumer.aclose()


async def test_a_member_reports_a_hung_state_table_within_one_read_timeout_of_its_first_call(
    proxied: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """DynamoDB hung for a member whose ``client_timeout`` (its DynamoDB read timeout) is long:
    it stops delivering at its fence (heartbeat.py, counted from the last landed heartbeat's
    send: ``tests/group/test_heartbeat_fence.py``), and its coordinator reports the outage once the
    first hung call's try timed out, since the call's retry window (about 16.5 s) has passed
    by then: not later than a tick interval + ``client_timeout`` + ``MARGIN`` after the first
    hung request. Before: six tries of ``client_timeout`` each (two minutes here). Its length
    (about 25 s) is the one long read timeout it pins."""
    config = proxied["config"].replace(client_timeout=20.0, heartbeat_interval=5.0)
    consumer = AsyncKinesumer(config)

    async def read() -> None:
        async for _ in consumer.consume([proxied["stream"]]):
            pass

    def reported() -> bool:
        text = caplog.text
        return any(
            line in text
            for line in ("coordinator tick failed", "membership view read failed", "claim retry")
        )

    reader = asyncio.ensure_future(read())
    try:
        await eventually(lambda: consumer.stats().state == "running", 60, "the member's join")
        with caplog.at_level("WARNING"):
            rule = proxied["dynamodb"].add_rule(Fault.blackhole(), service="dynamodb")
            await eventually(lambda: rule.first_fired_at is not None, 60, "a DynamoDB call")
            limit = config.heartbeat_interval + config.client_timeout + MARGIN + 30
            await eventually(lambda: reported() or reader.done(), limit, "the member's report")
            reported_at = time.time()
        assert not reader.done() or reader.result() is None
        assert reported(), caplog.text[-3000:]
        first = first_hung([rule])
        bound = config.heartbeat_interval + config.client_timeout + MARGIN
        assert reported_at - first <= bound, reported_at - first
        print(f"\nmember, DynamoDB hung: reported {reported_at - first:.1f} s after the first call")
    finally:
        proxied["dynamodb"].clear()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        await consumer.aclose()
