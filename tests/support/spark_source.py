"""Helpers for the streaming source's Spark tests: a local session, a collecting foreachBatch,
queries started from a Config, and reads of the group's checkpoints."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3

from kinesumer import Config
from kinesumer.spark import KinesumerDataSource
from kinesumer.spark.source import option_strings
from kinesumer.statestore.schema import PARTITION_KEY, SORT_KEY
from support.group import make_config, setup_table


@contextlib.contextmanager
def local_spark(master: str = "local[2,4]", app: str = "kinesumer-source-tests") -> Iterator[Any]:
    """A local session, the source registered. ``local[2,4]``: two cores, and a failed task is
    retried (up to 4 attempts), as on a cluster. Workers run this interpreter; loopback only, no
    UI."""
    import os

    names = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
    saved = {k: os.environ.get(k) for k in names}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(KinesumerDataSource)
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class Collector:
    """A foreachBatch function keeping every row with its batch id; ``fail_on`` makes the batch
    with that id raise after its rows were noted (in ``failed``)."""

    fail_on: int | None = None
    batches: list[tuple[int, list[tuple[Any, ...]]]] = field(default_factory=list)
    failed: list[tuple[Any, ...]] = field(default_factory=list)
    dtypes: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in df.collect()]
        with self.lock:
            self.dtypes = list(df.dtypes)
            if batch_id == self.fail_on:
                self.failed = rows
                raise RuntimeError(f"sink failed on batch {batch_id}")
            self.batches.append((batch_id, rows))

    def rows(self) -> list[tuple[Any, ...]]:
        with self.lock:
            return [row for _, rows in self.batches for row in rows]

    def datas(self) -> list[bytes]:
        return [bytes(r[5]) for r in self.rows()]


def start_query(
    spark: Any,
    config: Config,
    streams: list[str],
    sink: Any,
    checkpoint: str,
    *,
    available_now: bool = False,
    **source: Any,
) -> Any:
    frame = (
        spark.readStream.format("kinesumer")
        .options(**option_strings(config, streams, **source))
        .load()
    )
    writer = frame.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def run_to_end(query: Any, timeout: float = 300) -> None:
    """Wait for an availableNow ``query`` to end (its error raised), stopping it if it did not."""
    try:
        query.awaitTermination(timeout)
    finally:
        if query.isActive:
            query.stop()


def checkpoints(config: Config, stream: str) -> dict[str, dict[str, Any]]:
    """The group's checkpoint items of ``stream``, by shard id."""
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    )
    items = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
        ConsistentRead=True,
    )["Items"]
    return {i["sk"]["S"]: i for i in items}


def query_group(config: Config, checkpoint: str) -> Config:
    """``config`` with the app of the group the query of ``checkpoint`` (a checkpoint folder)
    joined: ``<app>.spark-<ledger id>`` by default
    (kinesumer.spark.source.driver.groups), the ledger
    id read from the first offset Spark wrote there."""
    import json
    from pathlib import Path

    from kinesumer.spark.source.driver.groups import group_of

    lines = (Path(checkpoint) / "offsets" / "0").read_text().splitlines()
    return config.replace(app=group_of(config.app, json.loads(lines[-1])["query"], False))


def members(config: Config) -> list[str]:
    """The client ids registered in ``config.app``'s group."""
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    )
    items = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"client#{config.app}"}},
        ConsistentRead=True,
    )["Items"]
    return [i["sk"]["S"] for i in items]


def spark_group(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    """A fresh app, state table and stream name on the stand-ins, with timings for Spark: a
    generous handoff (a Spark batch must fit in it) and a long client_timeout (the JVM and its
    workers starting next to the members must not make one look dead)."""
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        handoff_timeout=30.0,
        client_timeout=6.0,
        heartbeat_interval=0.5,
    )
    setup_table(config)
    return {"config": config, "url": kinesalite.url, "stream": unique_name("s")}


class FirstLedgerWritesRefused:
    """Every task's first ledger write lands in the state table and is then answered with an
    access-denied error (a fault proxy in front of dynalite): the task fails right after its
    write, as a worker killed between the write and its rows would, and Spark runs it again.

    ``config``: the group's config with its DynamoDB endpoint moved to the proxy. The proxy keeps
    the requests, so :meth:`looked_up_first` can tell which attempts read their ledger item
    before writing it."""

    def __init__(self, config: Config) -> None:
        import dataclasses

        from support.faultproxy import Fault, FaultProxy

        assert config.dynamodb_endpoint is not None
        self.proxy = FaultProxy(config.dynamodb_endpoint)
        self.config = dataclasses.replace(config, dynamodb_endpoint=self.proxy.url)
        self._written: set[str] = set()
        self.proxy.keep_requests()
        self.rule = self.proxy.add_rule(
            Fault.landed_then_refused(),
            service="dynamodb",
            operation="PutItem",
            when=self._first_write_of_a_ledger_item,
        )

    def _first_write_of_a_ledger_item(self, body: bytes) -> bool:
        key = ledger_item_of(body)
        if key is None or key in self._written:
            return False
        self._written.add(key)
        return True

    def looked_up_first(self) -> dict[str, bool]:
        """Each ledger item written, and whether a GetItem of it came before its first write
        (the attempt that wrote it looked first)."""
        looked: dict[str, bool] = {}
        read: set[str] = set()
        for op, body in self.proxy.kept_requests():
            key = ledger_item_of(body)
            if key is None:
                continue
            if op.operation == "GetItem":
                read.add(key)
            elif op.operation == "PutItem" and key not in looked:
                looked[key] = key in read
        return looked

    def stop(self) -> None:
        self.proxy.stop()


def ledger_item_of(body: bytes) -> str | None:
    """The sort key of the Spark ledger item a DynamoDB request names (as Item or Key), if any."""
    import json

    if b"spark_ledger#" not in body:
        return None
    request = json.loads(body)
    item = request.get("Item") or request.get("Key") or {}
    if not str(item.get(PARTITION_KEY, {}).get("S", "")).startswith("spark_ledger#"):
        return None
    return str(item[SORT_KEY]["S"])
