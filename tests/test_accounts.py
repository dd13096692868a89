"""Streams of several accounts and regions (issue 36), without AWS: ``AccountAccess`` and the
Config fields checked, the state key of each kind of stream, and the routing transport sending
each ARN's calls (and its iterators' and paging tokens') to its account and region's transport."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from kinesumer import AccountAccess, AccountAccessError, Config, ConfigError, TransientAWSError
from kinesumer.accounts import Home, state_key
from kinesumer.aws import clients
from kinesumer.kinesis.lean import RecordsAnswer
from kinesumer.kinesis.routing import RoutingTransport
from kinesumer.kinesis.transport import IteratorAnswer

BASE: dict[str, Any] = {"app": "app", "dynamodb_table": "state", "region": "us-east-1"}
ROLE_B = "arn:aws:iam::111111111111:role/reader"


def test_an_account_access_is_checked_like_role_arn_and_hides_its_external_id() -> None:
    access = AccountAccess(role_arn=ROLE_B, external_id="ext-do-not-show")
    assert "ext-do-not-show" not in repr(access)
    with pytest.raises(ConfigError, match="role_arn"):
        AccountAccess(role_arn="arn:aws:iam::123:role/x")
    with pytest.raises(ConfigError, match="external_id"):
        AccountAccess(role_arn=ROLE_B, external_id="x")


@pytest.mark.parametrize(
    ("accounts", "match"),
    [
        ({"1111": AccountAccess(ROLE_B)}, "12-digit"),
        ({"222222222222": AccountAccess(ROLE_B)}, "is in account 111111111111"),
        ({"111111111111": ROLE_B}, "not an AccountAccess"),
        ([ROLE_B], "dict"),
    ],
)
def test_config_accounts_are_checked(accounts: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Config(**BASE, accounts=accounts)


def test_regional_endpoints_are_checked_like_the_others() -> None:
    config = Config(
        **BASE,
        kinesis_endpoint="http://127.0.0.1:1",
        kinesis_endpoints={"eu-west-1": "http://127.0.0.1:2"},
    )
    assert config.kinesis_endpoint_of("eu-west-1") == "http://127.0.0.1:2"
    assert config.kinesis_endpoint_of("us-west-2") == "http://127.0.0.1:1"
    with pytest.raises(ConfigError, match="plain HTTP"):
        Config(**BASE, kinesis_endpoints={"eu-west-1": "http://example.com"})
    with pytest.raises(ConfigError, match="region"):
        Config(**BASE, kinesis_endpoints={"europe": "http://127.0.0.1:2"})


def test_a_config_with_accounts_still_hashes() -> None:
    config = Config(**BASE, accounts={"111111111111": AccountAccess(ROLE_B)})
    assert hash(config) == hash(config.replace())


def test_the_state_key_is_the_name_at_home_and_the_arn_elsewhere() -> None:
    home = Home("us-east-1", "123456789012")
    at_home = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
    assert state_key("orders", home) == "orders"
    assert state_key(at_home, home) == "orders"
    for other in (
        "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
        "arn:aws:kinesis:us-east-1:111111111111:stream/orders",
        "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2026-01-01T00:00:00.000",
    ):
        assert state_key(other, home) == other
    assert state_key(at_home, Home("us-east-1")) == at_home  # home account not known


class Fake:
    """A transport that records the streams and iterators it is given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, str | None]] = []

    async def get_shard_iterator(self, stream: str, shard_id: str, *_: Any, **__: Any) -> Any:
        self.calls.append(("iterator", stream))
        return IteratorAnswer(f"{self.name}-it-0", None)

    async def get_records(self, iterator: str, limit: int) -> Any:
        self.calls.append(("records", iterator))
        n = int(iterator.rsplit("-", 1)[1])
        return RecordsAnswer(Records=[], NextShardIterator=f"{self.name}-it-{n + 1}")

    async def list_shards(self, stream: str | None = None, **kw: Any) -> Any:
        self.calls.append(("shards", stream if kw.get("next_token") is None else kw["next_token"]))
        return {"Shards": [], "NextToken": f"{self.name}-page"} if stream else {"Shards": []}


class TwoPlaces:
    def __init__(self, remote: Fake) -> None:
        self.remote = remote

    async def transport(self, account: str, region: str) -> Any:
        return None if (account, region) == ("123456789012", "us-east-1") else self.remote


async def test_an_arns_iterators_and_tokens_go_back_to_the_transport_that_issued_them() -> None:
    home, remote = Fake("home"), Fake("remote")
    router = RoutingTransport(home, Fake("ddb"), TwoPlaces(remote))  # type: ignore[arg-type]
    elsewhere = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"

    answer = await router.get_shard_iterator(elsewhere, "shard-0", "TRIM_HORIZON")
    assert answer.iterator == "@123456789012:eu-west-1|remote-it-0"
    records = await router.get_records(answer.iterator, 10)
    assert records.NextShardIterator == "@123456789012:eu-west-1|remote-it-1"
    page = await router.list_shards(elsewhere)
    await router.list_shards(next_token=page["NextToken"])
    assert remote.calls == [
        ("iterator", "orders"),
        ("records", "remote-it-0"),
        ("shards", "orders"),
        ("shards", "remote-page"),
    ]

    at_home = await router.get_shard_iterator(
        "arn:aws:kinesis:us-east-1:123456789012:stream/orders", "shard-0", "LATEST"
    )
    named = await router.get_shard_iterator("orders", "shard-0", "LATEST")
    assert at_home.iterator == named.iterator == "home-it-0"
    await router.get_records(named.iterator, 10)
    assert home.calls == [("iterator", "orders"), ("iterator", "orders"), ("records", "home-it-0")]


async def test_a_role_that_cannot_be_assumed_names_the_account_the_role_and_the_action() -> None:
    with pytest.raises(AccountAccessError, match="111111111111") as err:
        await clients.assume_now(sts_answering("AccessDenied", 403), "111111111111", ROLE_B)
    assert err.value.role_arn == ROLE_B and err.value.action == "sts:AssumeRole"
    assert ROLE_B in str(err.value)


async def test_sts_throttled_or_failing_at_the_assume_is_transient_not_a_refused_role() -> None:
    for code, status in (("Throttling", 400), ("InternalFailure", 500)):
        with pytest.raises(TransientAWSError, match="the role itself was not refused"):
            await clients.assume_now(sts_answering(code, status), "111111111111", ROLE_B)


def sts_answering(code: str, status: int) -> Any:
    """A session whose role credentials, deferred as botocore defers them, fail at the first
    fetch with STS's ``code``."""

    class Credentials:
        async def get_frozen_credentials(self) -> Any:
            error = {"Code": code, "Message": code}
            meta = {"HTTPStatusCode": status}
            raise ClientError({"Error": error, "ResponseMetadata": meta}, "AssumeRole")

    class Session:
        async def get_credentials(self) -> Credentials:
            return Credentials()

    return Session()
