"""Item codecs: how every item of the state table is encoded, decoded and conditionally written.

One place for the item layout (as the KCL's ``LeaseSerializer``), used by every writer: the
store, the heartbeat thread and the command line. Items, for app ``A`` (keys from
:mod:`..schema`):

- client ``pk=client#A, sk=<client id>``: ``last_update`` (ms), ``beat`` (heartbeats sent; absent
  from older versions), ``expires_at`` (TTL, s), host, pid, version, streams, ``owned`` (per-shard
  lag, within a budget), ``owned_count``, ``assignment`` (the member's assignment mode; absent from
  older versions).
- shard cache head ``pk=shard_cache#A, sk=<stream>``: ``digest``, ``body``, ``chunks``; the body
  chunks ``sk=<body key>#<i>`` hold ``data`` (see :mod:`.shard_cache`).
- checkpoint ``pk=check_point#A#<stream>, sk=<shard id>``: ``sequence_number`` (a string: up to
  56 digits, beyond DynamoDB numbers), ``sub_sequence_number``, ``owner``, ``lease``,
  ``finished``, ``last_update``, ``started_at`` (epoch ms, Kinesis's clock: where a ``LATEST``
  read began, kept until a position replaces it; absent from older versions' items), ``done``
  (binary: the records done above the position, see :mod:`kinesumer.core.done_ranges`;
  absent from older versions, which ignore it).

Writes are returned as the keyword arguments of the DynamoDB call (``UpdateExpression``,
``ConditionExpression``, names and values), so their conditions are written once, here.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from ..._version import __version__
from ...core.rewind import RewindTarget
from ...errors import CorruptStateError
from ...models import Checkpoint, ClientInfo, Position
from ..schema import (
    PARTITION_KEY,
    SORT_KEY,
    checkpoint_pk,
    client_pk,
    item_size,
    shard_cache_pk,
    value_size,
)
from .attributes import attribute, corrupt, element

#: A heartbeat rewrites the client item every ``heartbeat_interval``: within 1 KB it costs one
#: write unit, however many shards the member reads. The per-shard lag in it is for
#: ``kinesumer status``; past the budget the shards furthest behind are kept, and
#: ``owned_count`` says how many the member reads in all.
CLIENT_ITEM_BUDGET = 1024
#: Enhanced fan-out: the most stalled shards a client item reports (``efo_stalls``), so that
#: the lags keep most of the budget.
MAX_STALLED_REPORTED = 4

#: Longest sequence number a checkpoint may hold (Kinesis's are ~56 digits; more is corruption).
MAX_SEQUENCE_DIGITS = 128

_NAMES = {
    "#owner": "owner",
    "#lease": "lease",
    "#lu": "last_update",
    "#seq": "sequence_number",
    "#sub": "sub_sequence_number",
    "#fin": "finished",
    "#started": "started_at",
    "#done": "done",
}


def now_ms() -> int:
    """The ``last_update`` clock: epoch milliseconds."""
    return int(time.time() * 1000)


def item_key(pk: str, sk: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": pk}, SORT_KEY: {"S": sk}}


# -- client items -----------------------------------------------------------------------------
def client_key(app: str, client_id: str) -> dict[str, Any]:
    return item_key(client_pk(app), client_id)


def client_item(app: str, client: ClientInfo, ttl_seconds: int) -> dict[str, Any]:
    """The client item a heartbeat writes (the engine's store and the heartbeat thread's boto3
    client both write this)."""
    item = {
        **client_key(app, client.client_id),
        "last_update": {"N": str(client.last_update_ms)},
        "expires_at": {"N": str(client.last_update_ms // 1000 + ttl_seconds)},
        "host": {"S": client.host or socket.gethostname()},
        "pid": {"N": str(client.pid)},
        "version": {"S": client.version or __version__},
        "streams": {"L": [{"S": s} for s in sorted(client.streams)]},
        "owned_count": {"N": str(len(client.owned))},
    }
    if client.beat:  # 0: an older version's item (its prune condition says so)
        item["beat"] = {"N": str(client.beat)}
    if client.assignment:
        item["assignment"] = {"S": client.assignment}
    if client.home:
        item["home"] = {"S": client.home}
    stalled = sorted(client.efo_stalls.items(), key=lambda kv: (-kv[1], kv[0]))
    if stalled:  # before the lags: a stalled shard is what an operator looks for first
        kept_stalls = stalled[:MAX_STALLED_REPORTED]
        item["efo_stalls"] = {"M": {k: {"N": str(v)} for k, v in sorted(kept_stalls)}}
    room = CLIENT_ITEM_BUDGET - item_size(item) - len("owned") - 3
    kept: dict[str, Any] = {}
    for key, lag in sorted(client.owned.items(), key=lambda kv: (-kv[1], kv[0])):
        value = {"N": str(lag)}
        cost = len(key.encode()) + value_size(value) + 1
        if cost > room:
            break
        kept[key] = value
        room -= cost
    item["owned"] = {"M": dict(sorted(kept.items()))}
    return item


def decode_client(item: dict[str, Any]) -> ClientInfo:
    """A client item; :class:`CorruptStateError` naming it when an attribute is mistyped."""
    streams = attribute(item, "streams", "L", [])
    owned = attribute(item, "owned", "M", {})
    stalls = attribute(item, "efo_stalls", "M", {})
    return ClientInfo(
        client_id=attribute(item, SORT_KEY, "S"),
        last_update_ms=attribute(item, "last_update", "N", 0),
        streams=frozenset(element(item, "streams", s, "S") for s in streams),
        host=attribute(item, "host", "S", ""),
        pid=attribute(item, "pid", "N", 0),
        version=attribute(item, "version", "S", ""),
        owned={k: element(item, "owned", v, "N") for k, v in owned.items()},
        owned_count=attribute(item, "owned_count", "N", -1),
        efo_stalls={k: element(item, "efo_stalls", v, "N") for k, v in stalls.items()},
        assignment=attribute(item, "assignment", "S", ""),
        beat=attribute(item, "beat", "N", 0),
        home=attribute(item, "home", "S", ""),
    )


def readable_clients(
    items: list[dict[str, Any]],
) -> tuple[list[ClientInfo], list[CorruptStateError]]:
    """The client items that decode, and the errors of those that do not (for the caller to
    skip: another app sharing the table must not stop this one with a malformed item)."""
    clients, errors = [], []
    for item in items:
        try:
            clients.append(decode_client(item))
        except CorruptStateError as exc:
            errors.append(exc)
    return clients, errors


def prune_condition(client: ClientInfo) -> dict[str, Any]:
    """Delete a dead client only if it did not heartbeat since it was read (it may revive): its
    token (``last_update`` and, from members that count them, ``beat``) is still the one read."""
    if not client.beat:  # beat unknown (an older version's item, or a caller that read only
        # last_update, as the Spark source's driver does): the stamp alone
        return {
            "ConditionExpression": "#lu = :seen",
            "ExpressionAttributeNames": {"#lu": "last_update"},
            "ExpressionAttributeValues": {":seen": {"N": str(client.last_update_ms)}},
        }
    return {
        "ConditionExpression": "#lu = :seen AND #beat = :beat",
        "ExpressionAttributeNames": {"#lu": "last_update", "#beat": "beat"},
        "ExpressionAttributeValues": {
            ":seen": {"N": str(client.last_update_ms)},
            ":beat": {"N": str(client.beat)},
        },
    }


# -- shard cache items ------------------------------------------------------------------------
def shard_cache_key(app: str, sk: str) -> dict[str, Any]:
    return item_key(shard_cache_pk(app), sk)


def chunk_item(app: str, body_key: str, index: int, data: bytes) -> dict[str, Any]:
    return {**shard_cache_key(app, f"{body_key}#{index}"), "data": {"B": data}}


def shard_cache_head(
    app: str, stream: str, *, digest: str, body_key: str, chunks: int, shard_count: int
) -> dict[str, Any]:
    return {
        **shard_cache_key(app, stream),
        "digest": {"S": digest},
        "body": {"S": body_key},
        "chunks": {"N": str(chunks)},
        "last_update": {"N": str(now_ms())},
        "shard_count": {"N": str(shard_count)},
    }


def decode_head(item: dict[str, Any]) -> tuple[str, int]:
    """(body key, chunk count) of a shard cache head; :class:`CorruptStateError` naming it."""
    return attribute(item, "body", "S"), attribute(item, "chunks", "N")


def head_condition(expected_digest: str | None) -> dict[str, Any]:
    """Replace the head only if it still has the digest the writer read (None: no head yet)."""
    if expected_digest is None:
        return {"ConditionExpression": "attribute_not_exists(pk)"}
    return {
        "ConditionExpression": "digest = :expected",
        "ExpressionAttributeValues": {":expected": {"S": expected_digest}},
    }


# -- checkpoint items -------------------------------------------------------------------------
def checkpoint_key(app: str, stream: str, shard_id: str) -> dict[str, Any]:
    return item_key(checkpoint_pk(app, stream), shard_id)


def decode_checkpoint(stream: str, item: dict[str, Any], table: str) -> Checkpoint:
    """A checkpoint item; :class:`CorruptStateError` (naming it, saying how to fix it) if it
    cannot be."""
    shard_id = str(item.get(SORT_KEY, {}).get("S"))
    try:
        sequence = attribute(item, "sequence_number", "S", None)
        if sequence is not None and (not sequence.isdigit() or len(sequence) > MAX_SEQUENCE_DIGITS):
            raise ValueError(f"sequence_number {sequence[:80]!r} is not a decimal number")
        return Checkpoint(
            stream=stream,
            shard_id=shard_id,
            sequence_number=sequence,
            sub_sequence_number=attribute(item, "sub_sequence_number", "N", 0),
            owner=attribute(item, "owner", "S", None),
            lease=attribute(item, "lease", "N", 0),
            finished=attribute(item, "finished", "BOOL", False),
            last_update_ms=attribute(item, "last_update", "N", 0),
            started_at_ms=attribute(item, "started_at", "N", None),
            done=bytes(attribute(item, "done", "B", b"")),
        )
    except (CorruptStateError, KeyError, ValueError, TypeError, AttributeError) as exc:
        raise corrupt(
            item,
            f"checkpoint of {stream}/{shard_id} in table {table!r} is corrupt ({exc!r}); the "
            f"shard is not read until it is fixed: delete the item to restart the shard from the "
            f"initial position, or put a valid one",
        ) from exc


def claim_update(client_id: str, seen: Checkpoint | None) -> dict[str, Any]:
    """Take the shard as ``client_id`` with the next lease, if the item is still as ``seen``
    (absent; unowned at the same lease; or held by the same owner at the same lease)."""
    values: dict[str, Any] = {
        ":me": {"S": client_id},
        ":now": {"N": str(now_ms())},
        ":next": {"N": str((seen.lease if seen else 0) + 1)},
    }
    if seen is None:
        condition = "attribute_not_exists(pk)"
    elif seen.owner is None:
        condition = "attribute_not_exists(#owner) AND #lease = :lease"
        values[":lease"] = {"N": str(seen.lease)}
    else:
        condition = "#owner = :seen AND #lease = :lease"
        values[":lease"] = {"N": str(seen.lease)}
        values[":seen"] = {"S": seen.owner}
    return {
        "UpdateExpression": "SET #owner = :me, #lease = :next, #lu = :now",
        "ConditionExpression": condition,
        "ExpressionAttributeNames": _names_in(condition, "#owner", "#lease", "#lu"),
        "ExpressionAttributeValues": values,
    }


def checkpoint_update(
    checkpoint: Checkpoint,
    position: Position | None,
    *,
    finished: bool,
    release: bool,
    done: bytes | None = None,
) -> dict[str, Any]:
    """The owner's checkpoint write, fenced: only while it still holds ``checkpoint``'s owner
    and lease. ``release`` also gives the shard up (owner removed, lease kept). ``done``: the
    records done above the position the item holds after this write (b"": none, removed;
    None: left as they are)."""
    sets = ["#lu = :now"]
    values: dict[str, Any] = {
        ":me": {"S": checkpoint.owner or ""},
        ":lease": {"N": str(checkpoint.lease)},
        ":now": {"N": str(now_ms())},
    }
    if position is not None:
        sets += ["#seq = :seq", "#sub = :sub"]
        values[":seq"] = {"S": position.sequence_number}
        values[":sub"] = {"N": str(position.sub_sequence_number)}
    if finished:
        sets.append("#fin = :fin")
        values[":fin"] = {"BOOL": True}
    removes = ["#owner"] if release else []
    if done:
        sets.append("#done = :done")
        values[":done"] = {"B": done}
    elif done is not None:
        removes.append("#done")
    expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    condition = "#owner = :me AND #lease = :lease"
    return {
        "UpdateExpression": expression,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": _names_in(expression + condition),
        "ExpressionAttributeValues": values,
    }


def start_update(checkpoint: Checkpoint, started_at_ms: int) -> dict[str, Any]:
    """The owner's record of where its ``LATEST`` read of the shard began, fenced like
    :func:`checkpoint_update`. A start already recorded is kept (``if_not_exists``): the start
    of a read never moves later."""
    expression = "SET #started = if_not_exists(#started, :started), #lu = :now"
    condition = "#owner = :me AND #lease = :lease"
    return {
        "UpdateExpression": expression,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": _names_in(expression + condition),
        "ExpressionAttributeValues": {
            ":me": {"S": checkpoint.owner or ""},
            ":lease": {"N": str(checkpoint.lease)},
            ":now": {"N": str(now_ms())},
            ":started": {"N": str(started_at_ms)},
        },
    }


def checkpoint_transact_update(
    table: str, app: str, checkpoint: Checkpoint, position: Position
) -> dict[str, Any]:
    """The owner's fenced checkpoint write (:func:`checkpoint_update`: same condition, same
    expression) as one element of a TransactWriteItems call: an exactly-once sink commits the
    position together with its own items, or nothing when the lease moved on."""
    update = checkpoint_update(checkpoint, position, finished=False, release=False)
    key = checkpoint_key(app, checkpoint.stream, checkpoint.shard_id)
    return {"Update": {"TableName": table, "Key": key, **update}}


def new_checkpoint_item(
    app: str, stream: str, shard_id: str, position: Position | None
) -> dict[str, Any]:
    """A checkpoint an operator writes where there was none: lease 1, no owner (put it with
    :data:`ABSENT`)."""
    item: dict[str, Any] = {
        **checkpoint_key(app, stream, shard_id),
        "lease": {"N": "1"},
        "last_update": {"N": str(now_ms())},
    }
    if position is not None:
        item["sequence_number"] = {"S": position.sequence_number}
        item["sub_sequence_number"] = {"N": str(position.sub_sequence_number)}
    return item


#: The condition of a put that creates an item: none with its key exists yet.
ABSENT: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(pk)"}


def move_update(seen: Checkpoint, position: Position | None) -> dict[str, Any]:
    """An operator's move of a checkpoint to ``position`` (None: remove the position), if the
    item is still as ``seen``: it bumps the lease and removes the owner and ``finished``, as if
    the shard had been released and claimed again. A member still holding the old lease has its
    next checkpoint write refused (it cannot overwrite the new position) and drops the shard."""
    values: dict[str, Any] = {
        ":lease": {"N": str(seen.lease)},
        ":next": {"N": str(seen.lease + 1)},
        ":now": {"N": str(now_ms())},
    }
    # A moved (or removed) position also forgets where a LATEST read began (a reset restarts
    # the shard from the initial position, as the operator asked) and the done runs, which
    # belong to the old position.
    sets, removes = ["#lease = :next", "#lu = :now"], ["#owner", "#fin", "#started", "#done"]
    if position is not None:
        sets += ["#seq = :seq", "#sub = :sub"]
        values[":seq"] = {"S": position.sequence_number}
        values[":sub"] = {"N": str(position.sub_sequence_number)}
    else:
        removes += ["#seq", "#sub"]
    # Items written before leases existed have none: lease 0 matches them too.
    lease = "#lease = :lease"
    if not seen.lease:
        lease = "(attribute_not_exists(#lease) OR #lease = :lease)"
    if seen.owner is None:
        owner = "attribute_not_exists(#owner)"
    else:
        owner = "#owner = :owner"
        values[":owner"] = {"S": seen.owner}
    return {
        "UpdateExpression": f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
        "ConditionExpression": f"attribute_exists(pk) AND {lease} AND {owner}",
        "ExpressionAttributeNames": dict(_NAMES),
        "ExpressionAttributeValues": values,
    }


def rewind_item(app: str, stream: str, shard_id: str, target: RewindTarget) -> dict[str, Any]:
    """A checkpoint an operator's rewind writes where there was none: lease 1, no owner, the
    target's start, position or ``finished`` (put it with :data:`ABSENT`)."""
    item = new_checkpoint_item(app, stream, shard_id, target.position)
    if target.started_at_ms is not None:
        item["started_at"] = {"N": str(target.started_at_ms)}
    if target.finished:
        item["finished"] = {"BOOL": True}
    return item


def rewind_update(seen: Checkpoint, target: RewindTarget) -> dict[str, Any]:
    """An operator's rewind of a checkpoint to ``target``, if the item is still exactly as
    ``seen``: the same owner and lease (a claim bumps the lease), and the same position,
    recorded start, ``finished`` flag and ``last_update`` (an owner's checkpoint write under
    the same lease changes those). Like :func:`move_update`, it bumps the lease and removes the
    owner, so a member still holding the old lease has its next write refused and drops the
    shard; it also removes the done runs, which belong to the old position.

    The target is written in the item's existing vocabulary (see
    :mod:`kinesumer.core.rewind`): a start instant is ``started_at`` without a position (what a
    recorded ``LATEST`` start means to every reader), a position is ``sequence_number``, and
    finished is ``finished``. Nothing else is cleared or added."""
    values: dict[str, Any] = {
        ":lease": {"N": str(seen.lease)},
        ":next": {"N": str(seen.lease + 1)},
        ":now": {"N": str(now_ms())},
    }
    sets, removes = ["#lease = :next", "#lu = :now"], ["#owner", "#done"]
    if target.position is not None:
        sets += ["#seq = :seq", "#sub = :sub"]
        values[":seq"] = {"S": target.position.sequence_number}
        values[":sub"] = {"N": str(target.position.sub_sequence_number)}
    elif not target.finished:  # a finished shard's position is kept: it says where it ended
        removes += ["#seq", "#sub"]
    if target.started_at_ms is not None:
        sets.append("#started = :started")
        values[":started"] = {"N": str(target.started_at_ms)}
    else:
        removes.append("#started")
    if target.finished:
        sets.append("#fin = :fin")
        values[":fin"] = {"BOOL": True}
    else:
        removes.append("#fin")
    expression = f"SET {', '.join(sets)} REMOVE {', '.join(removes)}"
    condition = _unchanged_condition(seen, values)
    return {
        "UpdateExpression": expression,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": _names_in(expression + condition),
        "ExpressionAttributeValues": values,
    }


def _unchanged_condition(seen: Checkpoint, values: dict[str, Any]) -> str:
    """The condition that the item still holds what ``seen`` read (adds its values)."""
    terms = ["attribute_exists(pk)"]
    # Items written before leases existed have none: lease 0 matches them too.
    terms.append(
        "#lease = :lease" if seen.lease else "(attribute_not_exists(#lease) OR #lease = :lease)"
    )
    for name, placeholder, value in (
        ("#owner", ":seen_owner", None if seen.owner is None else {"S": seen.owner}),
        (
            "#seq",
            ":seen_seq",
            None if seen.sequence_number is None else {"S": seen.sequence_number},
        ),
        (
            "#started",
            ":seen_started",
            None if seen.started_at_ms is None else {"N": str(seen.started_at_ms)},
        ),
    ):
        if value is None:
            terms.append(f"attribute_not_exists({name})")
        else:
            terms.append(f"{name} = {placeholder}")
            values[placeholder] = value
    if seen.sequence_number is not None:
        # An item without the attribute decodes as sub-sequence 0: match it as read.
        terms.append(
            "#sub = :seen_sub"
            if seen.sub_sequence_number
            else "(attribute_not_exists(#sub) OR #sub = :seen_sub)"
        )
        values[":seen_sub"] = {"N": str(seen.sub_sequence_number)}
    if seen.finished:
        terms.append("#fin = :true")
        values[":true"] = {"BOOL": True}
    else:
        terms.append("(attribute_not_exists(#fin) OR #fin = :false)")
        values[":false"] = {"BOOL": False}
    if seen.last_update_ms:
        terms.append("#lu = :seen_lu")
        values[":seen_lu"] = {"N": str(seen.last_update_ms)}
    return " AND ".join(terms)


def _names_in(expression: str, *extra: str) -> dict[str, str]:
    """ExpressionAttributeNames for the placeholders an expression uses (DynamoDB rejects unused
    ones). ``owner`` is a reserved word, hence placeholders throughout."""
    used = set(extra) | {n for n in _NAMES if n in expression}
    return {n: _NAMES[n] for n in sorted(used)}
