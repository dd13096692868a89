"""Shared by the read-ahead and GetRecords-limit tests of the Spark source (no Spark): a 1-shard
stream with its state table on kinesalite + dynalite, plain records put into it, the
read-ahead files left under a root, and a wait for a worker's background read-ahead."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from _group import create_stream, make_config, setup_table
from botocore.session import get_session


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


def data_files(root: Path) -> list[Path]:
    """The read-ahead files left under ``root`` (none if it was never made)."""
    return sorted(root.rglob("*.data")) if root.exists() else []


async def background_done() -> None:
    """Wait for a worker's background read-ahead: every other task on its loop."""
    current = asyncio.current_task()
    await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not current))
