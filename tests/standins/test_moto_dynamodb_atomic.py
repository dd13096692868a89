"""moto's DynamoDB, as the suite and the local AWS run it, lets one of several racing
conditional writes of an item win, and applies a transaction's ClientRequestToken once, as
DynamoDB does (:mod:`kinesumer.aws.moto_dynamodb`).

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


def test_a_transaction_sent_again_with_its_token_applies_once(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """The same TransactWriteItems with the same ClientRequestToken: answered with success, the
    counter added to once; the token with other items: IdempotentParameterMismatchException; a
    new token: a new transaction."""
    table = unique_name("tokens")
    client = boto3.client("dynamodb", endpoint_url=moto_url, region_name="us-east-1")
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    def add(amount: int, token: str) -> None:
        client.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": table,
                        "Key": {"pk": {"S": "counter"}},
                        "UpdateExpression": "ADD n :n",
                        "ExpressionAttributeValues": {":n": {"N": str(amount)}},
                    }
                }
            ],
            ClientRequestToken=token,
        )

    def counter() -> int:
        item = client.get_item(TableName=table, Key={"pk": {"S": "counter"}}, ConsistentRead=True)
        return int(item["Item"]["n"]["N"])

    token = unique_name("token")
    add(1, token)
    add(1, token)
    assert counter() == 1
    try:
        add(5, token)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "IdempotentParameterMismatchException", exc
    else:
        raise AssertionError("the token was taken with other items")
    assert counter() == 1
    add(1, unique_name("token"))
    assert counter() == 2
