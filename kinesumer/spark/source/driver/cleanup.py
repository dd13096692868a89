"""Removing what a query's own consumer group left in the state table once its checkpoint
folder is gone for good (:mod:`.groups`: a new folder is a new group; the old one's items stay).

What a per-query group ``<app>.spark-<query>`` holds, and what bounds it without this module:

- its client item: deleted at a graceful leave, else expired by its TTL;
- its ledger items (``spark_ledger#<app>#<query>``): TTL ``ledger_ttl_seconds``;
- the shard-list cache and the leader's publications: small, a handful of items;
- one checkpoint item per shard it read, and at most one ``LATEST`` pin per shard: no TTL (a
  query down for a week must still resume), about 200 bytes each.

:func:`forget_query` deletes all of them, after making sure no member of the group is alive:
it reads the group's client items twice, ``client_timeout`` apart (also when there are none:
the query may be joining), and refuses if any heartbeat or join landed in between (judged by
the items changing, never by comparing clocks). A query started after that second look is not
seen: run it only for a checkpoint folder that is gone for good.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path

from ....aws import AwsClients, RequestStats
from ....config import Config
from ....errors import ConfigError
from ....statestore.dynamodb import DynamoDBStateStore
from ....statestore.spark import SparkSourceStore
from .groups import group_of


def query_of_checkpoint(checkpoint: str | Path) -> str:
    """The ledger id in a (local) checkpoint folder: the ``query`` of the kinesumer offset in
    its newest offsets file (Spark deletes all but the last ``minBatchesToRetain``, 100 by
    default, so ``offsets/0`` is gone once a query ran longer). :class:`ConfigError` if none."""
    folder = Path(checkpoint) / "offsets"
    try:
        newest = max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=None)
        if newest is None:
            raise OSError("no offsets file")
        offsets = folder / str(newest)
        lines = offsets.read_text().splitlines()
    except OSError as exc:
        raise ConfigError("checkpoint", f"has no offsets in {folder}: {exc}") from None
    for line in lines[1:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("v") == 1 and "query" in value:
            return str(value["query"])
    raise ConfigError("checkpoint", f"{offsets} holds no kinesumer source offset")


def forget_query(config: Config, streams: Iterable[str], query: str) -> int:
    """Delete the state of the per-query group of ledger id ``query`` (see the module
    docstring; :func:`query_of_checkpoint` finds the id in a checkpoint folder). ``config``: the
    source's (its ``app``, table and endpoints); ``streams``: those the query read. Refuses with
    :class:`ConfigError` while a member of the group heartbeats. Returns the items deleted."""
    return asyncio.run(_forget(config, tuple(streams), query))


async def _forget(config: Config, streams: tuple[str, ...], query: str) -> int:
    clients = AwsClients(config, RequestStats())
    await clients.open()
    try:
        group = group_of(config.app, query, shared=False)
        table, stats = config.dynamodb_table, RequestStats()
        group_store = DynamoDBStateStore(clients.dynamodb, table, group, stats)
        app_store = DynamoDBStateStore(clients.dynamodb, table, config.app, stats)
        return await forget_with(
            group_store, app_store, group, streams, query, config.client_timeout
        )
    finally:
        await clients.close()


async def forget_with(
    group_store: SparkSourceStore,
    app_store: SparkSourceStore,
    group: str,
    streams: tuple[str, ...],
    query: str,
    client_timeout: float,
) -> int:
    """:func:`forget_query` on the stores of the query's group and of the source's app."""
    # Looked at even when no member is registered: the query may be joining right now.
    before = await group_store.client_marks()
    await asyncio.sleep(client_timeout)
    after = await group_store.client_marks()
    if after - before:
        raise ConfigError(
            "query",
            f"{query}: group {group} has a live member (a heartbeat or a join landed "
            "while looking): stop the query first",
        )
    return await group_store.forget_group(streams) + await app_store.forget_ledger(query)
