"""The pure parser of stream references: a Kinesis stream name, a Kinesis stream ARN (parsed for
issue 36, refused for now), a DynamoDB table's stream ARN; anything else starting with ``arn:``
is a ConfigError saying what to fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinesumer import ConfigError
from kinesumer.config import check_streams
from kinesumer.stream_refs import check_stream, is_dynamodb_stream, parse_stream, stream_of_token

TABLE_STREAM = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000"

regions = st.from_regex(r"\A[a-z]{2}-(east|west|central|southeast)-[1-9]\Z")
accounts = st.from_regex(r"\A[0-9]{12}\Z")
tables = st.from_regex(r"\A[A-Za-z0-9_.\-]{3,40}\Z")
labels = st.from_regex(
    r"\A20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]\.[0-9]{3,6}\Z"
)
names = st.from_regex(r"\A[A-Za-z0-9_.\-]{1,128}\Z")


@given(regions, accounts, tables, labels, st.sampled_from(["aws", "aws-cn", "aws-us-gov"]))
def test_a_table_stream_arn_parses_to_its_parts(
    region: str, account: str, table: str, label: str, partition: str
) -> None:
    arn = f"arn:{partition}:dynamodb:{region}:{account}:table/{table}/stream/{label}"
    ref = parse_stream(arn)
    assert (ref.kind, ref.name, ref.region, ref.account, ref.label, ref.partition) == (
        "dynamodb-stream",
        table,
        region,
        account,
        label,
        partition,
    )
    assert ref.text == arn and ref.is_dynamodb_stream and is_dynamodb_stream(arn)
    assert stream_of_token(f"{arn}|1|AAAA+/=") == arn
    assert check_streams([arn, "orders"]) == tuple(sorted([arn, "orders"]))


@given(names)
def test_a_name_is_a_kinesis_stream_of_the_configured_region(name: str) -> None:
    ref = check_stream(name)
    assert (ref.kind, ref.name, ref.region, ref.account) == ("kinesis-name", name, None, None)
    assert not is_dynamodb_stream(name) and stream_of_token(name) is None


@given(regions, accounts, names)
def test_a_kinesis_arn_is_parsed_and_refused_where_a_name_is_needed(
    region: str, account: str, name: str
) -> None:
    arn = f"arn:aws:kinesis:{region}:{account}:stream/{name}"
    ref = parse_stream(arn)
    assert (ref.kind, ref.name, ref.region, ref.account) == ("kinesis-arn", name, region, account)
    with pytest.raises(ConfigError, match=r"a stream's name is needed here, not its ARN: give "):
        check_stream(arn)


@given(st.text(max_size=200))
def test_any_text_parses_or_is_a_config_error_and_routing_never_raises(text: str) -> None:
    try:
        parse_stream(text)
    except ConfigError as exc:
        assert exc.field == "streams"
    is_dynamodb_stream(text)
    stream_of_token(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("arn:aws:dynamodb:eu-west-1:123456789012:table/orders", "LatestStreamArn"),
        ("arn:aws:dynamodb:eu-west-1:12345:table/orders/stream/x", "not 12 digits"),
        ("arn:aws:dynamodb:Europe:123456789012:table/orders/stream/x", "region"),
        ("arn:aws:dynamodb:eu-west-1:123456789012:table/o/stream/x", "table name"),
        ("arn:aws:dynamodb:eu-west-1:123456789012:index/orders/stream/x", "table/<t>/stream/<l>"),
        ("arn:aws:sqs:eu-west-1:123456789012:queue", "neither 'dynamodb'"),
        ("arn:aws:dynamodb:eu-west-1", "six"),
        ("arn:aws:kinesis:eu-west-1:123456789012:stream/", "stream/<name>"),
        ("orders stream", "not a valid Kinesis stream name"),
    ],
)
def test_a_malformed_reference_says_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_stream(text)


def test_a_table_stream_arn_keeps_its_text_as_the_streams_name() -> None:
    assert check_stream(TABLE_STREAM).text == TABLE_STREAM
    assert stream_of_token("AAAAAAAAAAF" + TABLE_STREAM) is None  # a Kinesis iterator's form
