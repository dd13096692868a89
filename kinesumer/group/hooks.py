"""Rebalance hooks: the application hears which shards it gains and loses.

``on_assigned(shards)`` runs after new shards are claimed, before their first record is
delivered; ``on_revoked(shards)`` runs during a graceful handoff after the record in the
application's hands is finished and *before* the checkpoint is released, so the application can
flush its own per-shard state first. For a shard lost without a handoff (taken over while this
member was cut off) ``on_revoked`` runs after the fact. Each gets a list of ``(stream,
shard_id)``. A hook may be a plain function or a coroutine function; it runs on the engine's
event loop (for :class:`~kinesumer.Kinesumer`, the engine's background thread), so keep it short
and thread-safe. An exception in a hook stops the consumer (FAILED) and is raised to the
application, never stranding a shard: ``on_revoked``'s after the handoff's release;
``on_assigned``'s after the shards just claimed were released unread and the member left the
group (:meth:`~.leasing.Leasing.claim_pending`), so the others take its shards at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

ShardKey = tuple[str, str]
Hook = Callable[[list[ShardKey]], object]


class RebalanceHooks:
    def __init__(self, on_assigned: Hook | None = None, on_revoked: Hook | None = None) -> None:
        for name, hook in (("on_assigned", on_assigned), ("on_revoked", on_revoked)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {hook!r}")
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def assigned(self, shards: Iterable[ShardKey]) -> None:
        await _call(self._on_assigned, shards)

    async def revoked(self, shards: Iterable[ShardKey]) -> None:
        await _call(self._on_revoked, shards)


async def _call(hook: Hook | None, shards: Iterable[ShardKey]) -> None:
    keys = sorted(shards)
    if hook is None or not keys:
        return
    result = hook(keys)
    if inspect.isawaitable(result):
        await result
