"""The sink's options as a user switching from another connector writes them: the AWS Labs and
Databricks names that mean one of ours are taken, a name nobody knows gets a "did you mean", and
the source's position words are accepted under our own option name too."""

from __future__ import annotations

import pytest

from kinesumer import ConfigError
from kinesumer.spark.sink.writer import parse_sink_options
from kinesumer.spark.source.options import parse_options


@pytest.mark.parametrize(
    "name", ["streamName", "kinesis.streamName", "STREAMNAME", "stream"]
)  # fmt: skip
def test_their_stream_option_names_the_stream(name: str) -> None:
    assert parse_sink_options({name: "orders", "region": "eu-west-1"}).stream == "orders"


def test_their_aws_options_become_the_producers() -> None:
    parsed = parse_sink_options(
        {
            "kinesis.streamName": "orders",
            "kinesis.region": "eu-west-1",
            "kinesis.endpointUrl": "http://127.0.0.1:4567",
            "roleArn": "arn:aws:iam::123456789012:role/writer",
            "roleExternalId": "x-1",
        }
    )
    assert parsed.producer == {
        "region": "eu-west-1",
        "kinesis_endpoint": "http://127.0.0.1:4567",
        "role_arn": "arn:aws:iam::123456789012:role/writer",
        "external_id": "x-1",
    }


def test_an_alias_and_our_name_with_different_values_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"sink\(stream\): is given twice"):
        parse_sink_options({"stream": "a", "streamName": "b", "region": "eu-west-1"})


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("stream_name", "stream"), ("Region", None), ("kinesis_endpint", "kinesis_endpoint")],
)  # fmt: skip
def test_an_unknown_option_gets_a_hint(typed: str, meant: str | None) -> None:
    if meant is None:  # a known name in another case is ours
        parse_sink_options({"stream": "s", typed: "eu-west-1"})
        return
    with pytest.raises(ConfigError) as refused:
        parse_sink_options({"stream": "s", typed: "x"})
    assert f"(did you mean {meant!r}?)" in str(refused.value)


@pytest.mark.parametrize(
    ("value", "position"),
    [("earliest", "TRIM_HORIZON"), ("Earliest", "TRIM_HORIZON"), ("latest", "LATEST"),
     ("trim_horizon", "TRIM_HORIZON"), ("TRIM_HORIZON", "TRIM_HORIZON")],
)  # fmt: skip
def test_the_sources_own_initial_position_takes_the_position_words(
    value: str, position: str
) -> None:
    options = {
        "app": "orders",
        "dynamodb_table": "state",
        "streams": "a",
        "initial_position": value,
    }
    assert parse_options(options).config.initial_position == position


@pytest.mark.parametrize("name", ["stream", "streamARN"])
def test_a_tables_stream_is_refused_at_the_options_not_by_every_task(name: str) -> None:
    """A DynamoDB table's stream is read, never written: the load check would find it, and
    every task's put would then fail."""
    table_stream = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-01-01T00:00"
    with pytest.raises(ConfigError, match="written through its table") as caught:
        parse_sink_options({name: table_stream, "region": "eu-west-1"})
    assert caught.value.field == "stream"
