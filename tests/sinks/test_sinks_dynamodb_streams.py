"""Exactly-once sinks over a DynamoDB table's stream (issue 38): ``run([<stream ARN>], handler,
sink=...)`` commits every change of the table once, through a member crashed mid-stream whose
standby takes the shard over (moto's table streams have one shard: the second member is a hot
standby until the crash).

moto in server mode serves the watched table, its stream, the state table and the DynamoDB sink
table at one URL (``DynamoDBTransactions``); ``PostgresPositions`` runs unchanged beside a real
PostgreSQL (:mod:`support.postgres`). Each handler counts deliveries per change (keyed by the
change's sequence number), so a change committed twice shows as 2 (DynamoDB) or a second row
(PostgreSQL); the committed changes, in sequence order, are each item's changes in order."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from support.group import make_config, setup_table
from support.postgres import PostgresServer, postgres_server
from support.sink_driver import SinkMember
from support.sinks import dynamodb, sink_table
from support.table_streams import TableChanges, by_item, create_streamed_table, write_changes
from support.wait import eventually

from kinesumer import Record
from kinesumer.sinks import DynamoDBTransaction, DynamoDBTransactions, PostgresPositions

Names = Callable[[str], str]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    table = unique_name("items")
    arn = create_streamed_table(moto_url, table)
    config = make_config(moto_url, moto_url, unique_name("app"), unique_name("state"))
    setup_table(config)
    sink = unique_name("sink")
    sink_table(moto_url, sink)
    changes = TableChanges(moto_url, table)
    return {"url": moto_url, "config": config, "arn": arn, "sink": sink, "changes": changes}


def in_shard_order(datas: list[str]) -> dict[str, list[tuple[str, Any, Any]]]:
    """Each item's changes (event, new image, old image), in the order of their sequence
    numbers (the shard's order)."""
    return by_item(sorted(datas, key=lambda d: int(json.loads(d)["dynamodb"]["SequenceNumber"])))


async def crash_midstream(
    env: dict[str, Any], make: Callable[[], SinkMember], committed: Callable[[], int]
) -> None:
    """A owns the table stream's shard and commits; B stands by; A crashes with changes still
    coming (changes written after the crash too); B takes the shard over from A's last commit
    and commits the rest."""
    changes: TableChanges = env["changes"]
    members: list[SinkMember] = []

    def reached(n: int) -> Callable[[], bool]:
        def check() -> bool:
            for member in members:
                member.check()
            return committed() >= n

        return check

    write_changes(changes, range(20))
    a = make().start()
    members.append(a)
    await eventually(reached(changes.count), 60, "A committing the first changes")
    b = make().start()
    members.append(b)
    write_changes(changes, range(20, 40))
    await eventually(reached(changes.count - 20), 60, "A committing some of the next changes")
    await a.crash()  # what A was handed and did not commit is B's again
    members.remove(a)
    try:
        await eventually(lambda: bool(b.owned()), 60, "B taking the crashed member's shard")
        write_changes(changes, range(40, 50))
        await eventually(reached(changes.count), 60, "every change committed")
    finally:
        await b.close()


def sink_items(url: str, table: str) -> list[dict[str, Any]]:
    client, out, kwargs = dynamodb(url), [], {"TableName": table, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        out += [i for i in page["Items"] if "deliveries" in i and "data" in i]
        if "LastEvaluatedKey" not in page:
            return out
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


async def test_dynamodb_transactions_commit_every_change_once_through_a_crash(
    env: dict[str, Any],
) -> None:
    url, sink, arn = env["url"], env["sink"], env["arn"]

    def handle(records: list[Record], tx: DynamoDBTransaction) -> None:
        for r in records:
            tx.update(
                sink,
                {"pk": r.sequence_number},
                "ADD deliveries :one SET #d = :data",
                names={"#d": "data"},
                values={":one": 1, ":data": r.data.decode()},
            )

    def make() -> SinkMember:
        return SinkMember(
            env["config"], arn, DynamoDBTransactions(), handle, pace=0.02, runner=True
        )

    await crash_midstream(env, make, lambda: len(sink_items(url, sink)))
    items = sink_items(url, sink)
    assert {
        i["pk"]["S"]: int(i["deliveries"]["N"]) for i in items if i["deliveries"]["N"] != "1"
    } == {}
    assert in_shard_order([i["data"]["S"] for i in items]) == env["changes"].expected


async def test_postgres_positions_commit_every_change_once_through_a_crash(
    env: dict[str, Any], postgres: PostgresServer, unique_name: Names
) -> None:
    records, positions = (unique_name(n).replace("-", "_") for n in ("records", "positions"))
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {records} (seq text, data text)")

    async def handle(batch: list[Record], conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.cursor() as cursor:
            await cursor.executemany(
                f"INSERT INTO {records} (seq, data) VALUES (%s, %s)",
                [(r.sequence_number, r.data.decode()) for r in batch],
            )

    def rows() -> list[tuple[str, str]]:
        with postgres.connect() as conn:
            return list(conn.execute(f"SELECT seq, data FROM {records}").fetchall())

    def make() -> SinkMember:
        sink = PostgresPositions(postgres.conninfo, table=positions)
        return SinkMember(env["config"], env["arn"], sink, handle, pace=0.02, runner=True)

    await crash_midstream(env, make, lambda: len(rows()))
    got = rows()
    assert len(got) == len({seq for seq, _ in got}), "a change committed twice"
    assert in_shard_order([data for _, data in got]) == env["changes"].expected
