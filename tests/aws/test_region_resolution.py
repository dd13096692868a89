"""Where the AWS region comes from when none is passed: botocore's chain (``AWS_DEFAULT_REGION``,
the profile), then ``AWS_REGION`` (what most AWS SDKs and runtimes set, and what kinesumer's
messages name); with none, a named error that says where a region comes from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.standins import NodeStandIn

from kinesumer import Config, Kinesumer, cli
from kinesumer.errors import ConfigError, StateTableNotFoundError


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No region anywhere: no variables, no profile files."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    return monkeypatch


def _config(kinesalite: NodeStandIn, dynalite: NodeStandIn, table: str) -> Config:
    return Config(
        app="region-test",
        dynamodb_table=table,
        kinesis_endpoint=kinesalite.url,
        dynamodb_endpoint=dynalite.url,
    )


def test_the_cli_takes_the_region_from_aws_region(
    no_region: pytest.MonkeyPatch,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    no_region.setenv("AWS_REGION", "eu-west-1")
    table = unique_name("region")
    where = ["--app", "a", "--table", table, "--dynamodb-endpoint", dynalite.url]
    assert cli.main(["status", *where]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    # It reached the table's endpoint in eu-west-1 (the table is missing there), instead of
    # "no AWS region".
    assert f"table '{table}' does not exist in eu-west-1 at {dynalite.url}" in err, err
    assert cli.main(["create-table", "--table", table, "--dynamodb-endpoint", dynalite.url]) == 0
    assert cli.main(["status", *where]) == cli.EXIT_OK
    capsys.readouterr()

    no_region.delenv("AWS_REGION")
    assert cli.main(["status", *where]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "no AWS region: pass --region, or set AWS_REGION or AWS_DEFAULT_REGION" in err, err
    assert "Traceback" not in err


def test_botocores_own_chain_wins_over_aws_region(
    no_region: pytest.MonkeyPatch,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    no_region.setenv("AWS_REGION", "eu-west-1")
    no_region.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    table = unique_name("region")
    where = ["--app", "a", "--table", table, "--dynamodb-endpoint", dynalite.url]
    assert cli.main(["status", *where]) == cli.EXIT_ERROR
    assert "does not exist in ap-south-1" in capsys.readouterr().err


def test_the_library_without_a_region_raises_a_named_error(
    no_region: pytest.MonkeyPatch,
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
) -> None:
    config = _config(kinesalite, dynalite, unique_name("region"))
    with Kinesumer(config) as consumer, pytest.raises(ConfigError) as raised:
        consumer.subscribe(["any"])
    message = str(raised.value)
    assert "no AWS region for DynamoDB" in message and "AWS_REGION" in message, message


def test_the_library_takes_aws_region_and_names_it_for_a_missing_table(
    no_region: pytest.MonkeyPatch,
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
) -> None:
    no_region.setenv("AWS_REGION", "eu-west-1")
    config = _config(kinesalite, dynalite, unique_name("region"))
    with Kinesumer(config) as consumer, pytest.raises(StateTableNotFoundError) as raised:
        consumer.subscribe(["any"])
    assert f"does not exist in eu-west-1 at {dynalite.url}" in str(raised.value)
