"""The state store on one DynamoDB table (keys ``pk``/``sk``; see :mod:`.schema`).

Items, for app ``A``:

- client ``pk=client#A, sk=<client id>``: ``last_update`` (ms), ``expires_at`` (TTL, s), host, pid,
  version, streams.
- shard cache head ``pk=shard_cache#A, sk=<stream>``: ``digest``, ``chunks``; the body (zlib
  JSON, split into chunks under DynamoDB's 400 KB item limit) lives in
  ``sk=<stream>#<digest>.<writer nonce>#<i>``. Readers poll only the small head items and fetch a
  body when its digest changes; the body is written before the head points at it, so no reader
  sees half, and every write has its own chunk keys, so a writer that loses the race deletes only
  its own chunks.
- checkpoint ``pk=check_point#A#<stream>, sk=<shard id>``: ``sequence_number`` (a string: up to
  56 digits, beyond DynamoDB numbers), ``sub_sequence_number``, ``owner``, ``lease``,
  ``finished``, ``last_update``.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from ..._version import __version__
from ...aws import RetryStats, call_with_retry, denied, error_code, is_denied
from ...errors import (
    CorruptStateError,
    StateStoreError,
    StateTableNotFoundError,
    StateTableSchemaError,
)
from ...models import Checkpoint, ClientInfo, Position
from ..base import ShardCache
from ..schema import (
    PARTITION_KEY,
    SORT_KEY,
    checkpoint_pk,
    client_pk,
    item_size,
    shard_cache_pk,
    value_size,
)

log = logging.getLogger("kinesumer.statestore")
T = TypeVar("T")

_CHUNK_BYTES = 350_000
_MAX_SEQUENCE_DIGITS = 128
_NAMES = {
    "#owner": "owner",
    "#lease": "lease",
    "#lu": "last_update",
    "#seq": "sequence_number",
    "#sub": "sub_sequence_number",
    "#fin": "finished",
}


def _now_ms() -> int:
    return int(time.time() * 1000)


class DynamoDBStateStore:
    """:class:`~kinesumer.statestore.base.StateStore` on a DynamoDB table."""

    def __init__(self, client: Any, table: str, app: str, stats: RetryStats) -> None:
        self._db = client
        self._table = table
        self._app = app
        self._stats = stats

    async def _call(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One DynamoDB call with retries, its errors named for the application."""
        try:
            return await call_with_retry(f"dynamodb.{operation}", fn, self._stats)
        except ClientError as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException":
                raise StateTableNotFoundError(self._missing_table()) from exc
            if is_denied(exc):
                raise denied(exc, f"dynamodb:{operation}", f"table {self._table!r}") from exc
            raise

    def _missing_table(self) -> str:
        return (
            f"DynamoDB table {self._table!r} does not exist: provision it with Terraform "
            f"(infra/modules/state-table) or, for local work, `kinesumer create-table`"
        )

    async def check(self) -> None:
        response = await self._call(
            "DescribeTable", lambda: self._db.describe_table(TableName=self._table)
        )
        table = response["Table"]
        keys = {k["AttributeName"]: k["KeyType"] for k in table.get("KeySchema", [])}
        types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
        expected = {PARTITION_KEY: "HASH", SORT_KEY: "RANGE"}
        if keys != expected or any(types.get(k) != "S" for k in expected):
            found = ", ".join(f"{k} ({v}, {types.get(k, '?')})" for k, v in keys.items())
            raise StateTableSchemaError(
                f"DynamoDB table {self._table!r} has keys [{found}]; kinesumer needs "
                f"{PARTITION_KEY} (HASH, S) and {SORT_KEY} (RANGE, S). Use a table made by "
                f"infra/modules/state-table or `kinesumer create-table`"
            )

    # -- membership ---------------------------------------------------------------------------
    async def heartbeat(self, client: ClientInfo, ttl_seconds: int) -> None:
        item = client_item(self._app, client, ttl_seconds)
        await self._call("PutItem", lambda: self._db.put_item(TableName=self._table, Item=item))

    async def deregister(self, client_id: str) -> None:
        key = {PARTITION_KEY: {"S": client_pk(self._app)}, SORT_KEY: {"S": client_id}}
        await self._call("DeleteItem", lambda: self._db.delete_item(TableName=self._table, Key=key))

    async def list_clients(self) -> list[ClientInfo]:
        items = await self._query(client_pk(self._app))
        return [
            ClientInfo(
                client_id=i[SORT_KEY]["S"],
                last_update_ms=int(i.get("last_update", {}).get("N", "0")),
                streams=frozenset(s["S"] for s in i.get("streams", {}).get("L", [])),
                host=i.get("host", {}).get("S", ""),
                pid=int(i.get("pid", {}).get("N", "0")),
                version=i.get("version", {}).get("S", ""),
                owned={k: int(v["N"]) for k, v in i.get("owned", {}).get("M", {}).items()},
                owned_count=int(i.get("owned_count", {}).get("N", "-1")),
            )
            for i in items
        ]

    async def prune_client(self, client: ClientInfo) -> bool:
        key = {PARTITION_KEY: {"S": client_pk(self._app)}, SORT_KEY: {"S": client.client_id}}
        return await self._conditional(
            "DeleteItem",
            lambda: self._db.delete_item(
                TableName=self._table,
                Key=key,
                ConditionExpression="#lu = :seen",
                ExpressionAttributeNames={"#lu": "last_update"},
                ExpressionAttributeValues={":seen": {"N": str(client.last_update_ms)}},
            ),
        )

    # -- shard cache --------------------------------------------------------------------------
    async def shard_cache_digests(self, streams: Sequence[str]) -> dict[str, str]:
        pk = shard_cache_pk(self._app)
        found: dict[str, str] = {}
        names = list(dict.fromkeys(streams))
        for start in range(0, len(names), 100):
            keys = [
                {PARTITION_KEY: {"S": pk}, SORT_KEY: {"S": s}} for s in names[start : start + 100]
            ]
            request: dict[str, Any] = {
                self._table: {
                    "Keys": keys,
                    "ConsistentRead": True,
                    "ProjectionExpression": "sk, digest",
                }
            }
            while request:
                response = await self._call(
                    "BatchGetItem", partial(self._db.batch_get_item, RequestItems=request)
                )
                for item in response["Responses"].get(self._table, []):
                    found[item[SORT_KEY]["S"]] = item["digest"]["S"]
                request = response.get("UnprocessedKeys") or {}
        return found

    async def load_shard_cache(self, stream: str) -> ShardCache | None:
        pk = shard_cache_pk(self._app)
        head = await self._get(pk, stream)
        if head is None:
            return None
        body_key, chunks = head["body"]["S"], int(head["chunks"]["N"])
        body = b""
        for index in range(chunks):
            chunk = await self._get(pk, f"{body_key}#{index}")
            if chunk is None:  # replaced while we read: the caller reads again next tick
                return None
            body += chunk["data"]["B"]
        try:
            cache = ShardCache.from_json(stream, zlib.decompress(body))
        except (zlib.error, ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(
                f"shard cache of stream {stream!r} (item {pk}/{stream}) cannot be read: {exc}; "
                f"delete the item and the leader will write it again"
            ) from exc
        return cache

    async def save_shard_cache(self, cache: ShardCache, expected_digest: str | None) -> bool:
        pk = shard_cache_pk(self._app)
        digest = cache.digest
        body_key = f"{cache.stream}#{digest}.{uuid.uuid4().hex[:12]}"
        body = zlib.compress(cache.to_json(), 6)
        chunks = [body[i : i + _CHUNK_BYTES] for i in range(0, len(body), _CHUNK_BYTES)] or [b""]
        for index, chunk in enumerate(chunks):
            item = {
                PARTITION_KEY: {"S": pk},
                SORT_KEY: {"S": f"{body_key}#{index}"},
                "data": {"B": chunk},
            }
            await self._call(
                "PutItem", partial(self._db.put_item, TableName=self._table, Item=item)
            )
        head = {
            PARTITION_KEY: {"S": pk},
            SORT_KEY: {"S": cache.stream},
            "digest": {"S": digest},
            "body": {"S": body_key},
            "chunks": {"N": str(len(chunks))},
            "last_update": {"N": str(_now_ms())},
            "shard_count": {"N": str(len(cache.shards))},
        }
        condition: dict[str, Any] = (
            {"ConditionExpression": "attribute_not_exists(pk)"}
            if expected_digest is None
            else {
                "ConditionExpression": "digest = :expected",
                "ExpressionAttributeValues": {":expected": {"S": expected_digest}},
            }
        )
        old: dict[str, Any] = {}

        async def put_head() -> None:
            response = await self._db.put_item(
                TableName=self._table, Item=head, ReturnValues="ALL_OLD", **condition
            )
            old.update(response.get("Attributes", {}))

        if not await self._conditional("PutItem", put_head):
            await self._delete_chunks(body_key, len(chunks))
            return False
        if "body" in old:
            await self._delete_chunks(old["body"]["S"], int(old["chunks"]["N"]))
        return True

    async def _delete_chunks(self, body_key: str, count: int) -> None:
        pk = shard_cache_pk(self._app)
        for index in range(count):
            key = {PARTITION_KEY: {"S": pk}, SORT_KEY: {"S": f"{body_key}#{index}"}}
            await self._call(
                "DeleteItem", partial(self._db.delete_item, TableName=self._table, Key=key)
            )

    # -- checkpoints --------------------------------------------------------------------------
    async def get_checkpoints(
        self, stream: str, shard_ids: Iterable[str] | None = None
    ) -> dict[str, Checkpoint]:
        pk = checkpoint_pk(self._app, stream)
        if shard_ids is None:
            items = await self._query(pk)
        else:
            # Only the items asked for: a Query would read (and bill) the whole stream's
            # checkpoints, up to thousands of items, to answer for a handful.
            items = await self._batch_get(pk, sorted(set(shard_ids)))
        result = {}
        for item in items:
            checkpoint = self._parse_checkpoint(stream, item)
            result[checkpoint.shard_id] = checkpoint
        return result

    async def claim(
        self, stream: str, shard_id: str, client_id: str, seen: Checkpoint | None
    ) -> Checkpoint | None:
        values: dict[str, Any] = {
            ":me": {"S": client_id},
            ":now": {"N": str(_now_ms())},
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
        key = self._checkpoint_key(stream, shard_id)
        result: dict[str, Any] = {}

        async def update() -> None:
            response = await self._db.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression="SET #owner = :me, #lease = :next, #lu = :now",
                ConditionExpression=condition,
                ExpressionAttributeNames=_names_in(condition, "#owner", "#lease", "#lu"),
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
            result.update(response["Attributes"])

        if not await self._conditional("UpdateItem", update):
            return None
        return self._parse_checkpoint(stream, result)

    async def write_checkpoint(
        self,
        checkpoint: Checkpoint,
        position: Position | None,
        *,
        finished: bool = False,
        release: bool = False,
    ) -> bool:
        sets = ["#lu = :now"]
        values: dict[str, Any] = {
            ":me": {"S": checkpoint.owner or ""},
            ":lease": {"N": str(checkpoint.lease)},
            ":now": {"N": str(_now_ms())},
        }
        if position is not None:
            sets += ["#seq = :seq", "#sub = :sub"]
            values[":seq"] = {"S": position.sequence_number}
            values[":sub"] = {"N": str(position.sub_sequence_number)}
        if finished:
            sets.append("#fin = :fin")
            values[":fin"] = {"BOOL": True}
        expression = "SET " + ", ".join(sets) + (" REMOVE #owner" if release else "")
        condition = "#owner = :me AND #lease = :lease"
        key = self._checkpoint_key(checkpoint.stream, checkpoint.shard_id)
        return await self._conditional(
            "UpdateItem",
            lambda: self._db.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames=_names_in(expression + condition),
                ExpressionAttributeValues=values,
            ),
        )

    # -- helpers ------------------------------------------------------------------------------
    def _checkpoint_key(self, stream: str, shard_id: str) -> dict[str, Any]:
        return {
            PARTITION_KEY: {"S": checkpoint_pk(self._app, stream)},
            SORT_KEY: {"S": shard_id},
        }

    def _parse_checkpoint(self, stream: str, item: dict[str, Any]) -> Checkpoint:
        shard_id = item[SORT_KEY]["S"]
        try:
            sequence = item["sequence_number"]["S"] if "sequence_number" in item else None
            if sequence is not None and (
                not sequence.isdigit() or len(sequence) > _MAX_SEQUENCE_DIGITS
            ):
                raise ValueError(f"sequence_number {sequence[:80]!r} is not a decimal number")
            return Checkpoint(
                stream=stream,
                shard_id=shard_id,
                sequence_number=sequence,
                sub_sequence_number=int(item.get("sub_sequence_number", {}).get("N", "0")),
                owner=item["owner"]["S"] if "owner" in item else None,
                lease=int(item.get("lease", {}).get("N", "0")),
                finished=bool(item.get("finished", {}).get("BOOL", False)),
                last_update_ms=int(item.get("last_update", {}).get("N", "0")),
            )
        except (KeyError, ValueError) as exc:
            raise CorruptStateError(
                f"checkpoint of {stream}/{shard_id} in table {self._table!r} is corrupt ({exc}); "
                f"fix it with `kinesumer checkpoints set` or delete it to restart the shard from "
                f"the initial position"
            ) from exc

    async def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        key = {PARTITION_KEY: {"S": pk}, SORT_KEY: {"S": sk}}
        response = await self._call(
            "GetItem",
            lambda: self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True),
        )
        item: dict[str, Any] | None = response.get("Item")
        return item

    async def _batch_get(self, pk: str, sort_keys: list[str]) -> list[dict[str, Any]]:
        """Strongly consistent BatchGetItem of ``pk`` items, 100 keys per call, with the
        unprocessed keys DynamoDB hands back under load asked for again."""
        items: list[dict[str, Any]] = []
        for start in range(0, len(sort_keys), 100):
            keys = [
                {PARTITION_KEY: {"S": pk}, SORT_KEY: {"S": sk}}
                for sk in sort_keys[start : start + 100]
            ]
            request: dict[str, Any] = {self._table: {"Keys": keys, "ConsistentRead": True}}
            while request:
                response = await self._call(
                    "BatchGetItem", partial(self._db.batch_get_item, RequestItems=request)
                )
                items.extend(response["Responses"].get(self._table, []))
                request = response.get("UnprocessedKeys") or {}
        return items

    async def _query(self, pk: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        while True:
            response = await self._call("Query", partial(self._db.query, **kwargs))
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return items
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    async def _conditional(self, operation: str, fn: Callable[[], Awaitable[Any]]) -> bool:
        """Run a conditional write; False when its condition did not hold."""
        try:
            await self._call(operation, fn)
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise StateStoreError(f"dynamodb:{operation} failed: {exc}") from exc
        return True


#: A heartbeat rewrites the client item every ``heartbeat_interval``: within 1 KB it costs one
#: write unit, however many shards the member reads. The per-shard lag in it is for
#: ``kinesumer status``; past the budget the shards furthest behind are kept, and
#: ``owned_count`` says how many the member reads in all.
CLIENT_ITEM_BUDGET = 1024


def client_item(app: str, client: ClientInfo, ttl_seconds: int) -> dict[str, Any]:
    """The client item a heartbeat writes (shared with the heartbeat thread's boto3 client)."""
    item = {
        PARTITION_KEY: {"S": client_pk(app)},
        SORT_KEY: {"S": client.client_id},
        "last_update": {"N": str(client.last_update_ms)},
        "expires_at": {"N": str(client.last_update_ms // 1000 + ttl_seconds)},
        "host": {"S": client.host or socket.gethostname()},
        "pid": {"N": str(client.pid)},
        "version": {"S": client.version or __version__},
        "streams": {"L": [{"S": s} for s in sorted(client.streams)]},
        "owned_count": {"N": str(len(client.owned))},
    }
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


def _names_in(expression: str, *extra: str) -> dict[str, str]:
    """ExpressionAttributeNames for the placeholders an expression uses (DynamoDB rejects unused
    ones). ``owner`` is a reserved word, hence placeholders throughout."""
    used = set(extra) | {n for n in _NAMES if n in expression}
    return {n: _NAMES[n] for n in sorted(used)}
