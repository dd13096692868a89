"""A local-Spark query (kinesalite + dynalite) whose parent shard's last batch read nothing but
SHARD_END, and then: its driver ended before the next trigger (``once`` runs), or the query was
stopped between the batches; the next run of the query reads every record of the children.

The scenario: a 1-shard stream with 20 records, split, 20 more on the children; the query reads
with ``max_records_per_shard=20``, so the parent's 20 come in one batch and its SHARD_END in the
next, which records ``end=None, shard_end=True`` in the ledger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from support.group import create_stream, put
from support.spark_source import Collector, checkpoints, local_spark, spark_group, start_query
from support.wait import wait_until

from kinesumer import Config
from kinesumer.kinesis.reader import SERVER_CLOCK_MARGIN_MS

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

WAIT = 180.0


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    group = spark_group(kinesalite, dynalite, unique_name)
    url, stream = group["url"], group["stream"]
    create_stream(url, stream, 1)
    group["parent_records"] = put(url, stream, 0, 20)
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    (parent,) = client.list_shards(StreamName=stream)["Shards"]
    low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    group["parent"] = parent["ShardId"]
    group["children_records"] = put(url, stream, 20, 20)
    return group


def run(spark: Any, config: Config, stream: str, path: str, trigger: str) -> Collector:
    sink = Collector()
    frame = (
        spark.readStream.format("kinesumer")
        .options(**_options(config, stream))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", path)
    )
    query = frame.trigger(**{trigger: True}).start()
    try:
        query.awaitTermination(300)
    finally:
        if query.isActive:
            query.stop()
    return sink


def _options(config: Config, stream: str) -> Any:
    from kinesumer.spark.source import option_strings

    # The app's group (shared_group): the tests look at its checkpoint items by the app's name.
    return option_strings(config, [stream], max_records_per_shard=20, shared_group=True)


def assert_children_read(group: dict[str, Any], *sinks: Collector) -> None:
    seen = [d for sink in sinks for d in sink.datas()]
    assert Counter(seen) == Counter(group["parent_records"] + group["children_records"])
    parent = checkpoints(group["config"], group["stream"])[group["parent"]]
    assert parent.get("finished", {}).get("BOOL") is True


def test_a_driver_ended_after_the_parents_empty_last_read_reads_the_children_next_run(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    config, stream, path = group["config"], group["stream"], str(tmp_path / "ck")
    first = run(spark, config, stream, path, "once")  # the parent's 20 records
    assert sorted(first.datas()) == sorted(group["parent_records"])
    second = run(spark, config, stream, path, "once")  # its SHARD_END only; then the end
    assert second.rows() == []
    third = run(spark, config, stream, path, "availableNow")
    assert_children_read(group, first, second, third)


def test_a_query_stopped_after_the_parents_empty_last_read_reads_the_children_next_run(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    config, stream, path = group["config"], group["stream"], str(tmp_path / "ck")
    sink = Collector()
    frame = (
        spark.readStream.format("kinesumer")
        .options(**_options(config, stream))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", path)
        .trigger(processingTime="8 seconds")  # the stop comes before the next trigger settles
    )
    query = frame.start()
    try:
        # Batch 0: the parent's 20 records; batch 1 (a trigger later): its SHARD_END only.
        wait_until(lambda: len(sink.batches) >= 2, WAIT, "two batches")
    finally:
        query.stop()
    assert sorted(sink.datas()) == sorted(group["parent_records"])
    again = run(spark, config, stream, path, "availableNow")
    assert_children_read(group, sink, again)


def test_at_latest_a_query_with_a_new_checkpoint_folder_reads_from_the_first_open(
    spark: Any, kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Any
) -> None:
    """At the default LATEST: a run whose batch opened the shard (and never read it: a sink
    that ignores its input), then a run with a new checkpoint folder reads every record put in
    between. (A thread keeps putting records during the second run: kinesalite answers
    AT_TIMESTAMP only when some record arrived at or after the instant.)"""
    import threading
    import time

    group = spark_group(kinesalite, dynalite, unique_name)
    url, stream = group["url"], group["stream"]
    config = group["config"].replace(initial_position="LATEST")
    create_stream(url, stream, 1)
    put(url, stream, 0, 5)  # before LATEST: never read
    # A LATEST start is Kinesis's Date less SERVER_CLOCK_MARGIN_MS (it may read that much
    # earlier, never later), and AT_TIMESTAMP travels in whole seconds.
    time.sleep(SERVER_CLOCK_MARGIN_MS / 1000 + 1.1)

    def ignore(df: Any, batch_id: int) -> None:
        pass

    # shared_group: a new checkpoint folder joins the same group (by default it is a new group,
    # a new reader, that starts at LATEST as of its own start).
    query = start_query(
        spark, config, [stream], ignore, str(tmp_path / "a"), available_now=True, shared_group=True
    )
    query.awaitTermination(300)
    time.sleep(0.05)
    between = put(url, stream, 5, 20)  # after the first run opened the shard
    stop = threading.Event()

    def keep_putting() -> None:
        n = 1000
        while not stop.wait(0.3):
            put(url, stream, n, 1)
            n += 1

    putter = threading.Thread(target=keep_putting, daemon=True)
    time.sleep(1.1)
    putter.start()
    try:
        sink = run(spark, config, stream, str(tmp_path / "b"), "availableNow")
    finally:
        stop.set()
        putter.join(10)
    assert set(between) <= set(sink.datas())
    assert not {str(i).encode() for i in range(5)} & set(sink.datas())


@pytest.mark.slow
def test_a_lease_lost_and_claimed_again_after_the_parents_last_read_still_finishes_it(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """Between the parent's SHARD_END batch and the next trigger (which settles it), another
    client takes the parent over in the state table and goes away: the query's finish of the
    parent is refused (lease lost), the query claims the parent again, and finishes it then.
    Its length (about 30 s) is real Spark triggers 8 s apart, so the take-over lands between
    the parent's last batch and the trigger that settles it: the window it pins."""
    import time

    config, stream, parent = group["config"], group["stream"], group["parent"]
    sink = Collector()
    frame = (
        spark.readStream.format("kinesumer")
        .options(**_options(config, stream))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="8 seconds")  # the take-over lands before the next trigger
    )
    query = frame.start()
    try:
        wait_until(lambda: len(sink.batches) >= 2, WAIT, "the parent's batches")
        db = boto3.client(
            "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
        )
        db.update_item(
            TableName=config.dynamodb_table,
            Key={"pk": {"S": f"check_point#{config.app}#{stream}"}, "sk": {"S": parent}},
            UpdateExpression="SET #o = :ghost, #l = #l + :one, last_update = :now",
            ExpressionAttributeNames={"#o": "owner", "#l": "lease"},
            ExpressionAttributeValues={
                ":ghost": {"S": "ghost-1"},
                ":one": {"N": "1"},
                ":now": {"N": str(int(time.time() * 1000))},
            },
        )
        wait_until(lambda: len(set(sink.datas())) >= 40, 90, "the children's records")
    finally:
        query.stop()
    assert_children_read(group, sink)


def test_a_query_stopped_once_its_batch_settled_leaves_nothing_to_read_twice(
    spark: Any, kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Any
) -> None:
    """The group's checkpoints follow Spark's commit of a batch at the next trigger
    (docs/spark/source.md: the exact window): a query stopped after that has them at the
    batch's ends, and a plain member of the app then delivers only what came after."""
    import threading

    from kinesumer import Kinesumer

    group = spark_group(kinesalite, dynalite, unique_name)
    url, stream, config = group["url"], group["stream"], group["config"]
    create_stream(url, stream, 2)
    first = put(url, stream, 0, 30)
    sink = Collector()
    query = start_query(  # 200 ms trigger; the app's group, which a plain member then joins
        spark, config, [stream], sink, str(tmp_path / "ck"), shared_group=True
    )
    try:
        wait_until(lambda: sorted(sink.datas()) == sorted(first), WAIT, "the first records")

        def settled() -> bool:
            last: dict[str, int] = {}
            for row in sink.rows():
                last[row[1]] = max(last.get(row[1], 0), int(row[2]))
            stored = checkpoints(config, stream)
            at = {
                k: int(v["sequence_number"]["S"])
                for k, v in stored.items()
                if "sequence_number" in v
            }
            return at == last

        wait_until(settled, WAIT, "the group's checkpoints at the committed batch's ends")
    finally:
        query.stop()
    later = put(url, stream, 30, 10)
    got: list[bytes] = []
    consumer = Kinesumer(config)
    done = threading.Event()

    def consume() -> None:
        consumer.subscribe([stream])
        while not done.is_set():
            got.extend(r.data for r in consumer.poll(100, 0.2))
        consumer.close()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        wait_until(lambda: set(later) <= set(got), WAIT, "the later records")
    finally:
        done.set()
        thread.join(60)
    assert sorted(got) == sorted(later)  # nothing the query's sink already had
