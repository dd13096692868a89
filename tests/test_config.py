"""Every invalid Config field raises ConfigError naming the field."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kinesumer import Config, ConfigError
from kinesumer.config import check_streams

BASE = {"app": "orders-etl", "dynamodb_table": "kinesumer-state"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("app", ""),
        ("app", "has#hash"),
        ("app", None),
        ("dynamodb_table", "ab"),
        ("dynamodb_table", "bad name"),
        ("region", "europe"),
        ("kinesis_region", "EU-WEST-1"),
        ("kinesis_endpoint", "localhost:4567"),
        ("dynamodb_endpoint", "ftp://x"),
        ("sts_endpoint", "127.0.0.1"),
        ("client_id", ""),
        ("client_id", "a#b"),
        ("role_arn", "arn:aws:iam::123:role/x"),
        ("role_arn", "not-an-arn"),
        ("scan_limit", 0),
        ("scan_limit", 10_001),
        ("scan_limit", True),
        ("scan_limit", 1.5),
        ("scan_interval", 0.1),
        ("scan_interval", "1"),
        ("scan_interval", float("nan")),
        ("initial_position", "EARLIEST"),
        ("initial_position", datetime(2026, 1, 1)),
        ("auto_commit", "yes"),
        ("heartbeat_interval", 0),
        ("shard_sync_interval", -1),
        ("commit_interval", float("inf")),
        ("handoff_timeout", -0.5),
        ("client_timeout", 1.5),
        ("max_buffered_records", 0),
        ("max_buffered_bytes", 10),
    ],
)
def test_invalid_field_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{**BASE, field: value})  # type: ignore[arg-type]
    assert info.value.field == field
    assert f"Config.{field}" in str(info.value)


def test_external_id_needs_role_arn() -> None:
    with pytest.raises(ConfigError, match=r"external_id.*role_arn"):
        Config(**BASE, external_id="abc123")


def test_config_error_is_a_value_error_and_kinesumer_error() -> None:
    from kinesumer import KinesumerError

    with pytest.raises(ValueError):
        Config(**{**BASE, "app": ""})
    assert issubclass(ConfigError, KinesumerError)


def test_defaults_and_derived_regions() -> None:
    config = Config(**BASE, region="eu-west-1", kinesis_region="us-east-1")
    assert config.scan_limit == 10_000
    assert config.scan_interval == 0.2
    assert config.initial_position == "LATEST"
    assert config.auto_commit is True
    assert config.client_timeout >= 2 * config.heartbeat_interval
    assert config.effective_kinesis_region == "us-east-1"
    assert config.effective_dynamodb_region == "eu-west-1"


def test_valid_values_accepted() -> None:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    config = Config(
        **BASE,
        role_arn="arn:aws:iam::123456789012:role/stream-reader",
        external_id="ext-42",
        initial_position=at,
        scan_interval=1,
    )
    assert config.initial_position == at


def test_config_is_frozen_and_replace_revalidates() -> None:
    config = Config(**BASE)
    with pytest.raises(AttributeError):
        config.app = "other"  # type: ignore[misc]
    assert config.replace(app="other").app == "other"
    with pytest.raises(ConfigError):
        config.replace(scan_interval=0.01)
    with pytest.raises(ConfigError):
        config.replace(no_such_field=1)


@pytest.mark.parametrize("streams", ["orders", [], ["bad name"], [1], None])
def test_bad_stream_lists(streams: object) -> None:
    with pytest.raises(ConfigError) as info:
        check_streams(streams)
    assert info.value.field == "streams"


def test_stream_list_sorted_unique() -> None:
    assert check_streams(["b", "a", "b"]) == ("a", "b")


# --- endpoints: https://, or http:// on this machine only -----------------------------------------

LOOPBACK_URLS = [
    "http://127.0.0.1:4567",
    "http://127.0.0.53:8000/",
    "http://localhost:4566",
    "http://LOCALHOST.:4566",
    "http://kinesis.localhost:4566",
    "http://[::1]:4567",
]
REMOTE_HTTP_URLS = [
    "http://kinesis.eu-west-1.amazonaws.com",
    "http://10.0.0.7:4566",
    "http://[fd00::2]:4566",
    "http://0.0.0.0:4566",  # every interface: not a loopback host
    "http://localhost.example.com:4566",
    "http://127.0.0.1.nip.io:4566",
]


@pytest.mark.parametrize("field", ["kinesis_endpoint", "dynamodb_endpoint", "sts_endpoint"])
@pytest.mark.parametrize("url", REMOTE_HTTP_URLS)
def test_plain_http_to_another_machine_is_refused(field: str, url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**BASE, **{field: url})  # type: ignore[arg-type]
    assert info.value.field == field
    message = str(info.value)
    assert "https://" in message and "allow_insecure_endpoints=True" in message
    # The escape hatch, for a trusted network (a stand-in in a container next to the tests).
    config = Config(**BASE, **{field: url}, allow_insecure_endpoints=True)  # type: ignore[arg-type]
    assert getattr(config, field) == url


@pytest.mark.parametrize("field", ["kinesis_endpoint", "dynamodb_endpoint", "sts_endpoint"])
@pytest.mark.parametrize(
    "url", [*LOOPBACK_URLS, "https://kinesis.eu-west-1.amazonaws.com", "https://10.0.0.7:4566"]
)
def test_https_and_loopback_http_endpoints_are_accepted(field: str, url: str) -> None:
    assert getattr(Config(**BASE, **{field: url}), field) == url  # type: ignore[arg-type]


def test_allow_insecure_endpoints_is_checked_and_off_by_default() -> None:
    assert Config(**BASE).allow_insecure_endpoints is False
    with pytest.raises(ConfigError) as info:
        Config(**BASE, allow_insecure_endpoints="yes")  # type: ignore[arg-type]
    assert info.value.field == "allow_insecure_endpoints"
    with pytest.raises(ConfigError, match="host"):
        Config(**BASE, kinesis_endpoint="http://:4567")


def test_metrics_listen_on_loopback_by_default() -> None:
    """The metrics endpoint has no authentication: only this machine, unless an address is
    given."""
    assert Config(**BASE).metrics_address == "127.0.0.1"
    assert Config(**BASE, metrics_address="0.0.0.0").metrics_address == "0.0.0.0"


def test_external_id_stays_out_of_repr() -> None:
    config = Config(
        **BASE, role_arn="arn:aws:iam::123456789012:role/r", external_id="ext-do-not-show"
    )
    assert "ext-do-not-show" not in repr(config) and "role_arn=" in repr(config)
    assert config.external_id == "ext-do-not-show"
    assert config.replace(scan_limit=5).external_id == "ext-do-not-show"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("app", "orders-etl\n"),
        ("client_id", "m-1\n"),
        ("role_arn", "arn:aws:iam::123456789012:role/reader\n"),
        ("region", "eu-west-1\n"),
    ],
)
def test_a_value_with_a_trailing_newline_is_refused(field: str, value: str) -> None:
    """An environment variable filled from a file often ends in a newline; it reached AWS
    (and a role "refused" for a typo) when ``$`` let it through."""
    with pytest.raises(ConfigError) as info:
        Config(**{**BASE, field: value})  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_refused_external_id_is_not_shown() -> None:
    role = "arn:aws:iam::123456789012:role/reader"
    for secret in ("s3cret-value\n", "Q"):
        with pytest.raises(ConfigError) as info:
            Config(**BASE, role_arn=role, external_id=secret)
        assert info.value.field == "external_id"
        assert secret.strip() not in str(info.value)
