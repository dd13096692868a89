"""Each SubscribeToShard of a member reading streams of several accounts and regions goes out
signed for the consumer ARN's region with that account's credentials: the home account's own
for its streams, the role of ``Config.accounts`` for another account's. An HTTP/2 stand-in
(:mod:`support.efo_standin`) records every request; moto's STS (server mode) assumes the
role, and tells which account a recorded access key acts in (it checks no signature)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import boto3
from support.accounts import A, B, role_in_b
from support.efo_standin import EfoStandIn, ScriptedShard

from kinesumer import AccountAccess, Config
from kinesumer.aws import RequestStats
from kinesumer.aws.clients import AwsClients
from kinesumer.kinesis.efo.subscriber import PlacedSubscriber
from kinesumer.kinesis.places import AccountPlaces, home_of

ROLE_B = role_in_b("orders-reader")


def consumer(region: str, account: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:stream/orders/consumer/shop-efo:1700000000"


def scope(request: dict[str, Any]) -> tuple[str, str]:
    """(access key, region) of a request's SigV4 ``Credential=<key>/<date>/<region>/...``."""
    credential = request["headers"]["authorization"].split("Credential=")[1].split(",")[0]
    key, _, region, service, _ = credential.split("/")
    assert service == "kinesis"
    return key, region


def account_of(moto_url: str, access_key: str) -> str:
    sts = boto3.client(
        "sts",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key="unchecked",
        aws_session_token="unchecked",
    )
    return str(sts.get_caller_identity()["Account"])


async def test_each_subscription_is_signed_for_its_region_with_its_accounts_credentials(
    moto_url: str,
) -> None:
    places_arns = {
        "a-us": consumer("us-east-1", A),  # the home: the caller's account, Config's region
        "a-eu": consumer("eu-west-1", A),
        "b-us": consumer("us-east-1", B),
        "b-eu": consumer("eu-west-1", B),
    }
    async with EfoStandIn(initial_response=False) as server:
        server.shards["shardId-0"] = ScriptedShard()
        server.shards["shardId-0"].put(b"a")
        config = Config(
            app="shop",
            dynamodb_table="state",
            region="us-east-1",
            enhanced_fan_out=True,
            kinesis_endpoint=server.url,
            sts_endpoint=moto_url,
            accounts={B: AccountAccess(role_arn=ROLE_B)},
        )
        stats = RequestStats()
        aws = AwsClients(config, stats)
        places = AccountPlaces(config, aws, home_of(config))
        await places.resolve_home()
        assert places.home.account == A
        subscriber = PlacedSubscriber(config, places, stats)
        await subscriber.open()
        try:
            for arn in places_arns.values():
                events = subscriber.subscribe(arn, "shardId-0", {"Type": "TRIM_HORIZON"})
                async with contextlib.aclosing(events):
                    await anext(events)
        finally:
            await subscriber.close()
            await aws.close()

    signed = {json.loads(r["body"])["ConsumerARN"]: scope(r) for r in server.requests}
    assert set(signed) == set(places_arns.values())
    home_key = signed[places_arns["a-us"]][0]
    assert home_key == "testing"  # the caller's own (conftest's environment)
    for place, arn in places_arns.items():
        key, region = signed[arn]
        assert region == ("eu-west-1" if place.endswith("-eu") else "us-east-1"), place
        if place.startswith("a-"):
            assert key == home_key, place
        else:  # B's role's credentials, acting in B
            assert key != home_key, place
            assert account_of(moto_url, key) == B, place
