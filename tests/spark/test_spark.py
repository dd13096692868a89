"""kinesumer.spark on a local Spark session: micro-batches as DataFrames, checkpoints only after
``fn`` returned, re-delivery after a failed batch, two drivers splitting a group, available_now
(also across a reshard, on kinesalite + dynalite), batch bounds, signals, the missing extra.

One SparkSession (``local[2]``, no UI) serves the whole module: starting one costs 5-15 s.
Without pyspark/pyarrow the Spark tests skip with the reason, unless ``KINESUMER_REQUIRE_SPARK=1``
(set in CI), which turns the skip into a failure so a broken install cannot pass silently.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.spark_source import local_spark
from support.wait import wait_until

from kinesumer import Config, KinesumerError, Record
from kinesumer.spark import COLUMNS as SPARK_COLUMNS
from kinesumer.spark import (
    SCHEMA_DDL,
    BatchInfo,
    RunSummary,
    SparkNotInstalledError,
    arrow_schema,
    foreach_batch,
    records_to_arrow,
    records_to_batches,
    spark_schema,
)
from kinesumer.spark.arrow import FIELDS

Names = Callable[[str], str]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a None placeholder in sys.modules
        return False


HAVE_SPARK = _installed("pyspark") and _installed("pyarrow")
REQUIRE_SPARK = os.environ.get("KINESUMER_REQUIRE_SPARK") == "1"
needs_spark = pytest.mark.skipif(
    not HAVE_SPARK and not REQUIRE_SPARK,
    reason="pyspark/pyarrow not installed: pip install 'kinesumer[spark]'",
)

COLUMNS = (
    "stream",
    "shard_id",
    "sequence_number",
    "sub_sequence_number",
    "partition_key",
    "data",
    "approximate_arrival_timestamp",
)
SCHEMA = (
    "struct<stream:string,shard_id:string,sequence_number:string,sub_sequence_number:bigint,"
    "partition_key:string,data:binary,approximate_arrival_timestamp:timestamp>"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One local Spark session for the module; workers use this interpreter, loopback only."""
    if not HAVE_SPARK and not REQUIRE_SPARK:
        pytest.skip("pyspark/pyarrow not installed: pip install 'kinesumer[spark]'")
    with local_spark("local[2]", "kinesumer-tests") as session:
        yield session


@dataclass
class Env:
    url: str
    config: Config
    stream: str


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> Env:
    # A generous handoff: the Spark jobs of a batch must fit in it (see test_two_drivers...);
    # a long client_timeout: a JVM starting next to us must not make a member look dead.
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        handoff_timeout=30.0,
        client_timeout=6.0,
    )
    setup_table(config)
    return Env(moto_url, config, unique_name("s"))


@dataclass
class Seen:
    """What one fn call saw."""

    batch_id: int
    info: BatchInfo
    rows: list[tuple[Any, ...]]


def recorder(sink: list[Seen], lock: threading.Lock | None = None) -> Callable[..., None]:
    """An fn that collects each batch's rows (timestamps as epoch microseconds)."""
    from pyspark.sql import functions as F

    def fn(df: Any, batch_id: int, info: BatchInfo) -> None:
        ts = F.unix_micros("approximate_arrival_timestamp").alias("ts")
        rows = [tuple(r) for r in df.select(*COLUMNS[:-1], ts).collect()]
        seen = Seen(batch_id, info, rows)
        if lock is None:
            sink.append(seen)
        else:
            with lock:
                sink.append(seen)

    return fn


def rows_of(sink: list[Seen]) -> list[tuple[Any, ...]]:
    return [row for seen in sink for row in seen.rows]


def datas(sink: list[Seen]) -> list[bytes]:
    return [bytes(row[5]) for row in rows_of(sink)]


def keys(rows: list[tuple[Any, ...]]) -> Counter[tuple[str, str, str, int]]:
    return Counter((r[0], r[1], r[2], r[3]) for r in rows)


def checkpoint_items(url: str, config: Config, stream: str) -> dict[str, dict[str, Any]]:
    """shard id -> checkpoint item, read straight from the state table."""
    client = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")
    items = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
    )["Items"]
    return {item["sk"]["S"]: item for item in items}


def checkpoints(env: Env) -> dict[str, str | None]:
    """shard id -> checkpointed sequence number."""
    items = checkpoint_items(env.url, env.config, env.stream)
    return {shard: item.get("sequence_number", {}).get("S") for shard, item in items.items()}


# -- the tests ----------------------------------------------------------------------------------
@needs_spark
def test_a_stream_given_by_its_arn_is_read_and_named_as_given(spark: Any, env: Env) -> None:
    """foreach_batch takes a Kinesis stream ARN as every reader does: its rows name the stream
    as given, and a home ARN's checkpoints are the plain name's (one stream, one state key)."""
    create_stream(env.url, env.stream, 1)
    produced = put(env.url, env.stream, 0, 10)
    arn = f"arn:aws:kinesis:us-east-1:123456789012:stream/{env.stream}"  # moto's account
    config = env.config.replace(sts_endpoint=env.url)
    sink: list[Seen] = []
    summary = foreach_batch(spark, config, [arn], recorder(sink), available_now=True)
    assert summary.stopped_by == "drained"
    assert sorted(datas(sink)) == sorted(produced)
    assert {row[0] for row in rows_of(sink)} == {arn}
    assert list(checkpoints(env).values()) == [max((r[2] for r in rows_of(sink)), key=int)]


@needs_spark
def test_batch_has_the_record_schema_and_rows(spark: Any, env: Env) -> None:
    create_stream(env.url, env.stream, 2)
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    produced = put(env.url, env.stream, 0, 40)
    after = datetime.now(timezone.utc) + timedelta(seconds=5)
    sink: list[Seen] = []
    schemas: list[str] = []
    fn = recorder(sink)

    def check_schema(df: Any, batch_id: int, info: BatchInfo) -> None:
        schemas.append(df.schema.simpleString())
        fn(df, batch_id, info)

    summary = foreach_batch(spark, env.config, [env.stream], check_schema, available_now=True)

    assert summary.stopped_by == "drained"
    assert schemas and set(schemas) == {SCHEMA}
    rows = rows_of(sink)
    assert sorted(datas(sink)) == sorted(produced)
    assert summary.records == 40 and summary.batches == len(sink)
    assert [s.batch_id for s in sink] == list(range(len(sink)))
    shard_ids = {
        s["ShardId"] for s in kinesis(env.url).list_shards(StreamName=env.stream)["Shards"]
    }
    for stream, shard_id, sequence, sub, key, data, ts in rows:
        assert stream == env.stream and shard_id in shard_ids
        assert sequence.isdigit() and sub == 0
        assert key == bytes(data).decode()  # put() keys record i with str(i)
        assert before.timestamp() * 1e6 <= ts <= after.timestamp() * 1e6  # UTC instants
    for seen in sink:  # each batch's ranges describe exactly its rows
        assert seen.info.records == len(seen.rows)
        assert seen.info.bytes == sum(len(r[5]) for r in seen.rows)
        for shard_range in seen.info.ranges:
            mine = [r for r in seen.rows if r[1] == shard_range.shard_id]
            positions = sorted((int(r[2]), r[3]) for r in mine)
            assert shard_range.count == len(mine)
            assert (int(shard_range.first_sequence_number), 0) == positions[0]
            assert (int(shard_range.last_sequence_number), 0) == positions[-1]
            assert all(shard_range.contains(r[2], r[3]) for r in mine)
    # The run's last positions are what was checkpointed.
    last = {shard: seq for (_, shard), (seq, _) in summary.last_sequence_numbers.items()}
    assert {k: v for k, v in checkpoints(env).items() if v is not None} == last
    assert sum(r.count for r in summary.shards) == 40


@needs_spark
def test_checkpoints_are_written_only_after_fn_returns(spark: Any, env: Env) -> None:
    create_stream(env.url, env.stream, 1)
    put(env.url, env.stream, 0, 30)
    during: list[str | None] = []
    ranges: list[BatchInfo] = []

    def fn(df: Any, batch_id: int, info: BatchInfo) -> None:
        (shard_range,) = info.ranges
        during.append(checkpoints(env).get(shard_range.shard_id))
        ranges.append(info)

    summary = foreach_batch(spark, env.config, [env.stream], fn, max_records=10, available_now=True)
    assert [i.records for i in ranges] == [10, 10, 10]
    lasts = [i.ranges[0].last_sequence_number for i in ranges]
    # While batch k runs, the checkpoint is where batch k-1 ended: never inside batch k.
    assert during == [None, lasts[0], lasts[1]]
    assert list(checkpoints(env).values()) == [lasts[2]]
    assert summary.records == 30


class Boom(Exception):
    pass


@needs_spark
def test_a_failing_batch_is_delivered_again_after_restart(spark: Any, env: Env) -> None:
    create_stream(env.url, env.stream, 1)
    produced = put(env.url, env.stream, 0, 30)
    first: list[Seen] = []
    record = recorder(first)

    def fail_second(df: Any, batch_id: int, info: BatchInfo) -> None:
        record(df, batch_id, info)
        if batch_id == 1:
            raise Boom("the sink failed")

    started = time.monotonic()
    with pytest.raises(Boom):
        foreach_batch(spark, env.config, [env.stream], fail_second, max_records=10)
    # The uncommitted batch does not hold the close up for handoff_timeout (30 s here).
    assert time.monotonic() - started < 20
    assert datas(first) == produced[:20]
    assert list(checkpoints(env).values()) == [first[0].info.ranges[0].last_sequence_number]

    again: list[Seen] = []
    summary = foreach_batch(spark, env.config, [env.stream], recorder(again), available_now=True)
    # The failed batch comes back whole, after the committed one: nothing lost, nothing skipped.
    assert datas(again) == produced[10:]
    assert rows_of(again)[:10] == first[1].rows
    assert summary.records == 20


@needs_spark
def test_two_drivers_split_the_shards_without_duplicates(spark: Any, env: Env) -> None:
    create_stream(env.url, env.stream, 4)
    lock = threading.Lock()
    sinks: dict[str, list[Seen]] = {"a": [], "b": []}
    stops = {name: threading.Event() for name in sinks}
    results: dict[str, RunSummary | BaseException] = {}
    revoked: dict[str, list[tuple[str, str]]] = {name: [] for name in sinks}

    def drive(name: str) -> None:
        try:
            results[name] = foreach_batch(
                spark,
                env.config.replace(client_id=f"driver-{name}"),
                [env.stream],
                recorder(sinks[name], lock),
                max_records=25,
                max_interval=0.3,
                stop=stops[name],
                on_revoked=revoked[name].extend,
            )
        except BaseException as exc:
            results[name] = exc

    def received() -> list[tuple[Any, ...]]:
        with lock:
            return rows_of(sinks["a"]) + rows_of(sinks["b"])

    threads = {name: threading.Thread(target=drive, args=(name,)) for name in sinks}
    produced: list[bytes] = []
    threads["a"].start()
    for round_ in range(40):
        produced += put(env.url, env.stream, len(produced), 40)
        target = len(produced)
        wait_until(lambda t=target: len(received()) >= t, what=f"round {round_}")
        if round_ == 1:
            threads["b"].start()
        with lock:
            b_shards = {r[1] for r in rows_of(sinks["b"])}
        if len(b_shards) == 2 and round_ >= 4:
            break
    for name in sinks:
        stops[name].set()
    for thread in threads.values():
        thread.join(30)
    assert all(isinstance(results[n], RunSummary) for n in sinks), results

    rows = received()
    assert sorted(bytes(r[5]) for r in rows) == sorted(produced)  # nothing lost
    assert [k for k, n in keys(rows).items() if n > 1] == []  # no duplicate, also on handoff
    a_shards = {r[1] for r in rows_of(sinks["a"])}
    assert len(a_shards | b_shards) == 4 and len(b_shards) == 2
    assert b_shards <= {shard for _, shard in revoked["a"]}  # A's rebalance hook heard of it
    # A handoff hands over a prefix/suffix: on each of B's shards, A read only records before
    # B's first one (A's in-flight batch was committed before the shard was released).
    for shard in b_shards:
        a_seqs = [int(r[2]) for r in rows_of(sinks["a"]) if r[1] == shard]
        b_seqs = [int(r[2]) for r in rows_of(sinks["b"]) if r[1] == shard]
        assert not a_seqs or max(a_seqs) < min(b_seqs)


@needs_spark
def test_available_now_with_two_drivers_drains_once(spark: Any, env: Env) -> None:
    """The second driver owns nothing when it starts: it waits for its claims instead of
    returning at once, and the two together process every record exactly once."""
    create_stream(env.url, env.stream, 4)
    produced = put(env.url, env.stream, 0, 200)
    lock = threading.Lock()
    sinks: dict[str, list[Seen]] = {"a": [], "b": []}
    results: dict[str, RunSummary | BaseException] = {}

    def drive(name: str) -> None:
        try:
            results[name] = foreach_batch(
                spark,
                env.config.replace(client_id=f"now-{name}"),
                [env.stream],
                recorder(sinks[name], lock),
                max_records=20,
                available_now=True,
            )
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=drive, args=(name,)) for name in sinks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    summaries = [results[n] for n in sinks]
    assert all(isinstance(s, RunSummary) and s.stopped_by == "drained" for s in summaries), results
    rows = rows_of(sinks["a"]) + rows_of(sinks["b"])
    assert sorted(bytes(r[5]) for r in rows) == sorted(produced)
    assert [k for k, n in keys(rows).items() if n > 1] == []


@needs_spark
def test_available_now_reads_children_after_a_split(
    spark: Any, kinesalite: Any, dynalite: Any, unique_name: Names
) -> None:
    """kinesalite reports SHARD_END (moto never does): the parent is read to its end and
    finished, then its children (claimed a tick later) are drained before the run returns."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    produced = put(kinesalite.url, stream, 0, 30)
    client = kinesis(kinesalite.url)
    (parent,) = client.list_shards(StreamName=stream)["Shards"]
    low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    produced += put(kinesalite.url, stream, 30, 30)
    sink: list[Seen] = []
    summary = foreach_batch(spark, config, [stream], recorder(sink), available_now=True)
    assert summary.stopped_by == "drained"
    assert sorted(datas(sink)) == sorted(produced)
    assert [k for k, n in keys(rows_of(sink)).items() if n > 1] == []
    assert len(summary.shards) == 3  # the parent and both children
    assert all(len(r[2]) >= 50 for r in rows_of(sink))  # kinesalite's 56-digit numbers
    items = checkpoint_items(dynalite.url, config, stream)
    assert items[parent["ShardId"]]["finished"] == {"BOOL": True}
    # Per shard, rows come in sequence order, and the parent's before any child's.
    order = [r[1] for r in rows_of(sink)]
    assert order.index(parent["ShardId"]) == 0
    assert max(i for i, s in enumerate(order) if s == parent["ShardId"]) < min(
        i for i, s in enumerate(order) if s != parent["ShardId"]
    )


@needs_spark
def test_batches_respect_max_records_and_max_bytes(spark: Any, env: Env) -> None:
    create_stream(env.url, env.stream, 1)
    put(env.url, env.stream, 0, 25)
    sizes: list[int] = []
    foreach_batch(
        spark,
        env.config,
        [env.stream],
        lambda df, batch_id: sizes.append(len(df.collect())),
        max_records=7,
        available_now=True,
    )
    assert sizes == [7, 7, 7, 4]

    client = kinesis(env.url)
    client.put_records(
        StreamName=env.stream,
        Records=[{"Data": b"%03d" % i + b"x" * 97, "PartitionKey": "k"} for i in range(30)],
    )
    batches: list[BatchInfo] = []
    foreach_batch(
        spark,
        env.config,
        [env.stream],
        lambda df, batch_id, info: batches.append(info),
        max_bytes=450,
        available_now=True,
    )
    assert sum(b.records for b in batches) == 30
    # A batch closes once it reaches max_bytes; polls are sized so it passes by one record at most.
    assert all(b.bytes <= 450 + 100 for b in batches)
    assert all(b.bytes >= 450 for b in batches[:-1])


@needs_spark
def test_batches_close_after_max_interval(spark: Any, env: Env) -> None:
    """Records trickle in (each batch's fn writes the next few): every batch closes at most
    ``max_interval`` after its first record, long before ``max_records``."""
    create_stream(env.url, env.stream, 1)
    put(env.url, env.stream, 0, 3)
    stop = threading.Event()
    batches: list[BatchInfo] = []
    started: list[float] = []

    def fn(df: Any, batch_id: int, info: BatchInfo) -> None:
        batches.append(info)
        started.append(time.monotonic())
        if batch_id < 3:
            put(env.url, env.stream, 100 * (batch_id + 1), 3)
        else:
            stop.set()

    summary = foreach_batch(
        spark, env.config, [env.stream], fn, max_records=10_000, max_interval=0.4, stop=stop
    )
    assert summary.stopped_by == "stop" and summary.batches == 4
    assert all(0 < b.records < 10_000 for b in batches)
    assert all(b.collect_seconds <= 0.4 + 0.1 for b in batches)


@needs_spark
def test_sigterm_stops_after_the_current_batch(spark: Any, env: Env) -> None:
    assert threading.current_thread() is threading.main_thread()
    create_stream(env.url, env.stream, 1)
    put(env.url, env.stream, 0, 20)
    before = signal.getsignal(signal.SIGTERM)
    seen: list[int] = []

    def fn(df: Any, batch_id: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered while fn runs: the batch still commits
        seen.append(len(df.collect()))

    summary = foreach_batch(spark, env.config, [env.stream], fn, max_records=5)
    assert summary.stopped_by == "signal:SIGTERM"
    assert seen == [5] and summary.records == 5
    assert signal.getsignal(signal.SIGTERM) is before
    assert list(checkpoints(env).values()) == [summary.shards[0].last_sequence_number]


@needs_spark
def test_arguments_are_checked_before_connecting(spark: Any) -> None:
    config = Config(app="a", dynamodb_table="tbl", region="us-east-1")
    with pytest.raises(TypeError, match="df, batch_id"):
        foreach_batch(spark, config, ["s"], lambda df: None)
    with pytest.raises(ValueError, match="max_records"):
        foreach_batch(spark, config, ["s"], lambda df, i: None, max_records=0)
    with pytest.raises(ValueError, match="max_interval"):
        foreach_batch(spark, config, ["s"], lambda df, i: None, max_interval=float("nan"))
    assert records_to_arrow([]).num_rows == 0


@needs_spark
def test_arrow_schema_is_what_spark_expects_for_the_columns(spark: Any) -> None:
    """A Python data source's Arrow batches must equal Spark's Arrow form of its schema exactly
    (nullability included): a source declaring SCHEMA_DDL yields records_to_batches(), and
    foreach_batch builds its DataFrames from the same tables."""
    from pyspark.sql.pandas.types import to_arrow_schema

    assert SPARK_COLUMNS == COLUMNS == Record._fields == tuple(name for name, _, _ in FIELDS)
    assert to_arrow_schema(spark_schema(), timezone="UTC").equals(arrow_schema())
    assert spark.createDataFrame([], SCHEMA_DDL).schema == spark_schema()
    assert spark_schema().simpleString() == SCHEMA
    assert (
        str(arrow_schema().field("approximate_arrival_timestamp").type) == "timestamp[us, tz=UTC]"
    )
    record = Record("s", "shardId-0", "1" * 56, 3, "k", b"\x00x", datetime.now(timezone.utc))
    assert records_to_arrow([record]).schema.equals(arrow_schema())
    assert records_to_arrow([record]).to_pylist()[0]["sequence_number"] == "1" * 56
    batches = list(records_to_batches([record] * 5, rows=2))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert all(b.schema.equals(arrow_schema()) for b in batches)
    assert list(records_to_batches([])) == []


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pyspark (or pyarrow) the module still imports; using it says what to install."""
    config = Config(app="a", dynamodb_table="tbl", region="us-east-1")
    for missing in ("pyspark", "pyarrow"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, missing, None)  # makes `import <missing>` fail
            patch.setitem(sys.modules, f"{missing}.sql", None)
            with pytest.raises(SparkNotInstalledError) as caught:
                foreach_batch(None, config, ["s"], lambda df, i: None)  # type: ignore[arg-type]
        assert "pip install 'kinesumer[spark]'" in str(caught.value)
        assert missing in str(caught.value)
        assert isinstance(caught.value, ImportError) and isinstance(caught.value, KinesumerError)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["spark_parquet.py", "spark_foreach_batch.py"])
def test_parquet_examples_run_end_to_end(tmp_path: Any, example: str) -> None:
    """The Parquet examples (the streaming source; foreach_batch), as a user runs them: their
    own moto and Spark, Parquet out, a second run finding nothing new. Its length (20-35 s) is
    the example's own: a Spark session and moto started, two runs, as a user would see it."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / example),
            str(tmp_path / "out"),
            "--records",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run 2: 0 new records" in result.stdout
    assert "wrote 300 rows (300 unique)" in result.stdout
    assert list((tmp_path / "out").rglob("*.parquet"))
