"""The pytest plugin's local AWS answers only the session that started it: loopback is shared by
every user of the machine, and moto itself checks no signature."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from kinesumer.testing.server import LocalAWS


@pytest.fixture(scope="module")
def aws() -> Iterator[LocalAWS]:
    server = LocalAWS().start()
    try:
        yield server
    finally:
        server.stop()


def _client(aws: LocalAWS, service: str, key: str, secret: str, token: str | None = None):  # type: ignore[no-untyped-def]
    return boto3.client(
        service,
        endpoint_url=aws.url,
        region_name=aws.region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=token,
    )


def _refused(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ClientError) as refused:
        call()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return str(refused.value)


def test_each_server_has_its_own_random_credentials() -> None:
    one, two = LocalAWS(), LocalAWS()
    assert one.access_key != two.access_key
    assert one.secret_key != two.secret_key
    assert one.admin_token != two.admin_token
    assert one.access_key.startswith("AKIA") and len(one.access_key) == 20


def test_another_user_can_neither_read_nor_write_a_tests_records(aws: LocalAWS) -> None:
    kinesis = aws.client("kinesis")
    kinesis.create_stream(StreamName="private", ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName="private", WaiterConfig={"Delay": 0.1})
    kinesis.put_record(StreamName="private", Data=b"secret", PartitionKey="k")

    # The key everybody guesses, and the server's own key with a wrong secret.
    for key, secret in (("testing", "testing"), (aws.access_key, "not-the-secret")):
        other = _client(aws, "kinesis", key, secret)
        assert "refused" in _refused(lambda c=other: c.list_streams())
        assert "refused" in _refused(
            lambda c=other: c.put_record(StreamName="private", Data=b"injected", PartitionKey="k")
        )
        assert "refused" in _refused(
            lambda c=other: c.get_shard_iterator(
                StreamName="private", ShardId="shardId-000000000000",
                ShardIteratorType="TRIM_HORIZON",
            )
        )  # fmt: skip
    iterator = kinesis.get_shard_iterator(
        StreamName="private", ShardId="shardId-000000000000", ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    assert [r["Data"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]] == [
        b"secret"
    ]


def test_unsigned_requests_are_refused(aws: LocalAWS) -> None:
    body = b'{"StreamName": "private"}'
    request = urllib.request.Request(
        aws.url,
        data=body,
        method="POST",
        headers={
            "X-Amz-Target": "Kinesis_20131202.DescribeStream",
            "Content-Type": "application/x-amz-json-1.1",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403


def test_only_the_services_the_fixtures_use_are_served(aws: LocalAWS) -> None:
    batch = _client(aws, "batch", aws.access_key, aws.secret_key)
    assert "batch is not served here" in _refused(batch.describe_job_queues)
    assert aws.client("dynamodb").list_tables()["TableNames"] is not None
    assert aws.client("sts").get_caller_identity()["Account"]


def test_moto_api_needs_the_admin_token(aws: LocalAWS) -> None:
    kinesis = aws.client("kinesis")
    kinesis.create_stream(StreamName="kept", ShardCount=1)
    request = urllib.request.Request(f"{aws.url}/moto-api/reset", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403
    assert "kept" in kinesis.list_streams()["StreamNames"]  # nothing was reset
    aws.reset()
    assert "kept" not in kinesis.list_streams()["StreamNames"]


def test_credentials_of_an_assumed_role_are_served(aws: LocalAWS) -> None:
    """Tests assume a role to act in another account: what the server's STS hands out works."""
    credentials = aws.client("sts").assume_role(
        RoleArn="arn:aws:iam::111111111111:role/reader", RoleSessionName="test"
    )["Credentials"]
    other_account = _client(
        aws,
        "kinesis",
        credentials["AccessKeyId"],
        credentials["SecretAccessKey"],
        credentials["SessionToken"],
    )
    other_account.create_stream(StreamName="theirs", ShardCount=1)
    assert "theirs" in other_account.list_streams()["StreamNames"]
    assert "theirs" not in aws.client("kinesis").list_streams()["StreamNames"]
