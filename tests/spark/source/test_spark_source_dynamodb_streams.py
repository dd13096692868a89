"""The Spark source over a DynamoDB table's stream (issue 38), on local Spark and moto in server
mode (DynamoDB, DynamoDB Streams and Kinesis at one URL): ``option("streams", <stream ARN>)``
reads every change once, each item's changes in order, the stream record's JSON in ``data``; a
restart from the checkpoint folder reads nothing twice; what a table's stream cannot do
(enhanced fan-out, a starting instant) fails at ``load()`` with the option's named error."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.group import make_config, setup_table
from support.spark_source import Collector, local_spark, run_to_end, start_query
from support.table_streams import TableChanges, by_item, create_streamed_table, write_changes
from support.wait import wait_until

from kinesumer import ConfigError
from kinesumer.spark.source import option_strings
from kinesumer.spark.source.options import parse_options

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

WAIT = 180.0
ARN = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000"
Names = Callable[[str], str]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    table = unique_name("items")
    arn = create_streamed_table(moto_url, table)
    # Spark's timings (as support.spark_source.spark_group): a batch fits in the handoff, and
    # the JVM starting beside the member does not make it look dead.
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        handoff_timeout=30.0,
        client_timeout=6.0,
        heartbeat_interval=0.5,
    )
    setup_table(config)
    return {"config": config, "arn": arn, "changes": TableChanges(moto_url, table)}


def test_a_query_reads_every_change_of_a_table_once_in_item_order_and_a_restart_none_twice(
    spark: Any, env: dict[str, Any], tmp_path: Any
) -> None:
    config, arn, changes = env["config"], env["arn"], env["changes"]
    path = str(tmp_path / "ck")
    write_changes(changes, range(30))
    first = Collector()
    # Small batches: the changes span several batches, so order across batches is tested too.
    query = start_query(spark, config, [arn], first, path, max_records_per_shard=20)
    try:
        wait_until(lambda: len(first.rows()) >= changes.count, WAIT, "every change read")
    finally:
        query.stop()
    assert by_item(first.datas()) == changes.expected
    assert len(first.batches) > 1
    row = first.rows()[0]
    record = json.loads(bytes(row[5]))
    assert row[0] == arn  # the stream column: the ARN as given
    assert record["eventName"] == "INSERT"
    assert record["dynamodb"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert json.loads(row[4]) == record["dynamodb"]["Keys"]  # the partition key: the item's key
    before = changes.count

    write_changes(changes, range(30, 40))
    second = Collector()
    again = start_query(
        spark, config, [arn], second, path, available_now=True, max_records_per_shard=20
    )
    run_to_end(again)
    # The stop may have come before Spark committed the first run's last batch: Spark runs it
    # again under its batch id, exactly (a foreachBatch sink keys on the id); every other row is
    # new. Everything once across the two runs.
    seen = dict(first.batches)
    for batch_id, rows in second.batches:
        if batch_id in seen:
            assert rows == seen[batch_id], f"batch {batch_id} replayed differently"
    fresh = [bytes(r[5]) for b, rows in second.batches if b not in seen for r in rows]
    assert len(fresh) == changes.count - before
    assert by_item(first.datas() + fresh) == changes.expected


def test_enhanced_fan_out_or_a_starting_time_for_a_tables_stream_fails_at_load(
    spark: Any, env: dict[str, Any]
) -> None:
    # The suite's configs start at TRIM_HORIZON: here no position but the starting time.
    options = option_strings(env["config"].replace(initial_position="LATEST"), [env["arn"]])
    for extra, option in (
        ({"consumer_type": "EFO"}, "consumer_type"),
        ({"starting_timestamp": "2026-01-02T03:04:05Z"}, "starting_timestamp"),
    ):
        with pytest.raises(Exception) as caught:
            spark.readStream.format("kinesumer").options(**options, **extra).load()
        first = str(caught.value).splitlines()[0]
        assert f"kinesumer.errors.ConfigError: Config.{option}: DynamoDB Streams has no" in first


BASE = {"app": "orders", "dynamodb_table": "state-table", "region": "eu-west-1"}


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        ({"enhanced_fan_out": "true"}, "enhanced_fan_out"),
        ({"kinesis.consumerType": "SubscribeToShard"}, "consumer_type"),
        ({"starting_timestamp": "1767225600000"}, "starting_timestamp"),
        ({"initial_position": "2026-01-01T00:00:00Z"}, "initial_position"),
        ({"initial_position": "LATEST"}, "initial_position"),
        ({"kinesis.startingPosition": "LATEST"}, "kinesis.startingposition"),
        ({"initialPosition": "AT_TIMESTAMP 2026-01-01T00:00:00Z"}, "initialposition"),
        (
            {"kinesis.startingPosition": "AT_TIMESTAMP", "starting_timestamp": "1767225600000"},
            "starting_timestamp",
        ),
    ],
)
def test_what_a_tables_stream_cannot_do_is_refused_by_the_option_given(
    extra: dict[str, str], option: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_options({**BASE, "streams": f"orders,{ARN}", **extra})
    assert caught.value.field == option
    assert "DynamoDB Streams has no" in str(caught.value)


def test_a_tables_stream_beside_kinesis_streams_takes_their_positions() -> None:
    parsed = parse_options({**BASE, "streams": f"orders,{ARN}", "initial_position": "TRIM_HORIZON"})
    assert parsed.streams == (ARN, "orders")
    # A starting time is fine for Kinesis streams alone.
    assert parse_options({**BASE, "streams": "orders", "starting_timestamp": "1767225600000"})
