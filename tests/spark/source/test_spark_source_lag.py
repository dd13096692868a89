"""The lag probe reads a Spark query's group as any other (issue 37): a streaming query with
``shared_group=true`` is a member of the app's group (its driver's ``ExternalReadMember``) and
settles the same checkpoint items once Spark committed a batch, so ``group_lag(config)`` shows
each shard with the query's member as owner, the checkpoint at the last record the query read of
it, and no lag; and once the query stopped and more records came, a lag on the shards that got
them, measured from the stream (no member running), no larger than the age of the first unread
record plus the ``Date`` header's second.

Upper bound: the probe's figure is Kinesis's ``Date`` (whole seconds, taken as the end of its
second) minus the first unread record's ApproximateArrivalTimestamp, read back here; kinesalite
runs on this host, so its ``Date`` is this host's clock, and the figure is at most this host's
time after the probe minus that arrival, plus 1 s, plus :data:`CLOCK_MARGIN_MS` (milliseconds
rounded on the way). No other host-clock comparison: the wait before the second probe only
makes the first unread records older than a second so that their lag is plainly above 0.

Its length (about a minute on two shared cores): a local SparkSession starting, a query's
first batches (the JVM starting the source's Python workers), and the settle of the last
batch, which happens at the next trigger's ``latestOffset``; every wait is bounded by
:data:`WAIT`, far beyond what it takes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.group import create_stream, kinesis, put
from support.spark_source import (
    Collector,
    checkpoints,
    local_spark,
    members,
    spark_group,
    start_query,
)
from support.wait import wait_until

from kinesumer.admin import group_lag

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

#: Bound on each wait: Spark on two shared cores is slow, never this slow.
WAIT = 180.0
#: Milliseconds of rounding between kinesalite's stamps and this host's clock (the same clock:
#: kinesalite runs here) in the upper bound of a lag.
CLOCK_MARGIN_MS = 50
#: The ``Date`` header's resolution the probe adds (its figure is the end of the second).
DATE_SECOND_MS = 1000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return spark_group(kinesalite, dynalite, unique_name)


def status(query: Any) -> Any:
    return lambda: f"exception={query.exception()} progress={query.lastProgress}"


def positions(config: Any, stream: str) -> dict[str, int | None]:
    """Per shard, the group's checkpointed sequence number (None: claimed, no position yet)."""
    return {
        shard: int(item["sequence_number"]["S"]) if "sequence_number" in item else None
        for shard, item in checkpoints(config, stream).items()
    }


def last_read(sink: Collector) -> dict[str, int]:
    """Per shard, the sequence number of the last record the query read."""
    last: dict[str, int] = {}
    for row in sink.rows():
        last[row[1]] = max(last.get(row[1], 0), int(row[2]))
    return last


def first_unread_arrival_ms(url: str, stream: str, shard_id: str, after: int) -> int | None:
    """The ApproximateArrivalTimestamp (epoch ms, kinesalite's clock) of the first record of
    ``shard_id`` after sequence number ``after``; None when there is none."""
    client = kinesis(url)
    iterator = client.get_shard_iterator(
        StreamName=stream,
        ShardId=shard_id,
        ShardIteratorType="AFTER_SEQUENCE_NUMBER",
        StartingSequenceNumber=str(after),
    )["ShardIterator"]
    records = client.get_records(ShardIterator=iterator, Limit=1)["Records"]
    if not records:
        return None
    return int(records[0]["ApproximateArrivalTimestamp"].timestamp() * 1000)


def test_the_lag_probe_reads_a_spark_querys_group_as_any_other(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    config, url, stream = group["config"], group["url"], group["stream"]
    create_stream(url, stream, 2)
    key = lambda i: f"k{i % 7}"  # noqa: E731
    produced = put(url, stream, 0, 60, key=key)
    sink = Collector()
    query = start_query(spark, config, [stream], sink, str(tmp_path / "ck"), shared_group=True)
    try:
        wait_until(lambda: len(sink.rows()) >= 60, WAIT, "the 60 records", status(query))
        assert sorted(sink.datas()) == sorted(produced)
        last = last_read(sink)
        assert len(last) == 2  # both shards got records
        (member,) = members(config)  # the query's driver, in the app's own group

        def settled() -> bool:
            owners = {v.get("owner", {}).get("S") for v in checkpoints(config, stream).values()}
            return positions(config, stream) == last and owners == {member}

        wait_until(
            settled,
            WAIT,
            "the checkpoints at the last records read, owned by the query's member",
            lambda: f"{checkpoints(config, stream)} last read {last}",
        )
        caught_up = group_lag(config)
        assert [(r.stream, r.shard_id) for r in caught_up.shards] == [
            (stream, shard) for shard in sorted(last)
        ]
        for row in caught_up.shards:
            assert row.owner == member
            assert row.checkpoint == str(last[row.shard_id])
            assert row.millis_behind == 0
        assert caught_up.max_millis_behind == 0
    finally:
        query.stop()

    # The query left the group: no member runs, and the lag is read from the stream.
    assert query.exception() is None
    assert positions(config, stream) == last
    put(url, stream, 60, 20, key=key)
    arrivals = {
        shard: first_unread_arrival_ms(url, stream, shard, after) for shard, after in last.items()
    }
    got = {shard: ms for shard, ms in arrivals.items() if ms is not None}
    assert got  # the 20 records went somewhere
    # Make the unread records older than a second (kinesalite's clock is this host's).
    newest = max(got.values())
    wait_until(lambda: time.time() * 1000 > newest + DATE_SECOND_MS, 10, "a second to pass")
    behind = group_lag(config, [stream])
    probed_by_ms = time.time() * 1000
    rows = {row.shard_id: row for row in behind.shards}
    assert sorted(rows) == sorted(last)
    for shard, row in rows.items():
        assert row.owner is None
        assert row.checkpoint == str(last[shard])
        if shard not in got:
            assert row.millis_behind == 0
            continue
        age_ms = probed_by_ms - got[shard]
        assert 0 < row.millis_behind <= age_ms + DATE_SECOND_MS + CLOCK_MARGIN_MS, (
            row,
            age_ms,
        )
    assert behind.max_millis_behind == max(rows[s].millis_behind for s in got)
