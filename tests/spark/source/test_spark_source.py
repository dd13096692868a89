"""``spark.readStream.format("kinesumer")`` on a local Spark (kinesalite + dynalite): availableNow
drains exactly once, a failed batch replays exactly, a failed task re-reads the same range, a
windowed aggregation runs, bad options fail at load() with their named error.

One SparkSession (``local[2,4]``: failed tasks are retried) serves the module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from support.group import create_stream, kinesis, put
from support.spark_source import (
    Collector,
    FirstLedgerWritesRefused,
    checkpoints,
    local_spark,
    members,
    query_group,
    run_to_end,
    spark_group,
    start_query,
)

from kinesumer import Config, ConfigError, StateTableNotFoundError, StreamNotFoundError
from kinesumer.spark.source import option_strings

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

DTYPES = [
    ("stream", "string"),
    ("shard_id", "string"),
    ("sequence_number", "string"),
    ("sub_sequence_number", "bigint"),
    ("partition_key", "string"),
    ("data", "binary"),
    ("approximate_arrival_timestamp", "timestamp"),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return spark_group(kinesalite, dynalite, unique_name)


def run_available_now(spark: Any, config: Config, stream: str, path: str, **kw: Any) -> Collector:
    sink = Collector(fail_on=kw.pop("fail_on", None))
    run_to_end(start_query(spark, config, [stream], sink, path, available_now=True, **kw))
    return sink


@pytest.mark.slow
def test_available_now_drains_four_shards_exactly_once(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """availableNow over four shards: every record once in batches of at most 240, the group's
    checkpoints at each shard's last record and no member left; a second run finds nothing and
    a third only what came since. Its length (about 20 s) is those three runs of one query:
    each is a Spark query start, join, batches and leave."""
    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 4)
    produced = put(group["url"], stream, 0, 400, key=lambda i: f"k{i % 13}")
    sink = run_available_now(
        spark, config, stream, str(tmp_path / "ck"), max_records_per_trigger=240
    )
    assert sorted(sink.datas()) == sorted(produced)  # every record, exactly once
    assert sink.dtypes == DTYPES
    assert len(sink.batches) >= 2  # admission control: 240 records at most per batch
    assert all(len(rows) <= 240 for _, rows in sink.batches)
    row = sink.rows()[0]
    assert row[0] == stream and len(row[2]) >= 50 and row[3] == 0
    assert row[6] is not None and row[4].startswith("k")
    # The group's checkpoints are at each shard's last record (the last batch settled when
    # availableNow asked for more and got nothing).
    last: dict[str, int] = {}
    for r in sink.rows():
        last[r[1]] = max(last.get(r[1], 0), int(r[2]))
    # The query is a group of its own (shared_group=false, the default), named after it.
    own = query_group(config, str(tmp_path / "ck"))
    stored = checkpoints(own, stream)
    assert checkpoints(config, stream) == {}
    assert {k: int(v["sequence_number"]["S"]) for k, v in stored.items()} == last
    # The run left the group when it ended (Spark kills the worker: it left before that).
    assert members(own) == []
    assert all("owner" not in v for v in stored.values())
    # A second run with the same checkpoint finds nothing new ...
    again = run_available_now(spark, config, stream, str(tmp_path / "ck"))
    assert again.batches == []
    # ... and a third one, after more records, just those.
    more = put(group["url"], stream, 400, 40)
    third = run_available_now(spark, config, stream, str(tmp_path / "ck"))
    assert sorted(third.datas()) == sorted(more)


def test_a_failed_batch_is_replayed_exactly_after_restart(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 2)
    produced = put(group["url"], stream, 0, 200)
    path = str(tmp_path / "ck")
    first = Collector(fail_on=1)
    query = start_query(
        spark, config, [stream], first, path, available_now=True, max_records_per_trigger=60
    )
    with pytest.raises(Exception, match="sink failed on batch 1"):
        query.awaitTermination(300)
    assert [b for b, _ in first.batches] == [0] and first.failed
    put(group["url"], stream, 200, 50)  # records arriving meanwhile must not join batch 1
    second = run_available_now(spark, config, stream, path, max_records_per_trigger=60)
    assert second.batches[0][0] == 1
    assert sorted(second.batches[0][1]) == sorted(first.failed)  # exactly the same records
    seen = first.datas() + second.datas()
    assert Counter(seen) == Counter(produced + [str(i).encode() for i in range(200, 250)])


def test_a_task_failing_mid_read_is_retried_on_the_same_range(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """Each task's first ledger write lands and its answer is an error: the task fails after
    its write, Spark runs it again, and the new attempt replays exactly the range written."""
    stream = group["stream"]
    create_stream(group["url"], stream, 2)
    produced = put(group["url"], stream, 0, 100)
    faults = FirstLedgerWritesRefused(group["config"])
    try:
        sink = run_available_now(
            spark, faults.config, stream, str(tmp_path / "ck"), max_records_per_trigger=80
        )
        assert faults.rule.fired >= 2  # every first attempt failed once
        # Spark's first attempts (attempt number 0) of the batches this run planned wrote their
        # range without looking the ledger up; the retries looked, and replayed it.
        looked = faults.looked_up_first()
        assert len(looked) >= 2 and not any(looked.values()), looked
    finally:
        faults.stop()
    assert sorted(sink.datas()) == sorted(produced)


def test_a_plain_sinks_first_attempts_do_not_look_the_ledger_up(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """The partitions a batch's tasks run are the first planned for it (only those skip the
    lookup; a further job on the batch plans them again and looks): so with a sink that is not
    foreachBatch too. Each first attempt fails once after its write (its answer refused on the
    way) and the requests show whether it looked."""
    stream = group["stream"]
    create_stream(group["url"], stream, 2)
    put(group["url"], stream, 0, 40)
    faults = FirstLedgerWritesRefused(group["config"])
    try:
        frame = (
            spark.readStream.format("kinesumer")
            .options(**option_strings(faults.config, [stream]))
            .load()
        )
        query = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        run_to_end(query)
        assert query.exception() is None
        assert faults.rule.fired >= 2
        looked = faults.looked_up_first()
        assert len(looked) >= 2 and not any(looked.values()), looked
    finally:
        faults.stop()


def test_a_windowed_aggregation_with_a_watermark_runs(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    from pyspark.sql import functions as F

    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 2)
    put(group["url"], stream, 0, 90, key=lambda i: f"k{i % 3}")

    counts = (
        spark.readStream.format("kinesumer")
        .options(**option_strings(config, [stream]))
        .load()
        .withWatermark("approximate_arrival_timestamp", "1 minute")
        .groupBy(F.window("approximate_arrival_timestamp", "5 minutes"), "partition_key")
        .count()
    )
    query = (
        counts.writeStream.outputMode("update")
        .format("memory")
        .queryName("kinesumer_counts")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    rows = spark.sql("select partition_key, max(count) as n from kinesumer_counts group by 1")
    assert sorted((r["partition_key"], r["n"]) for r in rows.collect()) == [
        ("k0", 30),
        ("k1", 30),
        ("k2", 30),
    ]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"app": None}, "app"),
        ({"dynamodb_table": None}, "dynamodb_table"),
        ({"colour": "blue"}, "colour"),
        ({"scan_interval": "fast"}, "scan_interval"),
        ({"max_records_per_trigger": "-3"}, "max_records_per_trigger"),
    ],
)
def test_bad_options_fail_at_load_with_the_named_error(
    spark: Any, group: dict[str, Any], change: dict[str, Any], named: str
) -> None:

    options = dict(option_strings(group["config"], [group["stream"]]))
    for key, value in change.items():
        if value is None:
            options.pop(key)
        else:
            options[key] = value
    with pytest.raises(Exception) as caught:
        spark.readStream.format("kinesumer").options(**options).load()
    message = str(caught.value)
    assert "ConfigError" in message and f"Config.{named}" in message


def test_missing_stream_or_table_fail_at_load(spark: Any, group: dict[str, Any]) -> None:
    from kinesumer.spark import read_stream

    config, stream = group["config"], group["stream"]  # the stream was never created
    with pytest.raises(Exception) as caught:
        spark.readStream.format("kinesumer").options(**option_strings(config, [stream])).load()
    assert "StreamNotFoundError" in str(caught.value) and stream in str(caught.value)
    with pytest.raises(StreamNotFoundError):
        read_stream(spark, config, [stream])  # checked in this process: the real error
    with pytest.raises(ConfigError, match="max_records_per_shard"):
        read_stream(spark, config, [stream], max_records_per_shard=0)
    create_stream(group["url"], stream, 1)
    with pytest.raises(StateTableNotFoundError):
        read_stream(spark, config.replace(dynamodb_table="no-such-table"), [stream])


def test_a_restarted_query_takes_over_from_its_stopped_run_at_once(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """query.stop() may end the source worker before its member left (a kill, or the leave cut
    short); the next run of the same query then deregisters that member before joining, instead
    of waiting client_timeout (a minute here, so nothing else can have removed it). Since the
    leave survives the JVM's SIGTERM, a stop usually leaves gracefully: no member is left."""
    from support.wait import wait_until

    config = group["config"].replace(client_timeout=60.0)
    stream = group["stream"]
    create_stream(group["url"], stream, 2)
    put(group["url"], stream, 0, 20)
    path = str(tmp_path / "ck")
    first = Collector()
    query = start_query(spark, config, [stream], first, path)
    try:
        wait_until(lambda: len(first.rows()) >= 20, 120, "the first run's records")
    finally:
        query.stop()
    own = query_group(config, path)  # the same group in both runs: one checkpoint folder
    stopped = set(members(own))
    assert len(stopped) <= 1
    put(group["url"], stream, 20, 20)
    second = run_available_now(spark, config, stream, path)
    assert not stopped & set(members(own))
    new = Counter(str(i).encode() for i in range(20, 40))
    replayed = Counter(second.datas()) - new
    # The stop may have come before Spark committed the first batch: then it is replayed,
    # exactly; nothing else is read twice.
    assert Counter(second.datas()) - replayed == new
    assert replayed in (Counter(), Counter(first.datas()))


def test_trigger_once_runs_one_bounded_batch(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 2)
    produced = put(group["url"], stream, 0, 50)
    sink = Collector()
    frame = (
        spark.readStream.format("kinesumer")
        .options(**option_strings(config, [stream], max_records_per_shard=10))
        .load()
    )
    query = (
        frame.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(once=True)
        .start()
    )
    query.awaitTermination(300)
    assert [b for b, _ in sink.batches] == [0]
    assert len(sink.rows()) == 20 and set(sink.datas()) <= set(produced)  # 10 per shard


def test_an_error_in_the_query_s_source_worker_comes_as_the_named_error_alone(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """The state table deleted between load() (which checked it) and start(): the member's
    join in initialOffset fails, and the query's exception gives the named error, no frames."""
    import boto3

    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 1)
    frame = spark.readStream.format("kinesumer").options(**option_strings(config, [stream]))
    loaded = frame.load()
    boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    ).delete_table(TableName=config.dynamodb_table)
    query = (
        loaded.writeStream.foreachBatch(Collector())
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with pytest.raises(Exception) as caught:
        query.awaitTermination(300)
    text = str(caught.value)
    assert "kinesumer.errors.StateTableNotFoundError: " in text, text[:2000]
    assert "Traceback (most recent call last)" not in text, text[:2000]


def test_a_hostile_aggregate_is_one_plain_row(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """A KPL aggregate whose key table is not UTF-8 (under a correct MD5) stopped the Arrow
    conversion of the query's batch: it is the plain record it is, between its neighbours."""
    from support.kpl import OUTER, bad_utf8_aggregate

    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 1)
    put(group["url"], stream, 0, 1)
    kinesis(group["url"]).put_record(
        StreamName=stream, Data=bad_utf8_aggregate(), PartitionKey=OUTER
    )
    put(group["url"], stream, 1, 1)
    sink = run_available_now(spark, config, stream, str(tmp_path / "ck"))
    rows = sorted(sink.rows(), key=lambda r: int(r[2]))
    assert [(r[4], bytes(r[5])) for r in rows] == [
        ("0", b"0"),
        (OUTER, bad_utf8_aggregate()),
        ("1", b"1"),
    ]
