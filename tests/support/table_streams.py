"""DynamoDB tables with streams on moto (server mode), and the changes tests make to them.

:class:`TableChanges` writes items (put, update, delete) through boto3 and remembers, per item,
the images each change should carry: what a consumer of the table's stream must deliver, in
order, item by item.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import boto3
from boto3.dynamodb.types import TypeSerializer

_SERIALIZE = TypeSerializer().serialize


def dynamodb(url: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")


def create_streamed_table(url: str, name: str, view: str = "NEW_AND_OLD_IMAGES") -> str:
    """A table keyed by ``pk`` (S) with a stream of ``view``; the stream's ARN."""
    answer = dynamodb(url).create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": view},
    )
    arn: str = answer["TableDescription"]["LatestStreamArn"]
    return arn


@dataclass
class TableChanges:
    """Writes to one table, and the changes they make, per item key, in order: each an
    ``(event name, new image, old image)`` of plain values."""

    url: str
    table: str
    expected: dict[str, list[tuple[str, Any, Any]]] = field(default_factory=lambda: {})
    _items: dict[str, dict[str, Any]] = field(default_factory=lambda: {})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.expected = defaultdict(list)
        self._client = dynamodb(self.url)

    def put(self, key: str, **values: Any) -> None:
        item = {"pk": key, **values}
        with self._lock:
            old = self._items.get(key)
            self._client.put_item(
                TableName=self.table, Item={k: _SERIALIZE(v) for k, v in item.items()}
            )
            self._items[key] = item
            self.expected[key].append(("MODIFY" if old else "INSERT", item, old))

    def update(self, key: str, **values: Any) -> None:
        with self._lock:
            old = self._items[key]
            names = {f"#a{i}": name for i, name in enumerate(values)}
            sets = ", ".join(f"#a{i} = :v{i}" for i in range(len(values)))
            self._client.update_item(
                TableName=self.table,
                Key={"pk": {"S": key}},
                UpdateExpression=f"SET {sets}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={
                    f":v{i}": _SERIALIZE(v) for i, v in enumerate(values.values())
                },
            )
            new = {**old, **values}
            self._items[key] = new
            self.expected[key].append(("MODIFY", new, old))

    def delete(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key)
            self._client.delete_item(TableName=self.table, Key={"pk": {"S": key}})
            self.expected[key].append(("REMOVE", None, old))

    @property
    def count(self) -> int:
        return sum(len(changes) for changes in self.expected.values())


def numbered(n: int) -> dict[str, Any]:
    """Values of every kind the decoder must give back: number, text, set, binary, map, list."""
    return {
        "n": Decimal(n),
        "name": f"item {n}",
        "tags": {"a", f"t{n}"},
        "blob": bytes([n % 256, 255, 0]),
        "nested": {"x": [Decimal(n), "y", b"\x01"]},
    }


def stream_records(url: str, arn: str) -> list[dict[str, Any]]:
    """Every record of the table's stream (all shards, oldest first per shard), as boto3's
    ``dynamodbstreams`` gives them: what a consumer must deliver, with their stamps."""
    client = boto3.client("dynamodbstreams", endpoint_url=url, region_name="us-east-1")
    shards = client.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
    found: list[dict[str, Any]] = []
    for shard in shards:
        iterator = client.get_shard_iterator(
            StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = client.get_records(ShardIterator=iterator, Limit=1000)
            found += page["Records"]
            if not page["Records"]:
                break
            iterator = page.get("NextShardIterator")
    return found


def write_changes(changes: TableChanges, items: range) -> None:
    """Items ``k<n>`` put, every second one updated, every third deleted (in three passes, so
    each item's changes interleave with the others')."""
    for n in items:
        changes.put(f"k{n}", **numbered(n))
    for n in items:
        if n % 2 == 0:
            changes.update(f"k{n}", name=f"renamed {n}", n=n * 10)
    for n in items:
        if n % 3 == 0:
            changes.delete(f"k{n}")


def by_item(read: Iterable[Any]) -> dict[str, list[tuple[str, Any, Any]]]:
    """Each item's changes (event, new image, old image) in the order given; ``read``: records,
    or their data as bytes or text."""
    from kinesumer.dynamodb_streams import change

    seen: dict[str, list[tuple[str, Any, Any]]] = defaultdict(list)
    for item in read:
        c = change(item)
        seen[c.keys["pk"]].append((c.event_name, c.new_image, c.old_image))
    return dict(seen)
