"""Kinesis streams in two accounts and two regions of moto in server mode: account A is moto's
account for plain keys (the caller's), account B is reached through a role moto's STS lets
anyone assume (an assumed role's credentials act in that role's account)."""

from __future__ import annotations

from typing import Any

import boto3

from support.group import kinesis_in_account_of

A = "123456789012"  # moto's account for plain keys: the caller's
B = "111111111111"


def role_in_b(name: str) -> str:
    return f"arn:aws:iam::{B}:role/{name}"


def arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:stream/{name}"


def client_of(url: str, region: str, role: str | None = None) -> Any:
    """A Kinesis client of ``region``, in the caller's account or in ``role``'s."""
    if role is None:
        return boto3.client("kinesis", endpoint_url=url, region_name=region)
    client = kinesis_in_account_of(url, role)
    assert client.meta.region_name == region
    return client


def create(client: Any, name: str, shards: int = 1) -> None:
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )


def datas(client: Any, name: str) -> list[bytes]:
    """Every record of ``name`` (as ``client``'s account and region see it), shard by shard."""
    found: list[bytes] = []
    for shard in client.list_shards(StreamName=name)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        found.extend(r["Data"] for r in client.get_records(ShardIterator=iterator)["Records"])
    return found


def three_places(url: str, name: str, role: str, shards: int = 1) -> dict[str, Any]:
    """Stream ``name`` created in A's us-east-1 (``a-us``), A's eu-west-1 (``a-eu``) and, through
    ``role``, B's us-east-1 (``b-us``); a Kinesis client of each, by place."""
    clients = {
        "a-us": client_of(url, "us-east-1"),
        "a-eu": client_of(url, "eu-west-1"),
        "b-us": client_of(url, "us-east-1", role),
    }
    for client in clients.values():
        create(client, name, shards)
    return clients
