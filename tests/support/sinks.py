"""Exactly-once sinks on DynamoDB (moto in server mode): the sink table, a handler that counts
each record's deliveries, and a group fixture (the sink, edge and telemetry tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3

from kinesumer import Record
from kinesumer.sinks import (
    DynamoDBTransaction,
)

SHARDS = 2


def dynamodb(url: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")


def sink_table(url: str, name: str) -> None:
    dynamodb(url).create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def counts(url: str, table: str) -> dict[str, int]:
    """data -> deliveries committed, for every item of the sink table."""
    client, out, kwargs = dynamodb(url), {}, {"TableName": table}
    while True:
        page = client.scan(**kwargs)
        # moto applies a transaction item by item, and an update action by action: a scan may
        # see an item it has just created and not yet updated (key only, or the ADD without the
        # SET). It is committed a moment later; count it then.
        items = [i for i in page["Items"] if "deliveries" in i and "data" in i]
        out.update({i["data"]["S"]: int(i["deliveries"]["N"]) for i in items})
        if "LastEvaluatedKey" not in page:
            return out
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def recorder(table: str) -> Callable[[list[Record], DynamoDBTransaction], None]:
    def handle(records: list[Record], tx: DynamoDBTransaction) -> None:
        for r in records:
            key = {"pk": f"{r.shard_id}/{r.sequence_number}/{r.sub_sequence_number}"}
            tx.update(
                table,
                key,
                "ADD deliveries :one SET #d = :data",
                names={"#d": "data"},
                values={":one": 1, ":data": r.data.decode()},
            )

    return handle
