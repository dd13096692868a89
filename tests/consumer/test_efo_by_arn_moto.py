"""Enhanced fan-out on Kinesis streams given by ARN, on moto in server mode, which keeps streams
and their consumers per account (by the credentials; an assumed role's act in the role's
account) and per region (by the signature): the app's consumer is registered on each stream in
the stream's own account and region, through that account's role, and deregistered there
(``kinesumer.admin.deregister_consumer``, what ``kinesumer deregister-consumer`` calls).

moto serves no SubscribeToShard (its Kinesis has no event streams): reading through
subscriptions across places is ``tests/read/test_efo_across_places.py``, on a MemoryKinesis per
place. A consumer call sent to another place's endpoint or credentials finds no stream there
(moto answers an HTTP 500): an answer of 200 is the call having reached the right place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.accounts import A, B, arn, role_in_b, three_places
from support.group import make_config, setup_table

from kinesumer import AccountAccess, AccountAccessError, Kinesumer
from kinesumer.admin import deregister_consumer

Names = Callable[[str], str]

ROLE_B = role_in_b("orders-reader")
CONSUMER = "orders-efo"


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    name = unique_name("orders")
    clients = three_places(moto_url, name, ROLE_B)
    config = make_config(
        moto_url,
        moto_url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=moto_url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
        enhanced_fan_out=True,
        consumer_name=CONSUMER,
    )
    setup_table(config)
    arns = {
        "a-us": arn("us-east-1", A, name),
        "a-eu": arn("eu-west-1", A, name),
        "b-us": arn("us-east-1", B, name),
    }
    return {"config": config, "name": name, "clients": clients, "arns": arns}


def consumers(env: dict[str, Any], place: str) -> list[dict[str, Any]]:
    """The stream's consumers as its own account and region list them (boto3, that account's
    credentials)."""
    page = env["clients"][place].list_stream_consumers(StreamARN=env["arns"][place])
    return list(page["Consumers"])


def test_the_consumer_is_registered_on_each_stream_in_its_own_account_and_region(
    env: dict[str, Any],
) -> None:
    arns = env["arns"]
    streams = [env["name"], arns["a-eu"], arns["b-us"]]  # the home stream by name
    with Kinesumer(env["config"]) as consumer:
        consumer.subscribe(streams)  # registered at the join, before any shard is claimed
        registered = {place: consumers(env, place) for place in arns}

    for place, found in registered.items():
        assert [c["ConsumerName"] for c in found] == [CONSUMER], place
        assert found[0]["ConsumerStatus"] == "ACTIVE"
    # Each consumer ARN names its stream's account and region (what the subscriptions of
    # that consumer are routed by).
    b_arn = registered["b-us"][0]["ConsumerARN"]
    assert b_arn.startswith(f"arn:aws:kinesis:us-east-1:{B}:stream/{env['name']}/consumer/")
    eu_arn = registered["a-eu"][0]["ConsumerARN"]
    assert eu_arn.startswith(f"arn:aws:kinesis:eu-west-1:{A}:stream/{env['name']}/consumer/")


def test_deregister_consumer_calls_each_streams_own_account_and_region(
    env: dict[str, Any],
) -> None:
    """Each deregistration removes the consumer of that stream only, in its own account and
    region; a second one finds none."""
    config, arns, clients = env["config"], env["arns"], env["clients"]

    def consumers(place: str) -> list[str]:
        listed = clients[place].list_stream_consumers(StreamARN=arns[place])["Consumers"]
        return [c["ConsumerName"] for c in listed if c["ConsumerStatus"] != "DELETING"]

    for place in arns:
        clients[place].register_stream_consumer(StreamARN=arns[place], ConsumerName=CONSUMER)
    for place in ("b-us", "a-eu"):
        assert deregister_consumer(config, arns[place]), place
        assert consumers(place) == [], place
    assert consumers("a-us") == [CONSUMER]
    assert not deregister_consumer(config, arns["b-us"])
    assert deregister_consumer(config, env["name"])
    assert consumers("a-us") == []


def test_an_account_with_no_access_is_a_named_error_at_subscribe(env: dict[str, Any]) -> None:
    stranger = "222222222222"
    config = env["config"]
    with Kinesumer(config) as consumer, pytest.raises(AccountAccessError, match=stranger) as err:
        consumer.subscribe([env["arns"]["b-us"], arn("us-east-1", stranger, env["name"])])
    assert err.value.account == stranger
    with pytest.raises(AccountAccessError, match=stranger):
        deregister_consumer(config, arn("us-east-1", stranger, env["name"]))
