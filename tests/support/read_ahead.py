"""Shared by the read-ahead and GetRecords-limit tests of the Spark source (no Spark): a 1-shard
stream with its state table on kinesalite + dynalite, plain records put into it, the
read-ahead files left under a root, an executor worker's long-lived loop (where read-ahead runs
after a task returns) and a wait for it, and which tasks found a read-ahead."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from botocore.session import get_session

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.kinesis.kpl_aggregate import Aggregate
from kinesumer.models import Record
from kinesumer.runtime.loop_thread import LoopThread
from kinesumer.spark.arrow import table_to_records
from kinesumer.spark.source.executor.read import read_with
from kinesumer.spark.source.executor.readahead import ReadAheadBatch, ReadAheadFiles
from kinesumer.spark.source.partition import ShardPartition
from support.group import create_stream, make_config, setup_table


def one_shard_stream(
    kinesalite: Any, dynalite: Any, unique_name: Any, **config: Any
) -> dict[str, Any]:
    """A 1-shard stream and a Config (``config`` overrides) whose state table exists."""
    made = make_config(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"), **config
    )
    setup_table(made)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    return {"config": made, "stream": stream, "url": kinesalite.url}


def kinesis_client(url: str) -> Any:
    return get_session().create_client(
        "kinesis",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )


def put_plain(setup: dict[str, Any], count: int) -> list[bytes]:
    """``count`` records ``plain-<n>`` in one PutRecords; their data, in order."""
    datas = [f"plain-{i}".encode() for i in range(count)]
    kinesis_client(setup["url"]).put_records(
        StreamName=setup["stream"], Records=[{"Data": d, "PartitionKey": "k"} for d in datas]
    )
    return datas


def put_aggregates(setup: dict[str, Any], aggregates: int, per: int) -> list[bytes]:
    """``aggregates`` KPL aggregates of ``per`` user records ``agg-<a>-<i>``; their data."""
    datas: list[bytes] = []
    client = kinesis_client(setup["url"])
    for a in range(aggregates):
        packed = Aggregate()
        for i in range(per):
            datas.append(f"agg-{a}-{i}".encode())
            packed.add(datas[-1], f"k{i}")
        client.put_record(
            StreamName=setup["stream"], Data=packed.encode(), PartitionKey=packed.first_key or "k"
        )
    return datas


def data_files(root: Path) -> list[Path]:
    """The read-ahead files left under ``root`` (none if it was never made)."""
    return sorted(root.rglob("*.data")) if root.exists() else []


async def background_done() -> None:
    """Wait for a worker's background read-ahead: every other task on its loop."""
    current = asyncio.current_task()
    await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not current))


class Worker:
    """An executor Python worker's long-lived loop and clients, as in Spark (the read-ahead runs
    on the loop after a task returns), with read-ahead files under ``root``."""

    def __init__(self, config: Any, root: Path, name: str = "test-worker") -> None:
        self.loop = LoopThread(name)
        self.stats = RequestStats()
        self.clients = AwsClients(config, self.stats)
        self.loop.run(self.clients.open())
        self.root = root

    def read(self, p: ShardPartition) -> list[Record]:
        """``p``'s task, as an executor runs it (its read-ahead goes on in the background)."""
        files = ReadAheadFiles(self.root, p.config.app, p.query)
        return table_to_records(self.loop.run(read_with(self.clients, self.stats, p, files)))

    def settle(self) -> None:
        """Wait until the read-ahead this worker started has ended."""
        self.loop.run(background_done())

    def close(self) -> None:
        self.loop.run(self.clients.close())
        self.loop.stop()


@contextmanager
def recording_takes() -> Iterator[list[bool]]:
    """Whether each batch was taken from a read-ahead: the caller appends False before each
    batch's task, and a task that finds its read-ahead sets that entry (a task that starts at
    TRIM_HORIZON or LATEST does not look for one)."""
    taken: list[bool] = []
    real = ReadAheadFiles.take

    async def take(self: ReadAheadFiles, *args: Any) -> ReadAheadBatch | None:
        got = await real(self, *args)
        taken[-1] = got is not None
        return got

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReadAheadFiles, "take", take)
        yield taken
