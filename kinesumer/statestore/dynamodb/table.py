"""Table calls: every DynamoDB request the state store makes, with retries and named errors.

Reads are strongly consistent (a member must see the claim another one just made). Every call
goes through :func:`~kinesumer.aws.call_with_retry`; a missing table becomes
:class:`~kinesumer.errors.StateTableNotFoundError`, a refused permission
:class:`~kinesumer.errors.AccessDeniedError`. Conditional writes answer False (or None) when
their condition did not hold, never raise for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from ...aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ...errors import StateStoreError, StateTableNotFoundError, StateTableSchemaError
from ..schema import PARTITION_KEY, SORT_KEY

T = TypeVar("T")

#: BatchGetItem's limit of keys per request.
BATCH_GET_KEYS = 100


class StateTable:
    """The state table through one aiobotocore DynamoDB ``client``."""

    def __init__(self, client: Any, name: str, stats: RequestStats) -> None:
        self.dynamodb = client
        self.name = name
        self._stats = stats

    async def call(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One DynamoDB call with retries, its errors named for the application."""
        try:
            return await call_with_retry(f"dynamodb.{operation}", fn, self._stats)
        except ClientError as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException":
                raise StateTableNotFoundError(self._missing_table()) from exc
            if is_denied(exc):
                raise denied(exc, f"dynamodb:{operation}", f"table {self.name!r}") from exc
            raise

    def _missing_table(self) -> str:
        meta = getattr(self.dynamodb, "meta", None)
        region = getattr(meta, "region_name", None) or "the configured region"
        endpoint = getattr(meta, "endpoint_url", None)
        where = region if not endpoint or "amazonaws.com" in endpoint else f"{region} at {endpoint}"
        return (
            f"DynamoDB table {self.name!r} does not exist in {where}: provision it with Terraform "
            f"(infra/modules/state-table) or, for local work, `kinesumer create-table`"
        )

    async def check(self) -> None:
        """The table exists with the keys kinesumer needs (``pk``/``sk``, both strings)."""
        response = await self.call(
            "DescribeTable", partial(self.dynamodb.describe_table, TableName=self.name)
        )
        table = response["Table"]
        keys = {k["AttributeName"]: k["KeyType"] for k in table.get("KeySchema", [])}
        types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
        expected = {PARTITION_KEY: "HASH", SORT_KEY: "RANGE"}
        if keys != expected or any(types.get(k) != "S" for k in expected):
            found = ", ".join(f"{k} ({v}, {types.get(k, '?')})" for k, v in keys.items())
            raise StateTableSchemaError(
                f"DynamoDB table {self.name!r} has keys [{found}]; kinesumer needs "
                f"{PARTITION_KEY} (HASH, S) and {SORT_KEY} (RANGE, S). Use a table made by "
                f"infra/modules/state-table or `kinesumer create-table`"
            )

    # -- reads --------------------------------------------------------------------------------
    async def get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        response = await self.call(
            "GetItem",
            partial(self.dynamodb.get_item, TableName=self.name, Key=key, ConsistentRead=True),
        )
        item: dict[str, Any] | None = response.get("Item")
        return item

    async def query(
        self,
        pk: str,
        *,
        projection: str | None = None,
        sort_key: tuple[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Every item of partition ``pk`` (all pages); with ``sort_key`` = (condition, value),
        only those whose sort key matches, the condition naming the key ``#sk`` and the value
        ``:sk`` (``"begins_with(#sk, :sk)"``, ``"#sk < :sk"``)."""
        kwargs: dict[str, Any] = {
            "TableName": self.name,
            "KeyConditionExpression": f"{PARTITION_KEY} = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        if sort_key is not None:
            condition, value = sort_key
            kwargs["KeyConditionExpression"] += f" AND {condition}"
            kwargs["ExpressionAttributeNames"] = {"#sk": SORT_KEY}
            kwargs["ExpressionAttributeValues"][":sk"] = {"S": value}
        if projection is not None:
            kwargs["ProjectionExpression"] = projection
        items: list[dict[str, Any]] = []
        while True:
            response = await self.call("Query", partial(self.dynamodb.query, **kwargs))
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return items
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    async def batch_get(
        self, keys: list[dict[str, Any]], *, projection: str | None = None
    ) -> list[dict[str, Any]]:
        """The items at ``keys`` that exist (in no particular order): strongly consistent
        BatchGetItem, 100 keys per call, with the unprocessed keys DynamoDB hands back under
        load asked for again. Only the items asked for: a Query would read (and bill) a whole
        partition to answer for a handful."""
        items: list[dict[str, Any]] = []
        for start in range(0, len(keys), BATCH_GET_KEYS):
            wanted: dict[str, Any] = {
                "Keys": keys[start : start + BATCH_GET_KEYS],
                "ConsistentRead": True,
            }
            if projection is not None:
                wanted["ProjectionExpression"] = projection
            request: dict[str, Any] = {self.name: wanted}
            while request:
                response = await self.call(
                    "BatchGetItem", partial(self.dynamodb.batch_get_item, RequestItems=request)
                )
                items.extend(response["Responses"].get(self.name, []))
                request = response.get("UnprocessedKeys") or {}
        return items

    # -- writes -------------------------------------------------------------------------------
    async def put(self, item: dict[str, Any]) -> None:
        await self.call("PutItem", partial(self.dynamodb.put_item, TableName=self.name, Item=item))

    async def delete(self, key: dict[str, Any]) -> None:
        await self.call(
            "DeleteItem", partial(self.dynamodb.delete_item, TableName=self.name, Key=key)
        )

    async def delete_many(self, keys: list[dict[str, Any]]) -> None:
        """Delete the items at ``keys`` (BatchWriteItem, 25 a call, unprocessed ones again)."""
        for start in range(0, len(keys), 25):
            requests = [{"DeleteRequest": {"Key": key}} for key in keys[start : start + 25]]
            while requests:
                response = await self.call(
                    "BatchWriteItem",
                    partial(self.dynamodb.batch_write_item, RequestItems={self.name: requests}),
                )
                requests = response.get("UnprocessedItems", {}).get(self.name, [])

    async def put_if(
        self, item: dict[str, Any], condition: dict[str, Any], *, return_old: bool = False
    ) -> dict[str, Any] | None:
        """Put ``item`` if ``condition`` (the call's condition arguments) holds: the attributes
        it replaced with ``return_old`` (else, and for a new item, {}), or None when the
        condition did not hold."""
        response = await self._conditional(
            "PutItem",
            partial(
                self.dynamodb.put_item,
                TableName=self.name,
                Item=item,
                ReturnValues="ALL_OLD" if return_old else "NONE",
                **condition,
            ),
        )
        return None if response is None else dict(response.get("Attributes", {}))

    async def update_if(
        self, key: dict[str, Any], update: dict[str, Any], *, return_new: bool = False
    ) -> dict[str, Any] | None:
        """Apply ``update`` (expression, condition, names, values) to the item at ``key``: the
        item as written with ``return_new`` (else {}), or None when the condition did not
        hold."""
        response = await self._conditional(
            "UpdateItem",
            partial(
                self.dynamodb.update_item,
                TableName=self.name,
                Key=key,
                ReturnValues="ALL_NEW" if return_new else "NONE",
                **update,
            ),
        )
        return None if response is None else dict(response.get("Attributes", {}))

    async def delete_if(self, key: dict[str, Any], condition: dict[str, Any]) -> bool:
        """Delete the item at ``key`` if ``condition`` holds; False when it did not."""
        response = await self._conditional(
            "DeleteItem",
            partial(self.dynamodb.delete_item, TableName=self.name, Key=key, **condition),
        )
        return response is not None

    async def _conditional(
        self, operation: str, fn: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any] | None:
        """Run a conditional write: its response, or None when its condition did not hold."""
        try:
            return await self.call(operation, fn)
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return None
            raise StateStoreError(f"dynamodb:{operation} failed: {exc}") from exc
