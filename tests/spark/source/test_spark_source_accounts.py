"""The Spark source and sink over Kinesis streams of several accounts and regions (issue 36), on
local Spark and moto in server mode (streams kept per account and region; an assumed role's
credentials act in its account): one query reads ``orders`` of account A in us-east-1 and
eu-west-1 and of account B (through ``accounts``' role of B) by ARN, every record once; the
sink writes by ARN into B; the other connectors' ``streamARN`` / ``roleArn`` are understood."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.accounts import A, B, arn, datas, role_in_b, three_places
from support.group import make_config, setup_table
from support.spark_source import Collector, local_spark, run_to_end, start_query

from kinesumer import AccountAccess, ConfigError
from kinesumer.spark import KinesumerDataSource
from kinesumer.spark.sink.writer import parse_sink_options
from kinesumer.spark.source.options import parse_options, to_options

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

Names = Callable[[str], str]
ROLE_B = role_in_b("orders-reader")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark() as session:
        session.dataSource.register(KinesumerDataSource)
        yield session


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    name = unique_name("orders")
    clients = three_places(moto_url, name, ROLE_B, shards=2)
    arns = {
        "a-us": arn("us-east-1", A, name),
        "a-eu": arn("eu-west-1", A, name),
        "b-us": arn("us-east-1", B, name),
    }
    return {"url": moto_url, "name": name, "clients": clients, "arns": arns}


@pytest.mark.slow
def test_one_query_reads_streams_of_two_accounts_and_two_regions_every_record_once(
    spark: Any, env: dict[str, Any], unique_name: Names, tmp_path: Any
) -> None:
    """One query over three streams named by ARN (two accounts, two regions, one through a
    role): every record once, each under its ARN. Its length (about 30 s) is the query's own:
    a join that assumes the role, batches until all three places are drained, and the leave."""
    url, name, clients, arns = env["url"], env["name"], env["clients"], env["arns"]
    expected: Counter[tuple[str, bytes]] = Counter()
    for key, client in clients.items():
        for n in range(15):
            data = f"{key}:{n}".encode()
            client.put_record(StreamName=name, Data=data, PartitionKey=f"k{n % 4}")
            expected[(arns[key], data)] += 1
    config = make_config(
        url,
        url,
        unique_name("app"),
        unique_name("state"),
        sts_endpoint=url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
        handoff_timeout=30.0,
        client_timeout=6.0,
        heartbeat_interval=0.5,
    )
    setup_table(config)
    collector = Collector()
    query = start_query(
        spark, config, sorted(arns.values()), collector, str(tmp_path / "ck"), available_now=True
    )
    run_to_end(query)
    got = Counter((row[0], bytes(row[5])) for row in collector.rows())
    assert got == expected


def test_the_sink_writes_by_arn_into_another_account(spark: Any, env: dict[str, Any]) -> None:
    url, name = env["url"], env["name"]
    rows = [(f"{i}".encode(), f"k{i % 3}") for i in range(20)]
    frame = spark.createDataFrame(rows, "data binary, partition_key string")
    (
        frame.repartition(1)
        .write.format("kinesumer")
        .mode("append")
        .option("region", "us-east-1")
        .option("kinesis_endpoint", url)
        .option("sts_endpoint", url)
        .option("accounts", json.dumps({B: {"role_arn": ROLE_B}}))
        .option("streamARN", env["arns"]["b-us"])
        .save()
    )
    assert sorted(int(d) for d in datas(env["clients"]["b-us"], name)) == list(range(20))
    assert datas(env["clients"]["a-us"], name) == []


def test_stream_arns_and_account_roles_are_options_by_our_names_and_the_other_connectors(
    env: dict[str, Any],
) -> None:
    base = {"app": "shop", "dynamodb_table": "state", "region": "us-east-1"}
    parsed = parse_options(
        {
            **base,
            "streamARN": env["arns"]["a-eu"],
            "roleArn": f"arn:aws:iam::{A}:role/home",
            "accounts": json.dumps({B: {"roleArn": ROLE_B, "externalId": "ext-1"}}),
            "kinesis_endpoints": json.dumps({"eu-west-1": "http://127.0.0.1:1"}),
        }
    )
    assert parsed.streams == (env["arns"]["a-eu"],)
    assert parsed.config.role_arn == f"arn:aws:iam::{A}:role/home"
    assert parsed.config.accounts == {B: AccountAccess(role_arn=ROLE_B, external_id="ext-1")}
    assert parsed.config.kinesis_endpoints == {"eu-west-1": "http://127.0.0.1:1"}
    again = parse_options(to_options(parsed.config, parsed.streams))
    assert again.config.accounts == parsed.config.accounts
    assert again.config.kinesis_endpoints == parsed.config.kinesis_endpoints
    accounts = json.dumps({B: {"role_arn": ROLE_B}})
    sink = parse_sink_options({"streamARN": env["arns"]["b-us"], "accounts": accounts})
    assert sink.stream == env["arns"]["b-us"]
    assert sink.producer["accounts"] == {B: AccountAccess(role_arn=ROLE_B)}
    with pytest.raises(ConfigError, match="accounts"):
        parse_options({**base, "streams": "orders", "accounts": json.dumps({B: "a role"})})
