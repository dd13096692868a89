"""Item codecs of broadcast members' own saved positions (``Config.broadcast_resume``).

A broadcast member reads every shard itself and keeps its place in each under its own key,
never in the group's checkpoint items. Items, for app ``A`` and client id ``C``:

- session ``pk=broadcast#A#C, sk=#session``: ``session``, a counter bumped by every start of a
  member with this client id (an atomic ``ADD``: the newest process gets the highest number).
- position ``pk=broadcast#A#C, sk=<stream>#<shard id>``: ``sequence_number`` (a string) and
  ``sub_sequence_number`` of the last record processed, or ``started_at`` (epoch ms: the member
  began reading the shard at that instant and has processed nothing of it yet), ``finished``
  (read to SHARD_END, every record processed), ``session`` of the writer, ``last_update``.

Every position write is conditional on the item's ``session`` being at most the writer's: once
a newer process with the same client id wrote an item, an older one can no longer overwrite it
(its write is refused and it stops). The group's items (:mod:`.codecs`) are never touched.
"""

from __future__ import annotations

from typing import Any

from ...models import Position
from ..base import SavedPosition
from ..schema import SORT_KEY
from .attributes import corrupt
from .codecs import MAX_SEQUENCE_DIGITS, item_key, now_ms

#: The session item's sort key ('#' cannot start a stream name, so no position collides).
SESSION_SK = "#session"


def broadcast_pk(app: str, client_id: str) -> str:
    return f"broadcast#{app}#{client_id}"


def session_key(app: str, client_id: str) -> dict[str, Any]:
    return item_key(broadcast_pk(app, client_id), SESSION_SK)


def position_key(app: str, client_id: str, stream: str, shard_id: str) -> dict[str, Any]:
    return item_key(broadcast_pk(app, client_id), f"{stream}#{shard_id}")


def session_update() -> dict[str, Any]:
    """Bump the session counter (unconditional and atomic); ask for the new value back."""
    return {
        "UpdateExpression": "ADD #session :one SET #lu = :now",
        "ExpressionAttributeNames": {"#session": "session", "#lu": "last_update"},
        "ExpressionAttributeValues": {":one": {"N": "1"}, ":now": {"N": str(now_ms())}},
    }


def decode_session(item: dict[str, Any]) -> int:
    return int(item["session"]["N"])


def position_update(session: int, saved: SavedPosition) -> dict[str, Any]:
    """Write ``saved`` as session ``session``, unless a newer session wrote the item already.
    A position replaces ``started_at``; ``finished`` is only ever set, never cleared."""
    sets = ["#session = :session", "#lu = :now"]
    removes: list[str] = []
    values: dict[str, Any] = {
        ":session": {"N": str(session)},
        ":now": {"N": str(now_ms())},
    }
    if saved.position is not None:
        sets += ["#seq = :seq", "#sub = :sub"]
        values[":seq"] = {"S": saved.position.sequence_number}
        values[":sub"] = {"N": str(saved.position.sub_sequence_number)}
        removes.append("#started")
    elif saved.started_at_ms is not None:
        sets.append("#started = :started")
        values[":started"] = {"N": str(saved.started_at_ms)}
    if saved.finished:
        sets.append("#fin = :fin")
        values[":fin"] = {"BOOL": True}
    expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    names = {
        "#session": "session",
        "#lu": "last_update",
        "#seq": "sequence_number",
        "#sub": "sub_sequence_number",
        "#started": "started_at",
        "#fin": "finished",
    }
    return {
        "UpdateExpression": expression,
        "ConditionExpression": "attribute_not_exists(#session) OR #session <= :session",
        "ExpressionAttributeNames": {k: v for k, v in names.items() if k in expression},
        "ExpressionAttributeValues": values,
    }


def decode_position(item: dict[str, Any], table: str) -> SavedPosition | None:
    """A position item (None for the session item); :class:`CorruptStateError` if unreadable."""
    sk = item[SORT_KEY]["S"]
    if sk == SESSION_SK:
        return None
    stream, _, shard_id = sk.partition("#")
    try:
        position = None
        if "sequence_number" in item:
            sequence = item["sequence_number"]["S"]
            if not sequence.isdigit() or len(sequence) > MAX_SEQUENCE_DIGITS:
                raise ValueError(f"sequence_number {sequence[:80]!r} is not a decimal number")
            sub = int(item.get("sub_sequence_number", {}).get("N", "0"))
            position = Position(sequence, sub)
        started = item.get("started_at", {}).get("N")
        return SavedPosition(
            stream=stream,
            shard_id=shard_id,
            position=position,
            started_at_ms=int(started) if started is not None else None,
            finished=bool(item.get("finished", {}).get("BOOL", False)),
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise corrupt(
            item,
            f"broadcast position in table {table!r} is corrupt ({exc!r}); delete the item to "
            f"read the shard from the initial position",
        ) from exc
