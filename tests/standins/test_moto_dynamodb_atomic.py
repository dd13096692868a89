"""moto's DynamoDB, as the suite and the local AWS run it, lets one of several racing
conditional writes of an item win, as DynamoDB does (:mod:`kinesumer.aws.moto_dynamodb`).

Without the serialization, moto checks a condition and writes on each request's own thread with
nothing held between: on a busy machine six concurrent claims of one shard had three winners,
and every fencing test on moto could then pass or fail by chance."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

ROUNDS = 40
RACERS = 8


def test_racing_conditional_puts_of_one_item_have_one_winner(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    table = unique_name("atomic")
    client = boto3.client(
        "dynamodb",
        endpoint_url=moto_url,
        region_name="us-east-1",
        config=BotoConfig(max_pool_connections=RACERS, retries={"max_attempts": 1}),
    )
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    def claim(key: str, racer: int) -> bool:
        try:
            client.put_item(
                TableName=table,
                Item={"pk": {"S": key}, "owner": {"S": f"m{racer}"}},
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ConditionalCheckFailedException", exc
            return False
        return True

    with ThreadPoolExecutor(RACERS) as pool:
        for round_ in range(ROUNDS):
            key = f"item-{round_}"
            won = list(pool.map(lambda racer, key=key: claim(key, racer), range(RACERS)))
            assert sum(won) == 1, (round_, won)
