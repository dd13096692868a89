"""A stream's shards as the lag probe and the rewind both see them: the state table's view
(:func:`~kinesumer.statestore.group_view.stream_shards`) joined with Kinesis's listing, and how
many of them are probed at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..models import ClientInfo, Shard
from ..statestore.group_view import ShardView, TableReads, stream_shards

#: Shards probed at once (each probe is a few sequential calls).
PROBE_CONCURRENCY = 8


async def stream_views(
    store: TableReads,
    stream: str,
    live: dict[str, ClientInfo],
    listed: list[Shard],
    known: Sequence[ShardView] | None = None,
) -> list[ShardView]:
    """The table's view of ``stream``'s shards (:func:`stream_shards`; ``known``: as read
    already), with the shards Kinesis lists that the table does not know yet, and Kinesis's
    lineage (the shard cache may be a sync behind)."""
    if known is None:
        known = await stream_shards(store, stream, live)
    views = {view.shard_id: view for view in known}
    for shard in listed:
        view = views.get(shard.shard_id)
        if view is None:
            views[shard.shard_id] = ShardView(stream, shard, None, False, None)
        else:
            views[shard.shard_id] = replace(view, shard=shard)
    return [views[shard_id] for shard_id in sorted(views)]
