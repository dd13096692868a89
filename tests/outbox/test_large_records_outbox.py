"""The outbox takes rows of up to 10 MiB: the relay writes one to a stream whose maximum record
size was raised, and moves one over its stream's limit to the dead-letter table as
``RecordTooLargeError`` (kinesis-local: the stand-in that knows ``MaxRecordSizeInKiB``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import boto3
import psycopg
import pytest
from support.postgres import PostgresServer, postgres_server
from support.standins import KinesisLocalStandIn
from support.wait import wait_until

from kinesumer import Producer
from kinesumer.errors import FlushError, InvalidRecordError
from kinesumer.outbox import PostgresOutbox

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def _create(url: str, name: str, max_kib: int | None = None) -> None:
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    extra = {} if max_kib is None else {"MaxRecordSizeInKiB": max_kib}
    client.create_stream(StreamName=name, ShardCount=1, **extra)
    client.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )


def _datas(url: str, stream: str) -> list[bytes]:
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    datas: list[bytes] = []
    for _ in range(10):
        answer = client.get_records(ShardIterator=iterator, Limit=1)
        datas.extend(record["Data"] for record in answer["Records"])
        if not answer["Records"]:
            break
        iterator = answer["NextShardIterator"]
    return datas


def test_a_large_row_reaches_a_raised_stream_and_one_over_its_limit_is_moved_aside(
    postgres: PostgresServer,
    kinesis_local: KinesisLocalStandIn,
    unique_name: Callable[[str], str],
) -> None:
    raised, default = unique_name("ob-large"), unique_name("ob-default")
    _create(kinesis_local.url, raised, max_kib=4096)
    _create(kinesis_local.url, default)
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    large = b"L" * (2 * MIB)
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        with pytest.raises(InvalidRecordError, match="10 MiB"):
            outbox.publish(conn, raised, b"x" * (10 * MIB), partition_key="k")
        outbox.publish(conn, raised, large, partition_key="k")
        outbox.publish(conn, raised, b"after", partition_key="k")
        outbox.publish(conn, default, large, partition_key="big", record_id="r-big")
        outbox.publish(conn, default, b"next", partition_key="big")
    stop = threading.Event()
    errors: list[BaseException] = []

    def relay() -> None:
        try:
            producer = Producer(kinesis_endpoint=kinesis_local.url, region="us-east-1")
            try:
                outbox.relay(producer, stop=stop, poll_interval=0.2)
            finally:
                with contextlib.suppress(FlushError):
                    producer.close()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: not errors and outbox.stats().pending == 0,
            timeout=60,
            what="the relay to empty the outbox",
        )
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert _datas(kinesis_local.url, raised) == [large, b"after"]
    assert _datas(kinesis_local.url, default) == [b"next"]
    with psycopg.connect(postgres.conninfo) as conn:
        row = conn.execute(f"SELECT record_id, error FROM {outbox.table}_dead").fetchone()
    assert row is not None and row[0] == "r-big" and "RecordTooLargeError" in row[1]
    assert "1048576" in row[1]
