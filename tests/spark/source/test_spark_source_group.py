"""The streaming source as a group member (local Spark, kinesalite + dynalite): a split and a
merge while a query runs (parents before children, nothing lost), two queries of one app split
the shards and a stopped one hands over, a query and a plain ``Kinesumer`` split them likewise
(both with ``shared_group=true``; by default each query is a group of its own).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from support.group import create_stream, kinesis, put
from support.spark_source import Collector, checkpoints, local_spark, spark_group, start_query
from support.wait import wait_until

from kinesumer import Kinesumer, Record
from kinesumer.spark.source import option_strings

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

#: Bound on each wait: Spark on two shared cores is slow, never this slow.
WAIT = 180.0


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    return spark_group(kinesalite, dynalite, unique_name)


def status(*queries: Any) -> Any:
    """For a wait's failure message: each query's error, if it failed, and its last progress."""
    return lambda: "\n".join(
        f"{q.name}: exception={q.exception()} progress={q.lastProgress}" for q in queries
    )


def numbers(rows: list[bytes]) -> list[int]:
    return [int(d) for d in rows]


def owners(group: dict[str, Any]) -> set[str]:
    items = checkpoints(group["config"], group["stream"]).values()
    return {
        i["owner"]["S"] for i in items if "owner" in i and not i.get("finished", {}).get("BOOL")
    }


def test_split_and_merge_while_a_query_runs(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    url, stream = group["url"], group["stream"]
    create_stream(url, stream, 3)
    key = lambda i: f"k{i % 7}"  # noqa: E731
    put(url, stream, 0, 60, key=key)
    sink = Collector()
    query = start_query(spark, group["config"], [stream], sink, str(tmp_path / "ck"))
    try:
        wait_until(lambda: len(sink.rows()) >= 60, WAIT, "the first 60 records", status(query))
        client = kinesis(url)
        shards = client.list_shards(StreamName=stream)["Shards"]
        first = shards[0]
        low, high = (int(first["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        client.split_shard(
            StreamName=stream,
            ShardToSplit=first["ShardId"],
            NewStartingHashKey=str((low + high) // 2),
        )
        put(url, stream, 60, 60, key=key)
        wait_until(
            lambda: len(sink.rows()) >= 120, WAIT, "the records after the split", status(query)
        )
        client.merge_shards(
            StreamName=stream,
            ShardToMerge=shards[1]["ShardId"],
            AdjacentShardToMerge=shards[2]["ShardId"],
        )
        put(url, stream, 120, 60, key=key)
        wait_until(
            lambda: len(sink.rows()) >= 180, WAIT, "the records after the merge", status(query)
        )
    finally:
        query.stop()
    assert Counter(numbers(sink.datas())) == Counter(range(180))  # nothing lost, no repeats
    # Parents before children: per key, the records come in the order they were put (a
    # parent's and a child's records are never in the same batch).
    by_key: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for batch_id, rows in sink.batches:
        for row in rows:
            by_key[row[4]].append((batch_id, int(row[2]), int(row[5])))
    for k, seen in by_key.items():
        ordered = [n for _, _, n in sorted(seen)]
        assert ordered == sorted(ordered), f"{k} out of order across the reshard"
    children = {r[1] for r in sink.rows()} - {s["ShardId"] for s in shards}
    assert len(children) == 3  # two from the split, one from the merge


def test_two_queries_split_the_shards_and_a_stopped_one_hands_over(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    url, stream, config = group["url"], group["stream"], group["config"]
    create_stream(url, stream, 4)
    first, second = Collector(), Collector()
    one = start_query(spark, config, [stream], first, str(tmp_path / "one"), shared_group=True)
    two = start_query(spark, config, [stream], second, str(tmp_path / "two"), shared_group=True)
    try:
        wait_until(
            lambda: len(owners(group)) == 2, WAIT, "both queries owning shards", status(one, two)
        )
        put(url, stream, 0, 200)
        seen = lambda: first.datas() + second.datas()  # noqa: E731
        wait_until(lambda: len(set(seen())) >= 200, WAIT, "every record", status(one, two))
        assert first.datas() and second.datas()  # both read
        assert Counter(numbers(seen())) == Counter(range(200))  # split: nobody read twice
        one.stop()
        wait_until(
            lambda: len(owners(group)) == 1,
            WAIT,
            "the other query owning every shard",
            status(one, two),
        )
        put(url, stream, 200, 100)
        wait_until(
            lambda: set(range(200, 300)) <= set(numbers(second.datas())),
            WAIT,
            "the remaining query reading the new records",
            status(one, two),
        )
    finally:
        one.stop()
        two.stop()
    # Nothing lost; what the stopped query had planned but not settled may be read again.
    assert set(numbers(first.datas() + second.datas())) == set(range(300))


def test_a_query_and_a_plain_kinesumer_split_the_shards(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    url, stream, config = group["url"], group["stream"], group["config"]
    create_stream(url, stream, 4)
    plain: list[Record] = []
    stop = threading.Event()
    consumer = Kinesumer(config)

    def consume() -> None:
        consumer.subscribe([stream])
        while not stop.is_set():
            plain.extend(consumer.poll(100, 0.2))
        consumer.close()

    thread = threading.Thread(target=consume, name="plain-kinesumer", daemon=True)
    thread.start()
    sink = Collector()
    query = start_query(spark, config, [stream], sink, str(tmp_path / "ck"), shared_group=True)
    try:
        wait_until(
            lambda: len(owners(group)) == 2,
            WAIT,
            "the query and Kinesumer owning shards",
            status(query),
        )
        put(url, stream, 0, 200)
        everything = lambda: sink.datas() + [r.data for r in plain]  # noqa: E731
        wait_until(lambda: len(set(everything())) >= 200, WAIT, "every record", status(query))
        assert sink.datas() and plain
        assert Counter(numbers(everything())) == Counter(range(200))
        stop.set()  # the plain consumer leaves gracefully: the query gets every shard
        thread.join(60)
        wait_until(
            lambda: len(owners(group)) == 1, WAIT, "the query owning every shard", status(query)
        )
        put(url, stream, 200, 100)
        wait_until(
            lambda: set(range(200, 300)) <= set(numbers(sink.datas())),
            WAIT,
            "the new records",
            status(query),
        )
    finally:
        stop.set()
        query.stop()
    assert Counter(numbers(sink.datas() + [r.data for r in plain])) == Counter(range(300))


def read_some(query: Any) -> bool:
    """Whether the query has had a batch with rows (its shards opened and read)."""
    return any(p["numInputRows"] for p in query.recentProgress)


def test_two_sinks_of_one_dataframe_each_get_every_record_at_latest(
    spark: Any, group: dict[str, Any], tmp_path: Any
) -> None:
    """The default (no shared_group), at the default LATEST: each query of one DataFrame is a
    group of its own and reads the whole stream, like Spark's Kafka source. (A thread keeps
    putting records meanwhile: kinesalite answers AT_TIMESTAMP, where a LATEST start is pinned,
    only once some record arrived at or after the instant, STANDINS.md.)"""
    url, stream = group["url"], group["stream"]
    config = group["config"].replace(initial_position="LATEST")
    create_stream(url, stream, 2)
    frame = spark.readStream.format("kinesumer").options(**option_strings(config, [stream])).load()
    sinks = [Collector(), Collector()]
    queries = [
        frame.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / f"ck{i}"))
        .trigger(processingTime="200 milliseconds")
        .start()
        for i, sink in enumerate(sinks)
    ]
    stop = threading.Event()

    def keep_putting() -> None:  # numbered from 10_000, on both shards
        n = 10_000
        while not stop.wait(0.3):
            put(url, stream, n, 4, key=lambda i: f"k{i % 4}")
            n += 4

    putter = threading.Thread(target=keep_putting, name="putter", daemon=True)
    putter.start()
    try:
        wait_until(  # each has opened the shards (LATEST: what arrives from then on) and read
            lambda: all(read_some(q) for q in queries), WAIT, "both queries reading",
            status(*queries),
        )  # fmt: skip
        put(url, stream, 0, 100)
        wait_until(
            lambda: all(set(range(100)) <= set(numbers(s.datas())) for s in sinks),
            WAIT,
            "every record in both sinks",
            lambda: f"{[len(s.datas()) for s in sinks]} {status(*queries)()}",
        )

        # The progress's latestOffset (reportLatestOffset) tells the batch read last, with its
        # lag. A sink has its rows before Spark posts that batch's progress, so wait for one
        # (the putter keeps batches coming) rather than read the progress once: the first
        # batch's own report has no "read" (nothing was read before it), and a CI run stopped
        # the queries with only that one posted.
        def reported() -> list[str]:
            return [p["sources"][0].get("latestOffset") or "" for p in queries[0].recentProgress]

        wait_until(
            lambda: any('"read"' in r and '"max_millis_behind"' in r for r in reported()),
            WAIT,
            "a progress that tells the batch read last",
            lambda: str(reported()[-3:]),
        )
    finally:
        stop.set()
        putter.join(10)
        for query in queries:
            query.stop()
    for sink in sinks:
        seen = Counter(numbers(sink.datas()))
        assert {n: c for n, c in seen.items() if n < 10_000} == dict.fromkeys(range(100), 1)
        assert set(seen.values()) == {1}  # nothing twice
