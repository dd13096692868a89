"""The engine: one asyncio engine behind every face (internal; not a public API).

One room per job, meeting in the shared lease table (``leases``):

- ``member``: a group member's wiring and lifecycle (join, change streams, leave), whoever reads;
  ``engine``: the member that reads its shards itself (fetchers, buffer, delivery);
  ``external``: the member whose records are read elsewhere (Spark executors).
- ``lifecycle``: the engine's state, one enum; ``supervisor``: background tasks, failures
  surfaced to the caller, the watchdog; ``loop_thread``: an event loop for blocking callers.
- ``coordinator``: the tick, in phases: ``membership`` (live members, leader, the fence),
  ``shard_sync`` (shard lists and lineage), ``leasing`` (claims and handoffs).
- ``leases``: the lease and its lifecycle; ``buffer``: the bounded record buffer; ``fetcher``:
  GetRecords per shard; ``delivery``: the cursor's one admission check; ``checkpointer``: fenced
  writes; ``heartbeat``: liveness on its own thread; ``hooks``: the application's rebalance hooks.
- ``efo_fetcher``, ``efo_session``: enhanced fan-out (the fetcher's twin over SubscribeToShard;
  consumer registration before any claim); ``controls``: operator controls and load reports.
- ``broadcast``, ``broadcast_plan``, ``broadcast_checkpointer``: broadcast mode (every member reads
  every shard, outside any group), reusing the engine's reading and delivery.
"""

import typing as _typing

from .. import lazy_imports as _lazy_imports

if _typing.TYPE_CHECKING:
    from .engine import Engine

# Bound on first use (kinesumer.lazy_imports): a Spark executor needs ``loop_thread`` only, and
# importing it runs this file; the Engine brings the fetchers, leasing and the state store.
#: The lazily bound names, each with the module that defines it (relative to this package).
_LAZY_NAMES = {"Engine": ".engine"}

if not _typing.TYPE_CHECKING:  # so that a misspelt name stays a type error
    __getattr__ = _lazy_imports.module_getattr(__name__, _LAZY_NAMES)
__dir__ = _lazy_imports.module_dir(__name__, _LAZY_NAMES)

__all__ = ["Engine"]
