"""Whether a shard's owner is live, for a command about to move its checkpoint: the members' rule.

``kinesumer checkpoints set|reset`` refuses a shard a live member owns (unless ``--force``). It
judges the owner as the members judge each other (:mod:`kinesumer.core.liveness`), never by
comparing the owner's heartbeat stamp with this host's clock, and with the group's own
``client_timeout`` (the leader publishes it with the membership view), not a guess:

- no client item (pruned, expired, or it left): not live;
- the leader's published view judged it dead with the token its item still holds: not live;
- otherwise the command watches the item: live as soon as it changes (a heartbeat), not live
  once it has not changed for the group's ``client_timeout`` on this host's clock. That is up
  to ``client_timeout`` of waiting, only for owners the group does not already call dead.

Without a view (a group led by an older version, or none yet) the ``--client-timeout`` option
stands for the group's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable

from ..core.liveness import Observer
from ..models import ClientInfo
from ..statestore.dynamodb.store import DynamoDBStateStore
from .render import printable

#: Seconds between two reads of the watched client items.
WATCH_EVERY = 0.2

#: Seconds of watching before the command says what it is waiting for.
SAY_AFTER = 2.0


async def group_timeout(store: DynamoDBStateStore, fallback: float) -> float:
    """The ``client_timeout`` the group's leader publishes, or ``fallback`` when none does."""
    head = await store.read_view_head(consistent=True)
    return head.timeout_ms / 1000 if head is not None and head.timeout_ms else fallback


async def live_owners(
    store: DynamoDBStateStore, owners: Iterable[str], fallback_timeout: float, *, watch: bool = True
) -> dict[str, ClientInfo]:
    """Which of ``owners`` are live, by the members' rule (module docstring): their client
    items, keyed by id. ``watch=False`` (``--force``, only to say whom a shard was taken from):
    no waiting, an owner not known dead counts as live."""
    pending = set(owners)
    if not pending:
        return {}
    head = await store.read_view_head(consistent=True)
    timeout = head.timeout_ms / 1000 if head is not None and head.timeout_ms else fallback_timeout
    listed = None
    if head is not None and head.members_key:
        listed = await store.read_view_members(head.members_key)
    judged_dead = listed.dead if listed is not None else {}
    observer = Observer(timeout)
    first: dict[str, tuple[int, int]] = {}
    live: dict[str, ClientInfo] = {}
    began, said = time.monotonic(), False
    while pending:
        started = time.monotonic()
        items = {c.client_id: c for c in await store.list_clients() if c.client_id in pending}
        observer.observe({o: c.token for o, c in items.items()}, time.monotonic(), complete=False)
        for owner in sorted(pending):
            item = items.get(owner)
            if item is None or judged_dead.get(owner) == item.token:
                pending.discard(owner)  # gone, or dead by the group's verdict
            elif first.setdefault(owner, item.token) != item.token:
                pending.discard(owner)  # it heartbeated while we watched
                live[owner] = item
            elif observer.is_dead(owner, started):
                pending.discard(owner)  # no heartbeat for the group's client_timeout
        if pending and not watch:
            live.update((o, items[o]) for o in pending)
            break
        if pending:
            if not said and time.monotonic() - began >= SAY_AFTER:
                said = True
                print(
                    f"kinesumer: watching {printable(', '.join(sorted(pending)))} for a "
                    f"heartbeat (up to "
                    f"{timeout:g}s, the group's client_timeout)",
                    file=sys.stderr,
                )
            await asyncio.sleep(WATCH_EVERY)
    return live
