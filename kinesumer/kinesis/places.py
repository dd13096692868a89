"""Which credentials and client read the Kinesis streams of an (account, region): the
:class:`~.routing.Places` of a member's :class:`~.routing.RoutingTransport`.

An account's streams are read:

- in ``Config.accounts``: through its :class:`~kinesumer.AccountAccess` role;
- the home account (``role_arn``'s, else the caller's): as names are, through ``role_arn`` when
  it is set, else with the caller's own credentials;
- the caller's own account (when ``role_arn`` points elsewhere): with the caller's own
  credentials, no entry needed;
- any other: :class:`~kinesumer.errors.AccountAccessError`, at the subscribe that names it.

Each (account, region) but the home's gets its own client, signed for the region, opened at
first use; the home account and region's calls go through the member's plain Kinesis client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import botocore.session

from ..accounts import Home, role_account, state_key
from ..aws.clients import AwsClients, region_of
from ..config import Config
from ..errors import AccountAccessError
from .transport import KinesisTransport, transport_of

if TYPE_CHECKING:
    import aioboto3

__all__ = ["AccountPlaces", "home_of", "places_for"]


def home_of(config: Config) -> Home:
    """``config``'s home (:class:`~kinesumer.accounts.Home`): its Kinesis region, and
    ``role_arn``'s account when set (else unknown until :meth:`AccountPlaces.resolve_home`)."""
    return Home(
        config.effective_kinesis_region,
        role_account(config.role_arn) if config.role_arn else None,
    )


class AccountPlaces:
    """:class:`~.routing.Places` over a member's :class:`~kinesumer.aws.AwsClients`. ``home``
    is shared with the member's state store (its state keys): :meth:`resolve_home` fills its
    account before any stream ARN is read."""

    def __init__(self, config: Config, aws: AwsClients, home: Home) -> None:
        self._config = config
        self._aws = aws
        self.home = home
        self._caller: str | None = None
        self._transports: dict[tuple[str, str], KinesisTransport] = {}

    async def caller_account(self) -> str:
        """The caller's own account (STS GetCallerIdentity, asked once)."""
        if self._caller is None:
            self._caller = await self._aws.caller_account()
        return self._caller

    async def resolve_home(self) -> None:
        """Know the home account: ``role_arn``'s (set when the Home was made), else the
        caller's; and the home region when the config names none."""
        if self.home.region is None:  # the region names are read in: botocore's chain
            self.home.region = region_of(botocore.session.get_session())
        if self.home.account is None:
            self.home.account = await self.caller_account()

    async def state_keys(self, streams: list[str]) -> list[str]:
        """The state keys of ``streams`` (:func:`~kinesumer.accounts.state_key`), sorted, one
        each (``orders`` and its home ARN: one); the home account is learnt first when one is
        a Kinesis ARN."""
        if any(s.startswith("arn:") and ":kinesis:" in s for s in streams):
            await self.resolve_home()
        return sorted({state_key(s, self.home) for s in streams})

    async def transport(self, account: str, region: str) -> KinesisTransport | None:
        await self.resolve_home()
        home = self.home
        if account == home.account and region == home.region:
            return None
        found = self._transports.get((account, region))
        if found is not None:
            return found
        role = await self._role_of(account)
        client = await self._aws.regional_kinesis(account, region, role)
        found = self._transports[(account, region)] = transport_of(client)
        return found

    async def session(self, account: str, region: str) -> aioboto3.Session | None:
        """The session whose credentials sign (``account``, ``region``)'s calls: its role's
        (the one its Kinesis client uses), or the caller's own; None for the home account and
        region (signed as the member's plain Kinesis client is). Raises
        :class:`~kinesumer.errors.AccountAccessError` as :meth:`transport` does."""
        await self.resolve_home()
        if account == self.home.account and region == self.home.region:
            return None
        return await self._aws.account_session(account, await self._role_of(account))

    async def _role_of(self, account: str) -> tuple[str, str | None] | None:
        config = self._config
        access = (config.accounts or {}).get(account)
        if access is not None:
            return access.role_arn, access.external_id
        if account == self.home.account:
            return (config.role_arn, config.external_id) if config.role_arn else None
        if account == await self.caller_account():
            return None
        raise AccountAccessError(
            f"cannot read the Kinesis streams of account {account}: it is neither this config's "
            f"own account ({self.home.account}) nor the caller's, and Config.accounts has no "
            f"entry for it: add accounts={{{account!r}: AccountAccess(role_arn="
            f"'arn:aws:iam::{account}:role/<a role this caller may assume>')}}",
            account=account,
            action="sts:AssumeRole",
        )


def places_for(config: Config, aws: AwsClients) -> AccountPlaces:
    """The places of a reader or writer with no state table of its own to share a
    :class:`~kinesumer.accounts.Home` with (the producer, the Spark source's driver and
    executors): the home is ``config``'s Kinesis region, and ``role_arn``'s account when it is
    set (else the caller's, asked of STS at the first stream ARN)."""
    return AccountPlaces(config, aws, home_of(config))


async def config_home(config: Config) -> Home:
    """``config``'s home account and region, as its members know them (the role's account,
    else the caller's, asked of STS): for a tool with no member running."""
    from ..aws.accounting import RequestStats

    aws = AwsClients(config, RequestStats())
    try:
        places = places_for(config, aws)
        await places.resolve_home()
        return places.home
    finally:
        await aws.close()
