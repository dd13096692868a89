"""``--role-arn``, ``--external-id`` and ``--kinesis-region`` (and their environment defaults)
make the command's Config what the members' is, without AWS; a role refused is told in the
command line's own options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from kinesumer import AccountAccess, Config, ConfigError, cli
from kinesumer.aws.clients import role_not_assumed
from kinesumer.cli.errors import describe_error
from kinesumer.cli.options import group_config

B = "111111111111"
ROLE_B = f"arn:aws:iam::{B}:role/orders-reader"
GROUP = ["--app", "a", "--table", "tbl", "--region", "us-east-1"]
HOME_ENV = ("KINESUMER_ROLE_ARN", "KINESUMER_EXTERNAL_ID", "KINESUMER_KINESIS_REGION")

#: Every command that builds a group Config and takes streams.
COMMANDS = [
    ["consume", "orders"],
    ["status"],
    ["lag"],
    ["checkpoints", "list"],
    ["checkpoints", "set", "--stream", "orders", "--shard", "s", "--sequence", "1"],
    ["checkpoints", "reset", "--stream", "orders"],
    ["checkpoints", "rewind", "--stream", "orders", "--to", "latest"],
    ["pin", "--stream", "orders", "--shard", "s", "m1"],
    ["unpin", "--stream", "orders", "--shard", "s"],
    ["deregister-consumer", "--stream", "orders"],
]


@pytest.fixture(autouse=True)
def no_home_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HOME_ENV:
        monkeypatch.delenv(name, raising=False)


def config_of(*argv: str) -> Config:
    return group_config(cli.build_parser().parse_args(list(argv)))


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_every_group_command_takes_the_members_home(command: list[str]) -> None:
    home = ["--role-arn", ROLE_B, "--external-id", "ext-1", "--kinesis-region", "eu-west-1"]
    config = config_of(*command, *GROUP, *home)
    assert (config.role_arn, config.external_id) == (ROLE_B, "ext-1")
    assert (config.region, config.kinesis_region) == ("us-east-1", "eu-west-1")
    plain = config_of(*command, *GROUP)  # not given: the caller's account in --region
    assert (plain.role_arn, plain.external_id, plain.kinesis_region) == (None, None, None)


def test_the_home_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINESUMER_ROLE_ARN", ROLE_B)
    monkeypatch.setenv("KINESUMER_EXTERNAL_ID", "from-env")
    monkeypatch.setenv("KINESUMER_KINESIS_REGION", "eu-west-1")
    config = config_of("status", *GROUP)
    assert (config.role_arn, config.external_id, config.kinesis_region) == (
        ROLE_B,
        "from-env",
        "eu-west-1",
    )
    other = "arn:aws:iam::222222222222:role/r"
    assert config_of("status", *GROUP, "--role-arn", other).role_arn == other  # the option wins


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--role-arn", "arn:aws:iam::123:role/x"], "argument --role-arn: role_arn must be"),
        (["--kinesis-region", "europe"], "argument --kinesis-region: expected a region"),
    ],
)
def test_a_bad_role_or_region_is_one_usage_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", *GROUP, *argv])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--external-id", "ext-1"], "--external-id: is only used with --role-arn"),
        (["--role-arn", ROLE_B, "--external-id", "!"], "--external-id: must be 2-1224"),
    ],
)
def test_a_bad_external_id_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert cli.main(["status", *GROUP, *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def refused(config: Config) -> BaseException:
    meta = {"HTTPStatusCode": 403}
    denied = ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": meta}, "x")
    return role_not_assumed(config, ROLE_B, denied)


def test_a_refused_role_is_named_by_the_option_that_gave_it(tmp_path: Path) -> None:
    parse = cli.build_parser().parse_args

    args = parse(["lag", *GROUP, "--role-arn", ROLE_B])
    message, code = describe_error(refused(group_config(args)), args)
    assert code == 1 and message is not None
    assert "check --role-arn (and --external-id)" in message and "Config." not in message

    args = parse(["lag", *GROUP, "--account", f"{B}={ROLE_B}"])
    message, _ = describe_error(refused(group_config(args)), args)
    assert message is not None
    assert f"check --account {B}=..." in message and "Config." not in message

    path = tmp_path / "accounts.json"
    path.write_text(json.dumps({B: {"role_arn": ROLE_B}}))
    args = parse(["lag", *GROUP, "--accounts-file", str(path)])
    message, _ = describe_error(refused(group_config(args)), args)
    assert message is not None
    assert f"check --accounts-file (account {B})" in message and "Config." not in message


@pytest.mark.parametrize("secret", ["s3cret-ext id", "s3cret-ext-id\n", "s3cret-ext-id!"])
def test_a_bad_external_id_is_refused_without_showing_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    """The external id is kept out of repr and the process list; a near miss (a stray space,
    the newline of a secret's file) must not print it either."""
    assert cli.main(["status", *GROUP, "--role-arn", ROLE_B, "--external-id", secret]) == 2
    err = capsys.readouterr().err
    assert "--external-id: must be 2-1224" in err and "s3cret" not in err
    monkeypatch.setenv("KINESUMER_EXTERNAL_ID", secret)
    assert cli.main(["status", *GROUP, "--role-arn", ROLE_B]) == 2
    err = capsys.readouterr().err
    assert "--external-id: must be 2-1224" in err and "s3cret" not in err


def test_a_role_or_external_id_with_a_trailing_newline_is_refused() -> None:
    """``$`` matches before a final newline: a secret file's newline must not pass the check
    and reach STS (refused there as if the trust policy were wrong)."""
    with pytest.raises(ConfigError, match="external_id must be"):
        AccountAccess(role_arn=ROLE_B, external_id="ext-1\n")
    with pytest.raises(ConfigError, match="role_arn must be"):
        AccountAccess(role_arn=ROLE_B + "\n")
    with pytest.raises(ConfigError, match="12-digit"):
        Config(app="a", dynamodb_table="tbl", accounts={f"{B}\n": AccountAccess(role_arn=ROLE_B)})
