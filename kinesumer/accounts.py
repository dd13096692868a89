"""Streams of several accounts and regions in one group: how each account is reached,
and which state items a stream's checkpoints live under.

- :class:`AccountAccess`: the role a member assumes to read the Kinesis streams of one account
  (``Config(accounts={"111122223333": AccountAccess(role_arn=...)})``).
- :class:`Home`: the config's own account and region, where a stream given by name lives.
  The region is ``Config.kinesis_region`` (or ``region``). The account is ``role_arn``'s when it
  is set (names are read through that role), else the caller's own, asked of STS
  (GetCallerIdentity) once, at the join or refresh that first gives a stream by ARN (a group
  reading names only never asks).
- :func:`state_key`: the name of a stream in the state table: the plain name for a Kinesis
  stream of the home account and region (given by name or by ARN: an application that read
  ``orders`` and now names ``arn:aws:kinesis:<home region>:<home account>:stream/orders`` keeps
  its checkpoints, and members that know names only share its items in a rolling upgrade), the
  text as given otherwise (a full ARN: two streams of one name in two accounts or regions never
  share an item).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .stream_refs import parse_stream

__all__ = ["AccountAccess", "Home", "role_account", "state_key"]

# fullmatch, not match: "$" also matches before a trailing newline (a secret file's).
_ROLE_ARN = re.compile(r"^arn:aws[a-zA-Z-]*:iam::(\d{12}):role/[\w+=,.@/-]{1,512}$")
_EXTERNAL_ID = re.compile(r"^[\w+=,.@:/-]{2,1224}$")
_ACCOUNT = re.compile(r"^\d{12}$")


@dataclass(frozen=True)
class AccountAccess:
    """How a member reads the Kinesis streams of one account: through ``role_arn`` (STS
    AssumeRole with the member's own credentials, through ``Config.sts_endpoint`` when set;
    renewed before expiry), with ``external_id`` when the role's trust policy asks for one."""

    role_arn: str
    # Out of repr, as Config's: with the role, it is what a confused deputy needs.
    external_id: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_role("accounts", self.role_arn, self.external_id)


def check_role(where: str, role_arn: Any, external_id: Any) -> None:
    """``role_arn`` is an IAM role's ARN, ``external_id`` None or 2-1224 allowed characters
    (:class:`ConfigError` naming ``where``)."""
    if not isinstance(role_arn, str) or not _ROLE_ARN.fullmatch(role_arn):
        raise ConfigError(
            where, f"role_arn must be arn:aws:iam::<12 digits>:role/<name>, got {role_arn!r}"
        )
    if external_id is not None and (
        not isinstance(external_id, str) or not _EXTERNAL_ID.fullmatch(external_id)
    ):
        raise ConfigError(where, "external_id must be 2-1224 characters of [\\w+=,.@:/-]")


def role_account(role_arn: str) -> str:
    """The account a role lives in (and an assumed session of it acts in)."""
    found = _ROLE_ARN.match(role_arn)
    assert found is not None, role_arn  # checked by Config / AccountAccess
    return found.group(1)


def check_accounts(accounts: Any) -> None:
    """``Config.accounts``: None, or a mapping of 12-digit account ids to :class:`AccountAccess`
    (the role's own account: an access to account A through a role of account B is refused,
    the streams would be looked for in B)."""
    if accounts is None:
        return
    if not isinstance(accounts, dict):
        raise ConfigError(
            "accounts", f"must be a dict of account id -> AccountAccess, got {accounts!r}"
        )
    for account, access in accounts.items():
        if not isinstance(account, str) or not _ACCOUNT.fullmatch(account):
            raise ConfigError("accounts", f"{account!r} is not a 12-digit account id")
        if not isinstance(access, AccountAccess):
            raise ConfigError(
                "accounts", f"account {account}: {access!r} is not an AccountAccess(role_arn=...)"
            )
        if role_account(access.role_arn) != account:
            raise ConfigError(
                "accounts",
                f"account {account}: the role {access.role_arn} is in account "
                f"{role_account(access.role_arn)}; an assumed role acts in its own account",
            )


@dataclass
class Home:
    """The config's own Kinesis account and region: where a stream given by name lives.
    ``account`` stays None until known (``role_arn``'s, or STS GetCallerIdentity's at the join
    that first meets a stream ARN)."""

    region: str | None
    account: str | None = None


def home_text(home: Home) -> str:
    """``home`` as a client item records it: ``"<account>:<region>"`` (either may be empty)."""
    return f"{home.account or ''}:{home.region or ''}"


def state_key(text: str, home: Home) -> str:
    """The name of the stream ``text`` in the state table (see the module's docstring). While
    the home account is unknown (a member given its Kinesis transport, which never asks STS),
    an ARN is its own key: the join of a member reading AWS learns the account before any item
    of a stream ARN is touched."""
    if not text.startswith("arn:") or ":kinesis:" not in text:
        return text
    ref = parse_stream(text)
    if ref.kind != "kinesis-arn" or home.account is None:
        return text
    return ref.name if (ref.account, ref.region) == (home.account, home.region) else text


def check_one_name_each(streams: Iterable[str], home: Home, where: str) -> None:
    """Each stream given once: ``orders`` and its home ARN together (or two ARNs of one
    stream) are refused (:class:`ConfigError` naming both), their two leases would fence each
    other on the one checkpoint item of each shard. Checked once the home account is known."""
    seen: dict[str, str] = {}
    for text in sorted(streams):
        key = state_key(text, home)
        if key in seen:
            raise ConfigError(
                "streams",
                f"{seen[key]!r} and {text!r} are one stream (its checkpoints are kept under "
                f"{key!r}): give it once",
                where,
            )
        seen[key] = text
