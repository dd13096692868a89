"""A per-query group's state removed once its checkpoint folder is gone (kinesumer.spark.source.
cleanup): refused while its member heartbeats, then every item of the group and its ledger
deleted. The planner with the real group member, executor reads and ledger on kinesalite +
dynalite."""

from __future__ import annotations

import json
import threading
from typing import Any

import boto3
import pytest
from support.group import create_stream, make_config, put, setup_table

from kinesumer import ConfigError
from kinesumer.group.external import ExternalReadMember
from kinesumer.spark.source.driver.cleanup import forget_query, query_of_checkpoint
from kinesumer.spark.source.driver.groups import group_of
from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_partition
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions
from kinesumer.statestore.dynamodb.spark import group_partitions, ledger_pk
from kinesumer.statestore.dynamodb.table import StateTable

pytest.importorskip("pyarrow")


def items_in(config: Any, pks: list[str]) -> int:
    db = boto3.client("dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1")
    return sum(
        db.query(
            TableName=config.dynamodb_table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
        )["Count"]
        for pk in pks
    )


def test_a_query_s_own_group_is_forgotten_once_it_stopped(
    kinesalite: Any, dynalite: Any, unique_name: Any
) -> None:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 20, key=lambda i: f"k{i % 5}")
    planner = Planner(SourceOptions(config=config, streams=(stream,)))
    planner.initial_offset()
    query = planner.query or ""
    try:
        first = planner.latest_offset(SourceOffset(query, 0).to_json(), None)
        for partition in planner.partitions(first):
            list(read_partition(partition))
        planner.latest_offset(first, None)  # settles batch 1: the group's checkpoints
        planner.commit(first)
        with pytest.raises(ConfigError, match="live member"):
            forget_query(config, [stream], query)
    finally:
        planner.close()
    group = group_of(config.app, query, shared=False)
    pks = [*group_partitions(group, [stream]), ledger_pk(config.app, query)]
    assert items_in(config, pks) >= 2  # the checkpoints of both shards at least
    assert forget_query(config, [stream], query) >= 2
    assert items_in(config, pks) == 0


def test_the_query_is_found_after_spark_purged_the_first_offsets(tmp_path: Any) -> None:
    """Spark keeps only the last minBatchesToRetain (100) offset files: a query that ran
    longer has no offsets/0, and its id is read from the newest file left."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    offset = SourceOffset("q-1234", 151, group="app.spark-q-1234").to_json()
    for batch in (150, 151):
        (offsets / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offset)}\n')
    (offsets / ".151.crc").write_text("")
    assert query_of_checkpoint(tmp_path) == "q-1234"


def test_forget_is_refused_when_the_query_joins_while_looking(
    kinesalite: Any, dynalite: Any, unique_name: Any, monkeypatch: Any
) -> None:
    """No client item at the first look is no proof the query is down: it may be joining (a
    restart racing the clean-up). A member that registers after the first look, while
    forget_query looks, is seen. (client_timeout 10 s: the look's length; a join on the
    stand-ins takes well under that.)"""
    first_look = threading.Event()
    real_query = StateTable.query

    async def query(self: Any, pk: str, *args: Any, **kwargs: Any) -> Any:
        found = await real_query(self, pk, *args, **kwargs)
        if pk.startswith("client#"):
            first_look.set()
        return found

    monkeypatch.setattr(StateTable, "query", query)
    config = make_config(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"), client_timeout=10
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    query = "q" + unique_name("x")
    outcome: list[BaseException | int] = []

    def forget() -> None:
        try:
            outcome.append(forget_query(config, [stream], query))
        except ConfigError as exc:
            outcome.append(exc)

    looking = threading.Thread(target=forget, name="forget")
    looking.start()
    assert first_look.wait(60)
    member = ExternalReadMember(config.replace(app=group_of(config.app, query, shared=False)))
    try:
        member.start([stream])  # the query's restart joins its group meanwhile
        looking.join(60)
    finally:
        member.close()
    assert len(outcome) == 1 and isinstance(outcome[0], ConfigError), outcome
