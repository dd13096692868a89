"""How the ``kinesumer`` command fails: exit codes, :class:`CliError`, and the one line (with its
exit code) for each error a user can act on. Tracebacks are for ``--debug`` only."""

from __future__ import annotations

import argparse

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)

from ..aws import error_code
from ..errors import (
    AccountAccessError,
    ConfigError,
    KinesumerError,
    RewindConflictError,
    StateTableNotFoundError,
)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 130

EXIT_CODES = """\
exit codes:
  0    success; `consume` and `status --watch` also end with 0 when stopped by Ctrl-C or
       SIGTERM (after a clean close: checkpoints written, shards released)
  1    runtime error (AWS, state table, stream), or `demo` lost a record
  2    usage error: bad arguments or option values
  3    refused: `checkpoints set/reset` on a shard a live member owns, or on a shard the table
       does not know, without --force; or the checkpoint changed while it was being written
       (`checkpoints rewind`: kept changing past its retries)
  130  interrupted (Ctrl-C or SIGTERM) before the command finished"""

#: The command-line option that sets each Config field (to name it in a ConfigError).
_OPTION_OF_FIELD = {
    "app": "--app",
    "dynamodb_table": "--table",
    "region": "--region",
    "kinesis_endpoint": "--kinesis-endpoint",
    "dynamodb_endpoint": "--dynamodb-endpoint",
    "allow_insecure_endpoints": "--allow-insecure-endpoints",
    "role_arn": "--role-arn",
    "external_id": "--external-id",
    "kinesis_region": "--kinesis-region",
    "accounts": "--account",
    "kinesis_endpoints": "--kinesis-endpoint-for",
    "sts_endpoint": "--sts-endpoint",
    "client_id": "--client-id",
    "initial_position": "--initial-position",
    "broadcast": "--broadcast",
    "broadcast_resume": "--resume",
    "streams": "STREAM",
    "stream": "--stream",
    "to_time": "--to-time",
    "by": "--by-duration",
    "to": "--to",
    "namespace": "--cloudwatch-namespace",
    "endpoint": "--cloudwatch-endpoint",
}


class CliError(Exception):
    """A failure with a one-line message for the user and the exit code to end with."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def describe_error(exc: BaseException, args: argparse.Namespace) -> tuple[str | None, int]:
    """The one line (and exit code) for an error the user can act on; None: a bug, re-raise."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, (NoCredentialsError, NoRegionError, EndpointConnectionError)):
        exc = cause  # the library retried it as a network error: say what it really is
    if isinstance(exc, ConfigError):
        option = _OPTION_OF_FIELD.get(exc.field, exc.field)
        return f"{option}: {str(exc).split(': ', 1)[-1]}", EXIT_USAGE
    if isinstance(exc, StateTableNotFoundError):
        return _missing_table(args), EXIT_ERROR
    if isinstance(exc, RewindConflictError):
        return str(exc), EXIT_REFUSED
    if isinstance(exc, AccountAccessError) and exc.role_arn is None:
        account = exc.account
        return (
            f"cannot read the Kinesis streams of account {account}: it is neither your own "
            f"account nor given a role: pass --account {account}=arn:aws:iam::{account}:role/"
            f"<a role you may assume> (or list it in --accounts-file)",
            EXIT_ERROR,
        )
    if isinstance(exc, AccountAccessError):
        return _role_refused(exc, args), EXIT_ERROR
    if isinstance(exc, KinesumerError):
        return str(exc), EXIT_ERROR
    if isinstance(exc, NoCredentialsError):
        return (
            "no AWS credentials found: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (any values do for a local endpoint)",
            EXIT_ERROR,
        )
    if isinstance(exc, NoRegionError):
        return "no AWS region: pass --region, or set AWS_REGION or AWS_DEFAULT_REGION", EXIT_ERROR
    if isinstance(exc, EndpointConnectionError):
        return f"{exc}: is the endpoint right and the server running?", EXIT_ERROR
    if isinstance(exc, ClientError):
        return f"AWS refused the call ({error_code(exc)}): {exc}", EXIT_ERROR
    if isinstance(exc, BotoCoreError):
        return str(exc), EXIT_ERROR
    return None, EXIT_ERROR


def _role_refused(exc: AccountAccessError, args: argparse.Namespace) -> str:
    """The library's message for a role that cannot be assumed, with the option that gave the
    role where it names the Config field (the user set no Config: they typed an option)."""
    account, message = exc.account, str(exc)
    given = dict(getattr(args, "accounts", None) or [])
    if account in given:
        option = f"--account {account}=..."
    elif account in (getattr(args, "accounts_file", None) or {}):
        option = f"--accounts-file (account {account})"
    else:
        option = f"--account {account}"
    message = message.replace(f"Config.accounts[{account!r}]", option)
    return message.replace("Config.role_arn", "--role-arn (and --external-id)")


def _missing_table(args: argparse.Namespace) -> str:
    table = getattr(args, "table", "?")
    flags = "".join(
        f" {flag} {value}"
        for flag, value in (
            ("--region", getattr(args, "region", None)),
            ("--dynamodb-endpoint", getattr(args, "dynamodb_endpoint", None)),
        )
        if value
    )
    from ..aws.clients import default_region  # boto3: only once an error is being explained

    region = getattr(args, "region", None) or default_region() or "the default region"
    endpoint = getattr(args, "dynamodb_endpoint", None)
    where = f"{region}" + (f" at {endpoint}" if endpoint else "")
    return (
        f"table {table!r} does not exist in {where}: create it with `kinesumer create-table "
        f"--table {table}{flags}` (production: Terraform, infra/modules/state-table)"
    )
