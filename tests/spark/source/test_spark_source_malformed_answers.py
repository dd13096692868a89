"""The Spark executors' shard read against a GetRecords answer that is not Kinesis's: a batch
never records SHARD_END for an open shard (the planner would finish the shard and read on in
its children, leaving the rest unread for good), neither in a task's own read nor in the
read-ahead a task leaves behind.

No Spark: an executor worker's long-lived loop (:class:`support.read_ahead.Worker`) reads partitions
as a task does (:func:`~kinesumer.spark.source.executor.read.read_with`), on kinesalite + dynalite,
Kinesis through the fault proxy, which answers one GetRecords mid-read with a gateway's page
(or with a well-formed "end" of the open shard). A partition starts after a record, as every
batch after a query's first does (the default ``LATEST`` start is planned by the driver).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream, make_config, setup_table
from support.read_ahead import Worker, kinesis_client, put_plain

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.models import Position
from kinesumer.spark.source.ledger import Ledger, LedgerEntry
from kinesumer.spark.source.offsets import Start
from kinesumer.spark.source.partition import ShardPartition
from kinesumer.statestore.dynamodb import DynamoDBStateStore

pytest.importorskip("pyarrow")

SHARD = "shardId-000000000000"
PAGES = {
    "html": Fault.answer(b"<html>gateway</html>"),
    "empty-json": Fault.answer(b"{}", "application/x-amz-json-1.1"),
    "end-of-an-open-shard": Fault.answer(
        b'{"Records": [], "MillisBehindLatest": 0}', "application/x-amz-json-1.1"
    ),
}


@pytest.fixture
def setup(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
    tmp_path: Path,
) -> Iterator[dict[str, Any]]:
    """A 1-shard stream holding a first record (where the partitions start after) and 100
    more; a worker whose Kinesis calls go through the proxy; 25 records per GetRecords."""
    proxy = fault_proxy(kinesalite.url)
    config = make_config(
        proxy.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
        scan_limit=25,
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    first = kinesis_client(kinesalite.url).put_record(
        StreamName=stream, Data=b"first", PartitionKey="k"
    )["SequenceNumber"]
    made = {"config": config, "stream": stream, "url": kinesalite.url}
    produced = put_plain(made, 100)
    worker = Worker(config, tmp_path / "read-ahead")
    try:
        yield made | {"proxy": proxy, "first": first, "produced": produced, "worker": worker}
    finally:
        worker.close()


def partition(setup: dict[str, Any], batch: int, after: str, read_ahead: bool) -> ShardPartition:
    return ShardPartition(
        config=setup["config"],
        query="q",
        batch=batch,
        stream=setup["stream"],
        shard_id=SHARD,
        start=Start(after=Position(after, 0)),
        limit=50 if read_ahead else 100,
        owner="solo-1",
        max_read_seconds=30.0,
        ledger_ttl=3600,
        read_ahead=read_ahead,
    )


def ledger_entry(setup: dict[str, Any], batch: int) -> LedgerEntry | None:
    config = setup["config"]

    async def get() -> LedgerEntry | None:
        clients = AwsClients(config, RequestStats())
        await clients.open()
        try:
            store = DynamoDBStateStore(
                clients.dynamodb, config.dynamodb_table, config.app, RequestStats()
            )
            ledger = Ledger(store, "q", 3600)
            return await ledger.get(batch, setup["stream"], SHARD)
        finally:
            await clients.close()

    return asyncio.run(get())


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_task_read_through_a_page_records_no_shard_end(setup: dict[str, Any], page: str) -> None:
    """The page answers the task's second GetRecords: the batch still holds all 100 records
    and its ledger item no SHARD_END."""
    rule = setup["proxy"].add_rule(
        PAGES[page], service="kinesis", operation="GetRecords", skip=1, count=1
    )
    got = setup["worker"].read(partition(setup, 1, setup["first"], read_ahead=False))
    assert rule.fired == 1
    assert [r.data for r in got] == setup["produced"]
    entry = ledger_entry(setup, 1)
    assert entry is not None and not entry.shard_end and entry.count == 100


def test_a_read_ahead_through_a_page_records_no_shard_end(setup: dict[str, Any]) -> None:
    """Batch 1 takes 50 records (three GetRecords: the first repeats the start record), then
    reads the next 50 ahead in the background from where it ended; the page answers the
    read-ahead's second GetRecords. Batch 2, taken from the read-ahead, holds those 50 records
    and no SHARD_END."""
    worker, produced = setup["worker"], setup["produced"]
    rule = setup["proxy"].add_rule(
        PAGES["html"], service="kinesis", operation="GetRecords", skip=4, count=1
    )
    first = worker.read(partition(setup, 1, setup["first"], read_ahead=True))
    assert [r.data for r in first] == produced[:50]
    worker.settle()  # the read-ahead has ended
    assert rule.fired == 1
    second = worker.read(partition(setup, 2, first[-1].sequence_number, read_ahead=True))
    assert [r.data for r in second] == produced[50:]
    entry = ledger_entry(setup, 2)
    assert entry is not None and not entry.shard_end and entry.count == 50
