"""The command line's option values: argparse types that check them (one clear message per bad
value), environment defaults, and the :class:`~kinesumer.Config` a command's options make."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from ..accounts import AccountAccess, check_accounts, check_role
from ..config import Config, InitialPosition
from ..errors import ConfigError
from ..statestore.dynamodb.codecs import MAX_SEQUENCE_DIGITS

DEFAULT_CLIENT_TIMEOUT: float = next(
    f.default for f in dataclasses.fields(Config) if f.name == "client_timeout"
)  # type: ignore[assignment]


def env_option(parser: argparse.ArgumentParser, flag: str, env: str, what: str) -> None:
    """An option that defaults to ``$env`` and is required when that is unset."""
    default = os.environ.get(env) or None
    parser.add_argument(
        flag, default=default, required=default is None, help=f"{what} (default: ${env})"
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def sequence_number(text: str) -> str:
    """Kinesis sequence numbers are decimal strings of up to ~56 digits (checked as text: they
    do not fit in a float, nor in a DynamoDB number)."""
    if not text.isascii() or not text.isdigit() or len(text) > MAX_SEQUENCE_DIGITS:
        raise argparse.ArgumentTypeError(
            f"a sequence number is decimal digits only (e.g. 4959033827149025660855969253836157"
            f"1095921575989136588898), got {text!r}"
        )
    return text


def initial_position(text: str) -> InitialPosition:
    if text.upper() in ("LATEST", "TRIM_HORIZON"):
        return "LATEST" if text.upper() == "LATEST" else "TRIM_HORIZON"
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LATEST, TRIM_HORIZON or an ISO 8601 time (2024-05-01T12:00:00Z), "
            f"got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def iso_instant(text: str) -> datetime:
    """An ISO 8601 time (``2024-05-01T12:00:00Z``; a naive time is UTC)."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2024-05-01T12:00:00Z, got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


#: A century, in seconds: longer durations are capped to it (see :func:`duration`).
_LONGEST_DURATION_S = 100 * 365.25 * 86_400.0


def duration(text: str) -> timedelta:
    """A positive duration: numbers with units, such as ``1h``, ``90m``, ``1h30m``, ``45s``,
    ``2d`` (ms, s, m, h, d, w)."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 1h, 90m, 1h30m or 2d (units ms, s, m, h, d, w), "
            f"got {text!r}"
        )
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text!r}")
    # Past a century every duration reaches before 1970, which a rewind reads as the oldest
    # record; capping keeps the arithmetic inside datetime's range (99999999999w overflows it).
    return timedelta(seconds=min(seconds, _LONGEST_DURATION_S))


_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_EXTERNAL_ID_SEPARATOR = ",external-id="


def account_access(text: str) -> tuple[str, AccountAccess]:
    """``--account ACCOUNT_ID=ROLE_ARN[,external-id=ID]``: the role the streams of that
    account are read through (checked as ``Config.accounts`` checks it)."""
    account, equals, rest = text.strip().partition("=")
    role, _, external_id = rest.partition(_EXTERNAL_ID_SEPARATOR)
    if not equals or not role:
        raise argparse.ArgumentTypeError(
            "expected ACCOUNT_ID=ROLE_ARN[,external-id=ID] (e.g. 111122223333=arn:aws:iam::"
            f"111122223333:role/orders-reader), got {text!r}"
        )
    return _access(account, role, external_id or None)


def _access(account: str, role: Any, external_id: Any) -> tuple[str, AccountAccess]:
    if not re.fullmatch(r"\d{12}", account):
        raise argparse.ArgumentTypeError(f"{account!r} is not a 12-digit account id")
    try:
        access = AccountAccess(role_arn=role, external_id=external_id)
        check_accounts({account: access})
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return account, access


def accounts_file(path: str) -> dict[str, AccountAccess]:
    """``--accounts-file``: a JSON object of account id -> ``{"role_arn": ..., "external_id":
    ...}`` (the Spark source's ``accounts`` option, in a file)."""
    try:
        with open(path, encoding="utf-8") as file:
            doc = json.load(file)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path!r} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(
            f'{path!r}: expected {{"<account id>": {{"role_arn": "...", "external_id": "..."}}}}'
        )
    accounts: dict[str, AccountAccess] = {}
    for account, entry in doc.items():
        if not isinstance(entry, dict) or not {"role_arn"} <= set(entry) <= {
            "role_arn",
            "external_id",
        }:
            raise argparse.ArgumentTypeError(
                f'{path!r}: account {account}: expected {{"role_arn": "...", "external_id": '
                f'"..." (optional)}}, got {entry!r}'
            )
        accounts[account] = _access(account, entry["role_arn"], entry.get("external_id"))[1]
    return accounts


def regional_endpoint(text: str) -> tuple[str, str]:
    """``--kinesis-endpoint-for REGION=URL``: where the Kinesis streams of that region are
    read (local stand-ins; the URL is checked with the other endpoints, by Config)."""
    region, equals, url = text.strip().partition("=")
    if not equals or not _REGION.match(region) or not url:
        raise argparse.ArgumentTypeError(
            f"expected REGION=URL (e.g. eu-west-1=http://127.0.0.1:4568), got {text!r}"
        )
    return region, url


def role_arn(text: str) -> str:
    """``--role-arn``: an IAM role's ARN (checked as ``Config.role_arn`` is)."""
    try:
        check_role("role_arn", text.strip(), None)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return text.strip()


def region_name(text: str) -> str:
    """``--kinesis-region``: a region's name, such as eu-west-1."""
    if not _REGION.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a region such as eu-west-1, got {text!r}")
    return text.strip()


def add_home_options(parser: argparse.ArgumentParser) -> None:
    """The options that make the command's home (the account and region a stream given by
    name lives in, and whose stream ARNs are kept under their plain names) the members' home:
    ``Config.role_arn`` (+ ``external_id``) and ``Config.kinesis_region``. Without them the
    home is the caller's account in ``--region``; a group whose members set either would have
    its home streams looked up (and written) under keys no member reads."""
    env_role = os.environ.get("KINESUMER_ROLE_ARN") or None
    parser.add_argument(
        "--role-arn",
        type=role_arn,
        default=env_role,  # a string default goes through the type too: checked alike
        metavar="ROLE_ARN",
        help="read streams given by name (and the home account's ARNs) through this role, as "
        "the members' Config.role_arn: its account is home (default: $KINESUMER_ROLE_ARN; "
        "else your own account)",
    )
    parser.add_argument(
        "--external-id",
        default=os.environ.get("KINESUMER_EXTERNAL_ID") or None,
        metavar="ID",
        help="the external id --role-arn's trust policy asks, as Config.external_id (checked "
        "as it is; default: $KINESUMER_EXTERNAL_ID, which keeps it out of the process list)",
    )
    parser.add_argument(
        "--kinesis-region",
        type=region_name,
        default=os.environ.get("KINESUMER_KINESIS_REGION") or None,
        metavar="REGION",
        help="the region of streams given by name, as the members' Config.kinesis_region "
        "(default: $KINESUMER_KINESIS_REGION, else --region)",
    )


def add_account_options(parser: argparse.ArgumentParser) -> None:
    """The options that reach Kinesis streams given by ARN in other accounts and regions, and
    the home ones (:func:`add_home_options`)."""
    add_home_options(parser)
    parser.add_argument(
        "--account",
        dest="accounts",
        action="append",
        type=account_access,
        default=[],
        metavar="ACCOUNT_ID=ROLE_ARN[,external-id=ID]",
        help="read the streams of ACCOUNT_ID (given by ARN) through this role, assumed with "
        "your credentials (repeat per account; your own account needs none)",
    )
    default_file = os.environ.get("KINESUMER_ACCOUNTS_FILE") or None
    parser.add_argument(
        "--accounts-file",
        type=accounts_file,
        default=default_file,  # a string default goes through the type too: checked alike
        metavar="FILE",
        help='the accounts as JSON: {"111122223333": {"role_arn": "...", "external_id": '
        '"..."}} (default: $KINESUMER_ACCOUNTS_FILE; an --account of the same id wins)',
    )
    parser.add_argument(
        "--kinesis-endpoint-for",
        dest="kinesis_endpoints",
        action="append",
        type=regional_endpoint,
        default=[],
        metavar="REGION=URL",
        help="the Kinesis endpoint of one region's streams (local work; repeat per region; "
        "others: --kinesis-endpoint, else AWS's)",
    )
    parser.add_argument(
        "--sts-endpoint",
        metavar="URL",
        help="STS endpoint for the --role-arn and --account roles (local work)",
    )


def account_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Config fields of :func:`add_account_options`' options (None when not given)."""
    given: dict[str, AccountAccess] = {}
    for account, access in getattr(args, "accounts", None) or []:
        if given.get(account, access) != access:
            raise ConfigError("accounts", f"account {account} is given two different roles")
        given[account] = access
    accounts = {**(getattr(args, "accounts_file", None) or {}), **given}
    endpoints: dict[str, str] = {}
    for region, url in getattr(args, "kinesis_endpoints", None) or []:
        if endpoints.get(region, url) != url:
            raise ConfigError("kinesis_endpoints", f"region {region} is given two endpoints")
        endpoints[region] = url
    role, external = getattr(args, "role_arn", None), getattr(args, "external_id", None)
    if external is not None and role is None:
        raise ConfigError(
            "external_id", "is only used with --role-arn: give --role-arn (or $KINESUMER_ROLE_ARN)"
        )
    if external is not None and role is not None:
        try:
            check_role("external_id", role, external)
        except ConfigError:
            # Config's own check echoes the value it refuses: not a secret's (a stray space or
            # a secret file's newline would print the whole id to the terminal and its logs).
            raise ConfigError(
                "external_id", "must be 2-1224 characters of [\\w+=,.@:/-] (the value is not shown)"
            ) from None
    return {
        "role_arn": role,
        "external_id": external,
        "kinesis_region": getattr(args, "kinesis_region", None),
        "accounts": accounts or None,
        "kinesis_endpoints": endpoints or None,
        "sts_endpoint": getattr(args, "sts_endpoint", None),
    }


def group_config(args: argparse.Namespace, **extra: Any) -> Config:
    return Config(
        app=args.app,
        dynamodb_table=args.table,
        region=args.region,
        dynamodb_endpoint=args.dynamodb_endpoint,
        kinesis_endpoint=getattr(args, "kinesis_endpoint", None),
        allow_insecure_endpoints=getattr(args, "allow_insecure_endpoints", False),
        **account_fields(args),
        **extra,
    )
