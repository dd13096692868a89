"""Item codecs of the membership view: the small head every member reads each tick and the
immutable member lists the leader publishes (see :mod:`kinesumer.group.membership`).

Items, for app ``A`` (partition ``view#A``):

- head ``sk=head``: ``version`` (bumped by every publication that changed the member list),
  ``members`` (the sort key of the list item it points to), ``read_at`` (ms: when the leader's
  strongly consistent read of the client items started), ``published_at`` (ms), ``leader``,
  ``seen_changes`` (the ``changes`` count the published list covers), ``changes`` (bumped by
  every join and graceful leave, with an atomic ADD, so followers notice them at once) and
  ``digests`` (the shard caches' digests the leader knows, so followers need not read them),
  ``timeout`` (the leader's ``client_timeout``, ms: what the command line judges owners by).
- member list ``sk=members#<leader>#<read_at>``: ``body``, a compact JSON list of
  ``[client id, streams, assignment]``, sorted by id, and ``dead``, a JSON list of ``[client id,
  last_update, beat]``: the members the leader judged dead (their heartbeat token unchanged for
  ``client_timeout`` on its clock), not pruned yet; written once (conditional on its absence),
  never changed, deleted by the publisher once the head moved on (``expires_at`` as a net).

Older versions of kinesumer neither read nor write these items.
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ClientInfo
from ..base import MembershipView, PublishedMembers
from ..schema import PARTITION_KEY, SORT_KEY
from .attributes import attribute, corrupt, element

HEAD = "head"

#: Seconds a member list outlives its publication (a net: the publisher deletes it sooner).
LIST_TTL = 24 * 3600


def view_pk(app: str) -> str:
    return f"view#{app}"


def view_key(app: str, sk: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": view_pk(app)}, SORT_KEY: {"S": sk}}


def head_key(app: str) -> dict[str, Any]:
    return view_key(app, HEAD)


def members_sk(leader: str, read_at_ms: int) -> str:
    return f"members#{leader}#{read_at_ms}"


def decode_head(item: dict[str, Any]) -> MembershipView:
    """The view's head; :class:`CorruptStateError` naming it when an attribute is mistyped."""

    def number(name: str) -> int:
        value: int = attribute(item, name, "N", 0)
        return value

    digests = attribute(item, "digests", "M", {})
    return MembershipView(
        version=number("version"),
        members_key=attribute(item, "members", "S", ""),
        read_at_ms=number("read_at"),
        published_at_ms=number("published_at"),
        leader=attribute(item, "leader", "S", ""),
        seen_changes=number("seen_changes"),
        changes=number("changes"),
        digests=tuple(sorted((k, element(item, "digests", v, "S")) for k, v in digests.items())),
        timeout_ms=number("timeout"),
        leader_token=(number("leader_update"), number("leader_beat")),
    )


def head_update(seen: MembershipView | None, head: MembershipView) -> dict[str, Any]:
    """Publish ``head`` if the head is still the one read (``seen``; None: there was none).
    ``changes`` is left alone: joins and leaves count it concurrently."""
    values: dict[str, Any] = {
        ":v": {"N": str(head.version)},
        ":m": {"S": head.members_key},
        ":r": {"N": str(head.read_at_ms)},
        ":p": {"N": str(head.published_at_ms)},
        ":l": {"S": head.leader},
        ":s": {"N": str(head.seen_changes)},
        ":d": {"M": {stream: {"S": digest} for stream, digest in head.digests}},
        ":t": {"N": str(head.timeout_ms)},
        ":lu": {"N": str(head.leader_token[0])},
        ":lb": {"N": str(head.leader_token[1])},
    }
    if seen is None or not seen.members_key:  # none yet, or only joins counted on it
        condition = "attribute_not_exists(#v)"
    else:
        condition = "#v = :seen AND #m = :seen_members"
        values[":seen"] = {"N": str(seen.version)}
        values[":seen_members"] = {"S": seen.members_key}
    return {
        "UpdateExpression": (
            "SET #v = :v, #m = :m, read_at = :r, published_at = :p, leader = :l, "
            "seen_changes = :s, digests = :d, #t = :t, leader_update = :lu, leader_beat = :lb"
        ),
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {"#v": "version", "#m": "members", "#t": "timeout"},
        "ExpressionAttributeValues": values,
    }


def bump_update() -> dict[str, Any]:
    """A join or a graceful leave: count it (atomic ADD; creates the head if there is none)."""
    return {
        "UpdateExpression": "ADD changes :one",
        "ExpressionAttributeValues": {":one": {"N": "1"}},
    }


def members_item(app: str, sk: str, members: PublishedMembers, now_s: int) -> dict[str, Any]:
    body = [[c.client_id, sorted(c.streams), c.assignment] for c in members.live]
    dead = [[cid, lu, beat] for cid, (lu, beat) in sorted(members.dead.items())]
    return {
        **view_key(app, sk),
        "body": {"S": json.dumps(body, separators=(",", ":"))},
        "dead": {"S": json.dumps(dead, separators=(",", ":"))},
        "expires_at": {"N": str(now_s + LIST_TTL)},
    }


def decode_members(item: dict[str, Any], table: str) -> PublishedMembers:
    """The published live members (``last_update`` unknown: 0), sorted by id, and the dead ones
    with their tokens (none from an older version's list)."""
    try:
        body = json.loads(item["body"]["S"])
        members = [
            ClientInfo(str(cid), 0, streams=frozenset(map(str, streams)), assignment=str(mode))
            for cid, streams, mode in body
        ]
        dead = {
            str(cid): (int(lu), int(beat))
            for cid, lu, beat in json.loads(item.get("dead", {}).get("S", "[]"))
        }
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        problem = f"membership view list in table {table!r} is unreadable: {exc}"
        raise corrupt(item, problem) from exc
    return PublishedMembers(sorted(members, key=lambda c: c.client_id), dead, "dead" in item)
