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
from typing import Any

from ...aws import AwsClients, RequestStats
from ...config import Config
from ...errors import ConfigError
from ...statestore.dynamodb.controls import load_pk
from ...statestore.dynamodb.table import StateTable
from ...statestore.dynamodb.view import view_pk
from ...statestore.schema import PARTITION_KEY, SORT_KEY, checkpoint_pk, client_pk, shard_cache_pk
from .groups import group_of
from .ledger import ledger_pk
from .pins import pins_pk


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


def group_partitions(app: str, query: str, streams: Iterable[str]) -> list[str]:
    """Every partition key of the per-query group of ``query`` (and its ledger)."""
    group = group_of(app, query, shared=False)
    fixed = [client_pk(group), shard_cache_pk(group), pins_pk(group), view_pk(group)]
    fixed += [f"controls#{group}", f"weights#{group}", load_pk(group), ledger_pk(app, query)]
    return fixed + [checkpoint_pk(group, stream) for stream in streams]


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
        table = StateTable(clients.dynamodb, config.dynamodb_table, RequestStats())
        group = group_of(config.app, query, shared=False)
        # Looked at even when no member is registered: the query may be joining right now.
        before = await table.query(client_pk(group))
        await asyncio.sleep(config.client_timeout)
        after = await table.query(client_pk(group))
        if _beats(after) - _beats(before):
            raise ConfigError(
                "query",
                f"{query}: group {group} has a live member (a heartbeat or a join landed "
                "while looking): stop the query first",
            )
        keys: list[dict[str, Any]] = []
        for pk in group_partitions(config.app, query, streams):
            items = await table.query(pk, projection=f"{PARTITION_KEY}, {SORT_KEY}")
            keys += [{PARTITION_KEY: i[PARTITION_KEY], SORT_KEY: i[SORT_KEY]} for i in items]
        await table.delete_many(keys)
        return len(keys)
    finally:
        await clients.close()


def _beats(items: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(i[SORT_KEY]["S"], str(i.get("last_update", {}).get("N"))) for i in items}
