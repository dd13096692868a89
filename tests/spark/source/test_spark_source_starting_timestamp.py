"""A new query started at a time (``starting_timestamp``, or the AWS Labs / Databricks way of
saying it) on a local Spark with kinesalite + dynalite: it reads exactly the records that
arrived at or after the instant, every shard in order, with the lineage (a parent closed before
the instant passed over and finished, one open at it read from there before its children,
children born after it from their beginning); an existing query checkpoint or group checkpoint
wins over the option; a contradictory or unreadable time fails at ``load()`` with the named
error.

The instant is taken from Kinesis's own arrival stamps (the first record of the second group),
never from this host's clock: that record itself must be read (at *or after*). Kinesalite's
AT_TIMESTAMP never answers on a shard with no record after the instant (STANDINS.md): shards
holding only older records are part of every case here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from support.group import create_stream, kinesis
from support.spark_source import (
    Collector,
    checkpoints,
    local_spark,
    query_group,
    run_to_end,
    spark_group,
)

from kinesumer import Config
from kinesumer.spark.source import option_strings

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

#: Between the two groups: more than Kinesis's millisecond stamps need, and more than a second
#: (botocore may send AT_TIMESTAMP in whole seconds: the readers skip to the millisecond).
GAP = 1.2


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return spark_group(kinesalite, dynalite, unique_name)


def put_to(url: str, stream: str, shard_hash: dict[str, int], datas: list[str]) -> list[bytes]:
    """Put ``datas`` one at a time (so their order in each shard is theirs), the i-th into the
    shard whose hash range holds ``shard_hash`` values in turn; returns them as bytes."""
    client = kinesis(url)
    hashes = list(shard_hash.values())
    for i, data in enumerate(datas):
        client.put_record(
            StreamName=stream,
            Data=data.encode(),
            PartitionKey="k",
            ExplicitHashKey=str(hashes[i % len(hashes)]),
        )
    return [d.encode() for d in datas]


def hash_of(url: str, stream: str) -> dict[str, int]:
    """Each open shard's id -> a hash key inside its range."""
    shards = kinesis(url).list_shards(StreamName=stream)["Shards"]
    return {
        s["ShardId"]: int(s["HashKeyRange"]["StartingHashKey"])
        for s in shards
        if "EndingSequenceNumber" not in s["SequenceNumberRange"]
    }


def arrivals(url: str, stream: str) -> dict[bytes, int]:
    """Every record's data -> its arrival time by Kinesis's clock (epoch ms)."""
    client = kinesis(url)
    out: dict[bytes, int] = {}
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            answer = client.get_records(ShardIterator=iterator, Limit=1000)
            for r in answer["Records"]:
                out[r["Data"]] = int(r["ApproximateArrivalTimestamp"].timestamp() * 1000 + 0.5)
            if not answer["Records"]:
                break
            iterator = answer.get("NextShardIterator")
    return out


def split(url: str, stream: str, shard_id: str) -> None:
    """Split ``shard_id`` at the middle of its hash range; wait until the stream is active."""
    client = kinesis(url)
    shards = {s["ShardId"]: s for s in client.list_shards(StreamName=stream)["Shards"]}
    low, high = (
        int(shards[shard_id]["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey")
    )
    client.split_shard(
        StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})


def run(
    spark: Any, config: Config, stream: str, path: str, position: dict[str, str], **source: Any
) -> Collector:
    """An availableNow query over ``stream`` with the position options ``position`` (by any
    name), to its end."""
    given = option_strings(config.replace(initial_position="LATEST"), [stream], **source)
    assert "initial_position" not in given  # (LATEST is the default: not given)
    frame = spark.readStream.format("kinesumer").options(**given).options(**position).load()
    sink = Collector()
    query = (
        frame.writeStream.foreachBatch(sink)
        .option("checkpointLocation", path)
        .trigger(availableNow=True)
        .start()
    )
    run_to_end(query)
    return sink


def by_shard(sink: Collector) -> dict[str, list[bytes]]:
    """Each shard's records in the order the query delivered them (batch by batch)."""
    out: dict[str, list[bytes]] = {}
    for _, rows in sorted(sink.batches, key=lambda b: b[0]):
        for row in sorted(rows, key=lambda r: (r[1], int(r[2]), r[3])):
            out.setdefault(row[1], []).append(bytes(row[5]))
    return out


def in_shard_order(sink: Collector) -> None:
    """Within each shard, records come in sequence order, batch after batch."""
    last: dict[str, int] = {}
    for _, rows in sorted(sink.batches, key=lambda b: b[0]):
        for row in rows:
            sequence = int(row[2])
            assert sequence > last.get(row[1], -1), f"{row[1]} out of order"
            last[row[1]] = sequence


def two_groups(url: str, stream: str) -> tuple[list[bytes], list[bytes], int]:
    """Three shards; the first group in every shard, the second (after GAP) in two of them
    only: the third holds nothing after the instant. Returns both groups and the instant: the
    arrival of the second group's first record, by Kinesis's clock."""
    create_stream(url, stream, 3)
    hashes = hash_of(url, stream)
    first = put_to(url, stream, hashes, [f"a{i}" for i in range(12)])
    time.sleep(GAP)
    two = dict(list(hashes.items())[:2])
    second = put_to(url, stream, two, [f"b{i}" for i in range(10)])
    stamps = arrivals(url, stream)
    instant = stamps[second[0]]
    assert max(stamps[d] for d in first) < instant <= min(stamps[d] for d in second)
    return first, second, instant


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


@pytest.mark.slow
def test_a_new_query_at_a_time_reads_exactly_what_arrived_from_then_in_shard_order(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """A new query at a time reads exactly what arrived from then, in shard order; a restart's
    checkpoint wins over the option. Its length (about 20 s) is three availableNow runs of the
    one query, each a Spark query start, join, batches and leave: the restart is the point."""
    config, stream, url = group["config"], group["stream"], group["url"]
    _, second, instant = two_groups(url, stream)
    path = str(tmp_path / "ck")
    sink = run(spark, config, stream, path, {"starting_timestamp": iso(instant)})
    assert sorted(sink.datas()) == sorted(second)  # the record at the instant too; none before
    in_shard_order(sink)
    put_order = {d: i for i, d in enumerate(second)}
    for records in by_shard(sink).values():
        assert records == sorted(records, key=put_order.__getitem__)

    # The query's checkpoint wins over the option: a restart with an earlier time reads
    # nothing again, then only what came since.
    again = run(spark, config, stream, path, {"starting_timestamp": iso(instant - 60_000)})
    assert again.batches == []
    more = put_to(url, stream, hash_of(url, stream), [f"c{i}" for i in range(6)])
    third = run(spark, config, stream, path, {"initial_position": "TRIM_HORIZON"})
    assert sorted(third.datas()) == sorted(more)


@pytest.mark.parametrize(
    "name",
    ["epoch ms", "AWS Labs kinesis.startingPosition", "Databricks initialPosition + format"],
)
def test_the_other_connectors_names_start_at_the_same_time(
    spark: Any, group: dict[str, Any], tmp_path: Any, name: str
) -> None:
    config, stream, url = group["config"], group["stream"], group["url"]
    _, second, instant = two_groups(url, stream)
    when = datetime.fromtimestamp(instant / 1000, timezone.utc)
    position = {
        "epoch ms": {"starting_timestamp": str(instant)},
        "AWS Labs kinesis.startingPosition": {
            "kinesis.startingPosition": f"AT_TIMESTAMP {iso(instant)}"
        },
        "Databricks initialPosition + format": {
            "initialPosition": json.dumps(
                {
                    "at_timestamp": when.strftime("%m/%d/%Y %H:%M:%S.")
                    + f"{instant % 1000:03d} +00:00",
                    "format": "MM/dd/yyyy HH:mm:ss.SSS XXX",
                }
            )
        },
    }[name]
    sink = run(spark, config, stream, str(tmp_path / "ck"), position)
    assert sorted(sink.datas()) == sorted(second)
    in_shard_order(sink)


def test_lineage_parents_closed_before_are_finished_open_ones_first_new_children_whole(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    config, stream, url = group["config"], group["stream"], group["url"]
    create_stream(url, stream, 1)
    (root,) = hash_of(url, stream)
    put_to(url, stream, hash_of(url, stream), [f"a{i}" for i in range(6)])
    split(url, stream, root)  # closed before the instant: nothing of it is read
    children = hash_of(url, stream)  # born before the instant
    put_to(url, stream, children, [f"b{i}" for i in range(6)])  # before: not read
    time.sleep(GAP)
    at = put_to(url, stream, children, [f"c{i}" for i in range(8)])  # at and after the instant
    instant = arrivals(url, stream)[at[0]]
    opened = sorted(children)[0]
    split(url, stream, opened)  # open at the instant: read from there, then its children
    grandchildren = {k: v for k, v in hash_of(url, stream).items() if k not in children}
    late = put_to(url, stream, hash_of(url, stream), [f"d{i}" for i in range(9)])
    sink = run(spark, config, stream, str(tmp_path / "ck"), {"starting_timestamp": iso(instant)})
    assert sorted(sink.datas()) == sorted(at + late)
    in_shard_order(sink)
    # Parents before children: the grandchildren's first batch after the parent's last one.
    batches: dict[str, list[int]] = {}
    for batch, rows in sink.batches:
        for row in rows:
            batches.setdefault(row[1], []).append(batch)
    read_grandchildren = [s for s in grandchildren if s in batches]
    assert read_grandchildren and opened in batches
    assert max(batches[opened]) < min(min(batches[s]) for s in read_grandchildren)
    # Every closed shard, the one closed before the instant too, is finished in the group.
    stored = checkpoints(query_group(config, str(tmp_path / "ck")), stream)
    assert stored[root]["finished"]["BOOL"] is True
    assert stored[opened]["finished"]["BOOL"] is True


def test_a_group_checkpoint_wins_over_the_option(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """In the app's group (``shared_group``), a new query (its own, empty checkpoint folder)
    finds the group's checkpoints: it reads on from there, not from its earlier time."""
    config, stream, url = group["config"], group["stream"], group["url"]
    first, second, instant = two_groups(url, stream)
    shared = {"shared_group": True}
    at = {"starting_timestamp": iso(instant)}
    one = run(spark, config, stream, str(tmp_path / "one"), at, **shared)
    assert sorted(one.datas()) == sorted(second)
    more = put_to(url, stream, hash_of(url, stream), [f"c{i}" for i in range(6)])
    before_both = {"starting_timestamp": iso(instant - 60_000)}
    two = run(spark, config, stream, str(tmp_path / "two"), before_both, **shared)
    # The two shards the first query read go on from their checkpoints (nothing of the first
    # or second group again); the third, of which it read nothing (no checkpoint), starts at
    # the time: its records of the first group are read.
    third_shard = first[2::3]
    assert sorted(two.datas()) == sorted(more + third_shard)
    in_shard_order(two)


@pytest.mark.parametrize(
    ("position", "named"),
    [
        ({"initial_position": "TRIM_HORIZON", "starting_timestamp": "2026-01-02T03:04:05Z"},
         "initial_position"),
        ({"kinesis.startingPosition": "AT_TIMESTAMP"}, "kinesis.startingposition"),
        ({"starting_timestamp": "02/01/2026"}, "starting_timestamp"),
    ],
)  # fmt: skip
def test_an_inconsistent_or_unreadable_time_fails_at_load(
    spark: Any, group: dict[str, Any], position: dict[str, str], named: str
) -> None:
    options = option_strings(group["config"].replace(initial_position="LATEST"), [group["stream"]])
    with pytest.raises(Exception) as caught:
        spark.readStream.format("kinesumer").options(**options).options(**position).load()
    assert "ConfigError" in str(caught.value) and f"Config.{named}" in str(caught.value)
