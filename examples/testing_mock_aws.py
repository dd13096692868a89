"""Testing with moto's in-process ``mock_aws``: the test moto's documentation shows, consuming
with kinesumer. No server, no endpoint: moto answers every AWS call inside the process.

    pip install "kinesumer[testing]"
    pytest examples/testing_mock_aws.py

Enhanced fan-out cannot run in-process (HTTP/2 event streams): under ``mock_aws`` it raises
``InProcessMockUnsupportedError``; test it with the plugin's fixtures (a moto server).
"""

from __future__ import annotations

import boto3
from moto import mock_aws

from kinesumer import Config, Kinesumer, create_state_table
from kinesumer.testing import wait_for


@mock_aws
def test_orders_are_consumed() -> None:
    kinesis = boto3.client("kinesis", region_name="us-east-1")
    kinesis.create_stream(StreamName="orders", ShardCount=2)
    config = Config(
        app="shop",
        dynamodb_table="kinesumer-state",
        region="us-east-1",
        initial_position="TRIM_HORIZON",  # read what was put before the consumer started
    )
    create_state_table(config)
    for n in range(3):
        kinesis.put_record(StreamName="orders", Data=f"order-{n}".encode(), PartitionKey=str(n))

    with Kinesumer(config) as consumer:
        consumer.subscribe(["orders"])
        records = wait_for([b"order-0", b"order-1", b"order-2"], consumer, timeout=30)
    assert sorted(r.data for r in records) == [b"order-0", b"order-1", b"order-2"]
