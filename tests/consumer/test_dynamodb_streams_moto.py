"""A DynamoDB table's stream read by ARN where a Kinesis stream name goes, on moto in server
mode (it serves ``dynamodbstreams`` at DynamoDB's endpoint): every change delivered, each
item's changes in order, values decoded, checkpoints resumed after a close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from support.group import make_config, setup_table
from support.table_streams import TableChanges, by_item, create_streamed_table, write_changes

from kinesumer import AsyncKinesumer, ConfigError, Kinesumer, Record
from kinesumer.dynamodb_streams import Change, change

Names = Callable[[str], str]


@pytest.fixture
def env(moto_url: str, unique_name: Names) -> dict[str, Any]:
    table = unique_name("items")
    arn = create_streamed_table(moto_url, table)
    # No kinesis_endpoint: a member reading only a table's stream makes no Kinesis call.
    config = make_config(moto_url, moto_url, unique_name("app"), unique_name("state"))
    setup_table(config)
    return {"url": moto_url, "config": config, "arn": arn, "table": table}


def consume(config: Any, arn: str, count: int) -> list[Record]:
    got: list[Record] = []
    with Kinesumer(config) as consumer:
        for record in consumer.consume([arn]):
            got.append(record)
            if len(got) == count:
                break
    return got


def test_every_change_of_a_table_is_delivered_in_item_order_with_decoded_values(
    env: dict[str, Any],
) -> None:
    changes = TableChanges(env["url"], env["table"])
    write_changes(changes, range(30))
    got = consume(env["config"], env["arn"], changes.count)

    assert by_item(got) == changes.expected
    first = change(got[0])
    assert isinstance(first, Change)
    assert first.event_name == "INSERT" and first.stream_view_type == "NEW_AND_OLD_IMAGES"
    assert first.created_at is not None and not first.is_ttl_delete
    assert {r.stream for r in got} == {env["arn"]}
    # The partition key is the item's key (canonical JSON): ordering="key" keeps an item's
    # changes in order.
    assert json.loads(got[0].partition_key) == {"pk": {"S": first.keys["pk"]}}
    assert got[0].sequence_number == first.sequence_number


def test_a_second_consumer_resumes_after_the_checkpoints_of_the_first(
    env: dict[str, Any],
) -> None:
    changes = TableChanges(env["url"], env["table"])
    write_changes(changes, range(20))
    first = consume(env["config"], env["arn"], changes.count)
    before = changes.count
    write_changes(changes, range(20, 30))
    second = consume(env["config"], env["arn"], changes.count - before)

    assert by_item(first + second) == changes.expected  # nothing twice, nothing lost
    assert {r.sequence_number for r in first}.isdisjoint(r.sequence_number for r in second)


async def test_the_async_face_runs_handlers_over_a_tables_stream(env: dict[str, Any]) -> None:
    changes = TableChanges(env["url"], env["table"])
    write_changes(changes, range(12))
    seen: list[Record] = []
    done = asyncio.Event()

    async def handle(record: Record) -> None:
        seen.append(record)
        if len(seen) == changes.count:
            done.set()

    async with AsyncKinesumer(env["config"]) as consumer:
        running = asyncio.create_task(
            consumer.run([env["arn"]], handle, concurrency=4, ordering="key")
        )
        await asyncio.wait_for(done.wait(), 60)
        await consumer.aclose()
        await running
    assert by_item(seen) == changes.expected


def test_fan_out_is_refused_for_a_tables_stream_at_subscribe(env: dict[str, Any]) -> None:
    config = env["config"].replace(enhanced_fan_out=True)
    with Kinesumer(config) as consumer, pytest.raises(ConfigError, match="no enhanced fan-out"):
        consumer.subscribe([env["arn"]])


def test_a_tables_arn_instead_of_its_streams_is_named(env: dict[str, Any]) -> None:
    table_arn = env["arn"].split("/stream/")[0]
    with Kinesumer(env["config"]) as consumer, pytest.raises(ConfigError, match="LatestStreamArn"):
        consumer.subscribe([table_arn])


def test_broadcast_members_each_read_every_change_and_one_resumes_after_its_position(
    env: dict[str, Any],
) -> None:
    """Broadcast mode over a table's stream: each member reads every change (no leases), and a
    member saving its own positions (``broadcast_resume``) restarts after what it committed."""
    changes = TableChanges(env["url"], env["table"])
    write_changes(changes, range(12))
    config = env["config"].replace(broadcast=True)
    first, second = (consume(config, env["arn"], changes.count) for _ in range(2))
    assert by_item(first) == by_item(second) == changes.expected

    resuming = config.replace(client_id="cache-1", broadcast_resume=True)
    before = changes.count
    assert by_item(consume(resuming, env["arn"], before)) == changes.expected
    write_changes(changes, range(12, 20))
    after = consume(resuming, env["arn"], changes.count - before)
    assert by_item(first + after) == changes.expected  # the restart read only the new changes
