"""The operator controls and the load weights in the state table: items, codecs, conditions.

Items, for app ``A`` (keys ``pk``/``sk`` as every item):

- controls ``pk=controls#A, sk=controls``: ``version`` (N, +1 per write), ``pins`` (M:
  ``"<stream>/<shard id>"`` -> client id), ``step_downs`` (M: client id -> M ``until`` epoch ms of
  the operator's clock, ``for`` its length in ms, ``drain`` BOOL), ``rebalance`` (N, bumped by a
  forced rebalance), ``last_update`` (ms).
  Every write is a read-modify-write conditional on the ``version`` read (optimistic
  concurrency): two operators cannot overwrite each other's change, a stale one is refused.
- load report ``pk=load#A, sk=<client id>``: ``rates`` (M: ``"<stream>/<shard id>"`` -> bytes
  per second delivered recently), ``last_update``, ``expires_at`` (TTL). Only its member writes
  it, every ``shard_sync_interval`` (weighted mode only).
- load reports double as the members' declaration that they apply the controls: every member
  of this version writes its own at its first tick and every ``REANNOUNCE`` seconds (weighted
  mode: with its rates, every ``shard_sync_interval``).
- the leader's publication ``pk=weights#A, sk=weights``: ``weights`` (M, same keys, quantized),
  ``legacy`` (L: live members that wrote no load report: older versions, which ignore the
  controls), ``last_update``. Only the leader writes it, every ``shard_sync_interval``.

Members read the controls and weights items together (one eventually consistent BatchGetItem, a
stale answer only delays a control) on a bounded schedule; see :mod:`kinesumer.group.controls`.
Older versions of the library never read these items: they ignore pins, step-downs and weights.
So that old and new members do not fight during a rolling upgrade, new members apply pins and
step-downs only while a fresh publication names no live member as legacy (see
:mod:`kinesumer.group.controls`); weighted mode is gated like sticky, by the declared mode.

The codecs are pure (the command line's synchronous boto3 client uses them too);
:class:`ControlsTable` makes the engine's asynchronous calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...core.controls import Controls, StepDown
from ...core.weighted import Weights
from ...errors import CorruptStateError
from ..schema import TTL_ATTRIBUTE, client_pk
from .attributes import attribute, corrupt
from .codecs import item_key, now_ms
from .table import StateTable

log = logging.getLogger("kinesumer.statestore")

CONTROLS_SK = "controls"
WEIGHTS_SK = "weights"


def controls_key(app: str) -> dict[str, Any]:
    return item_key(f"controls#{app}", CONTROLS_SK)


def weights_key(app: str) -> dict[str, Any]:
    return item_key(f"weights#{app}", WEIGHTS_SK)


def load_pk(app: str) -> str:
    return f"load#{app}"


def shard_name(stream: str, shard_id: str) -> str:
    return f"{stream}/{shard_id}"


def split_name(name: str) -> tuple[str, str]:
    # The last "/": a DynamoDB stream's ARN has "/" in it, a shard id never has.
    stream, _, shard_id = name.rpartition("/")
    return stream, shard_id


# -- controls -----------------------------------------------------------------------------------
def decode_controls(item: Mapping[str, Any] | None) -> Controls:
    """The controls an item holds (no item: no controls, version 0)."""
    if not item:
        return Controls()
    try:
        pins = {
            split_name(name): value["S"]
            for name, value in item.get("pins", {}).get("M", {}).items()
        }
        steps = {
            client: StepDown(
                int(value["M"]["until"]["N"]),
                value["M"]["drain"]["BOOL"],
                int(value["M"].get("for", {}).get("N", "0")),
            )
            for client, value in item.get("step_downs", {}).get("M", {}).items()
        }
        return Controls(
            version=int(item["version"]["N"]),
            pins=pins,
            step_downs=steps,
            rebalance=int(item.get("rebalance", {}).get("N", "0")),
            updated_ms=int(item.get("last_update", {}).get("N", "0")),
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise corrupt(dict(item), f"cannot decode the controls item: {exc!r}") from exc


def controls_item(app: str, controls: Controls) -> dict[str, Any]:
    """The item that stores ``controls`` as the next version (``controls.version + 1``)."""
    return {
        **controls_key(app),
        "version": {"N": str(controls.version + 1)},
        "pins": {
            "M": {shard_name(s, sid): {"S": c} for (s, sid), c in sorted(controls.pins.items())}
        },
        "step_downs": {
            "M": {
                client: {
                    "M": {
                        "until": {"N": str(s.until_ms)},
                        "drain": {"BOOL": s.drain},
                        "for": {"N": str(s.for_ms)},
                    }
                }
                for client, s in sorted(controls.step_downs.items())
            }
        },
        "rebalance": {"N": str(controls.rebalance)},
        "last_update": {"N": str(now_ms())},
    }


def controls_condition(expected_version: int) -> dict[str, Any]:
    """PutItem condition: the item is still at ``expected_version`` (0: there is none)."""
    if expected_version == 0:
        return {"ConditionExpression": "attribute_not_exists(pk)"}
    return {
        "ConditionExpression": "#v = :v",
        "ExpressionAttributeNames": {"#v": "version"},
        "ExpressionAttributeValues": {":v": {"N": str(expected_version)}},
    }


# -- load reports and weights -------------------------------------------------------------------
def load_item(app: str, client_id: str, rates: Weights, ttl_seconds: int) -> dict[str, Any]:
    now = now_ms()
    return {
        **item_key(load_pk(app), client_id),
        "rates": {"M": flat_numbers(rates)},
        "last_update": {"N": str(now)},
        TTL_ATTRIBUTE: {"N": str(now // 1000 + ttl_seconds)},
    }


def flat_numbers(values: Weights) -> dict[str, Any]:
    return {
        shard_name(stream, sid): {"N": repr(float(v))}
        for stream, by_shard in sorted(values.items())
        for sid, v in sorted(by_shard.items())
    }


def decode_numbers(item: Mapping[str, Any] | None, attribute: str) -> dict[str, dict[str, float]]:
    """stream -> shard id -> number, from a load report's ``rates`` or the ``weights``."""
    result: dict[str, dict[str, float]] = {}
    if not item:
        return result
    try:
        for name, value in item.get(attribute, {}).get("M", {}).items():
            stream, shard_id = split_name(name)
            result.setdefault(stream, {})[shard_id] = float(value["N"])
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise corrupt(dict(item), f"cannot decode {attribute}: {exc!r}") from exc
    return result


@dataclass(frozen=True)
class Publication:
    """What the leader published: the weights, the live members that do not apply the controls
    (older versions), when (epoch ms of the leader's clock; 0: never; compared with no clock,
    only watched for change), and the step-downs in force by the leader's count with the
    milliseconds each had left (for a member that joins during one: it cannot know when the
    others first saw it)."""

    weights: Weights = field(default_factory=dict)
    legacy: frozenset[str] = frozenset()
    updated_ms: int = 0
    step_downs_left: Mapping[str, int] = field(default_factory=dict)


def publication_item(app: str, publication: Publication) -> dict[str, Any]:
    return {
        **weights_key(app),
        "weights": {"M": flat_numbers(publication.weights)},
        "legacy": {"L": [{"S": c} for c in sorted(publication.legacy)]},
        "step_downs_left": {
            "M": {c: {"N": str(ms)} for c, ms in sorted(publication.step_downs_left.items())}
        },
        "last_update": {"N": str(now_ms())},
    }


def decode_publication(item: Mapping[str, Any] | None) -> Publication:
    if not item:
        return Publication()
    try:
        legacy = frozenset(v["S"] for v in item.get("legacy", {}).get("L", []))
        updated = int(item["last_update"]["N"])
        left = {c: int(v["N"]) for c, v in item.get("step_downs_left", {}).get("M", {}).items()}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise corrupt(dict(item), f"cannot decode the leader's publication: {exc!r}") from exc
    return Publication(decode_numbers(item, "weights"), legacy, updated, left)


class ControlsTable:
    """The engine's calls on these items, through the state table's client (retried, counted)."""

    def __init__(self, table: StateTable, app: str) -> None:
        self._table = table
        self._app = app

    async def read_shared(self) -> tuple[Controls, Publication]:
        """The controls and the weights in one eventually consistent BatchGetItem (half the
        capacity of a strongly consistent read; a stale answer only delays a control)."""
        app, name = self._app, self._table.name
        keys = [controls_key(app), weights_key(app)]
        request: dict[str, Any] = {name: {"Keys": keys, "ConsistentRead": False}}
        found: list[dict[str, Any]] = []
        while request:
            response = await self._table.call(
                "BatchGetItem",
                partial(self._table.dynamodb.batch_get_item, RequestItems=request),
            )
            found.extend(response["Responses"].get(name, []))
            request = response.get("UnprocessedKeys") or {}
        by_sk = {item["sk"]["S"]: item for item in found}
        return (
            decode_controls(by_sk.get(CONTROLS_SK)),
            decode_publication(by_sk.get(WEIGHTS_SK)),
        )

    async def read_controls(self) -> Controls:
        """The controls, strongly consistent (before a conditional write)."""
        return decode_controls(await self._table.get(controls_key(self._app)))

    async def save_controls(self, controls: Controls) -> bool:
        """Write ``controls`` as the next version if the item is still at ``controls.version``.
        False: someone else wrote it since (read again and retry, or give up)."""
        written = await self._table.put_if(
            controls_item(self._app, controls), controls_condition(controls.version)
        )
        return written is not None

    async def client_items(self) -> list[dict[str, Any]]:
        """Every client item of the app (strongly consistent Query)."""
        return await self._table.query(client_pk(self._app))

    async def report_load(self, client_id: str, rates: Weights, ttl_seconds: int) -> None:
        """This member's measured rates (only it writes its item: unconditional)."""
        await self._table.put(load_item(self._app, client_id, rates, ttl_seconds))

    async def read_loads(self) -> dict[str, tuple[int, dict[str, dict[str, float]]]]:
        """Leader: every member's load report, client id -> (last_update ms, rates)."""
        loads = {}
        for item in await self._table.query(load_pk(self._app)):
            try:
                updated = attribute(item, "last_update", "N")
                loads[attribute(item, "sk", "S")] = (updated, decode_numbers(item, "rates"))
            except CorruptStateError as exc:  # another app's making: weigh without it
                log.warning("skipping an unreadable load report: %s", exc)
        return loads

    async def publish(self, publication: Publication) -> None:
        """Leader: publish the weights and the legacy members (two leaders overlapping for a
        tick write the same aggregate of the same reports: the last write wins, harmlessly)."""
        await self._table.put(publication_item(self._app, publication))
