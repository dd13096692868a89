"""A Spark batch ends where its shard is caught up, not at ``max_read_seconds``: under a steady
trickle GetRecords never answers empty, so the executor stops at the first answer that reached
the tip. Checked without Spark (planner, executor read and ledger on kinesalite + dynalite, as
in test_spark_source_units), by the stop reason the ledger records, and a replay of that batch
must still give exactly the recorded records although the producer kept writing. And in Spark:
a query with a 1 s trigger under a steady producer delivers batch after batch while the
producer runs (before, its first batch lasted ``max_read_seconds``), every record once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember
from support.spark_source import Collector, local_spark, spark_group
from support.wait import wait_until

from kinesumer.spark.source.datasource import option_strings
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.ledger import Ledger
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.statestore.dynamodb import DynamoDBStateStore


@pytest.fixture
def setup(kinesalite: Any, dynalite: Any, unique_name: Any) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    return {"config": config, "stream": stream, "url": kinesalite.url}


@pytest.fixture
def trickle(setup: dict[str, Any]) -> Iterator[list[bytes]]:
    """A producer putting a few records every 50 ms until the test ends."""
    stop = threading.Event()
    produced: list[bytes] = []

    def run() -> None:
        n = 0
        while not stop.is_set():
            produced.extend(put(setup["url"], setup["stream"], n, 2))
            n += 2
            stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield produced
    finally:
        stop.set()
        thread.join()


def test_a_steady_trickle_ends_the_read_at_the_tip_and_replays_exactly(
    setup: dict[str, Any], trickle: list[bytes]
) -> None:
    options = SourceOptions(
        config=setup["config"],
        streams=(setup["stream"],),
        max_read_seconds=20.0,
    )
    planner = Planner(options, lambda config: SoloMember(config))  # type: ignore[arg-type,return-value]
    planner.initial_offset()
    try:
        while len(trickle) < 10:
            asyncio.run(asyncio.sleep(0.05))
        end = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
        (partition,) = planner.partitions(end)
        got = asyncio.run(read_records(partition))
        assert got
        entry = asyncio.run(_ledger_entry(partition))
        # The old executor read on until max_read_seconds (20 s): never caught up.
        assert entry.caught_up and not entry.shard_end
        assert entry.count == len(got)
        assert entry.end is not None and entry.end.sequence_number == got[-1].sequence_number
        # A replay (task retry) reads exactly those records, though more arrived since.
        assert asyncio.run(read_records(partition)) == got
        assert len(trickle) > len(got)
    finally:
        planner.close()


async def _ledger_entry(partition: Any) -> Any:
    from kinesumer.aws import AwsClients, RequestStats

    stats = RequestStats()
    clients = AwsClients(partition.config, stats)
    await clients.open()
    try:
        config = partition.config
        store = DynamoDBStateStore(clients.dynamodb, config.dynamodb_table, config.app, stats)
        ledger = Ledger(store, partition.query, partition.ledger_ttl)
        return await ledger.get(partition.batch, partition.stream, partition.shard_id)
    finally:
        await clients.close()


def test_a_query_under_a_steady_producer_gets_batch_after_batch(
    kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Any
) -> None:
    pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")
    group = spark_group(kinesalite, dynalite, unique_name)
    config, stream, url = group["config"], group["stream"], group["url"]
    create_stream(url, stream, 2)
    sink = Collector()
    stop = threading.Event()
    produced: list[bytes] = []

    def run() -> None:
        n = 0
        while not stop.is_set():
            produced.extend(put(url, stream, n, 4))
            n += 4
            stop.wait(0.05)

    producer = threading.Thread(target=run, daemon=True)
    with local_spark() as spark:
        frame = (
            spark.readStream.format("kinesumer")
            .options(**option_strings(config, [stream], max_read_seconds=600))
            .load()
        )
        query = (
            frame.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="1 second")
            .start()
        )
        try:
            producer.start()
            # Before, the first batch read until max_read_seconds (600 s): a trickle never
            # answers empty. Now each task stops at the tip, so batches keep coming.
            wait_until(
                lambda: len([b for b, rows in sink.batches if rows]) >= 3,
                120.0,
                "three batches with rows while the producer runs",
                lambda: f"{len(sink.batches)} batches; {query.exception()} {query.lastProgress}",
            )
            stop.set()
            producer.join()
            wait_until(
                lambda: len(sink.datas()) >= len(produced),
                120.0,
                "every record",
                lambda: f"{len(sink.datas())} of {len(produced)}",
            )
        finally:
            stop.set()
            query.stop()
    assert sorted(sink.datas()) == sorted(produced)  # each record once
