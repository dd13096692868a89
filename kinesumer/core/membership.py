"""Who is alive and who leads, from client items and a time passed in (never read here)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..models import ClientInfo


def live_clients(clients: Iterable[ClientInfo], now_ms: int, timeout_ms: int) -> list[ClientInfo]:
    """Members whose last heartbeat stamp is within ``timeout_ms`` of ``now_ms``, sorted by id.

    For display only (``kinesumer status`` and ``checkpoints list`` show heartbeat ages): it
    compares another host's stamp with ours, so no decision of the group uses it. Members judge
    each other by change on their own clocks (:mod:`kinesumer.core.liveness`), and so do
    ``checkpoints set/reset``.
    """
    alive = {c.client_id: c for c in clients if now_ms - c.last_update_ms <= timeout_ms}
    return [alive[cid] for cid in sorted(alive)]


def stale_clients(clients: Iterable[ClientInfo], now_ms: int, timeout_ms: int) -> list[ClientInfo]:
    """Members whose stamp is past ``timeout_ms`` by ``now_ms``: the complement of
    :func:`live_clients`, for display only as well."""
    return sorted(
        (c for c in clients if now_ms - c.last_update_ms > timeout_ms),
        key=lambda c: c.client_id,
    )


def leader_of(live_ids: Sequence[str]) -> str | None:
    """Index 0 of the sorted live ids, or None when nobody is live."""
    return min(live_ids) if live_ids else None


def is_leader(client_id: str, live_ids: Sequence[str]) -> bool:
    """True only when ``client_id`` is itself live and the lowest live id. A client missing from
    the live list is never the leader, whatever its id."""
    return client_id in live_ids and leader_of(live_ids) == client_id
