"""An ``on_assigned`` hook that raises (kinesalite + dynalite, the default LATEST): the error is
raised from ``consume()``, the member's state is ``failed``, and the shards it had just claimed
are released at once (another member takes them without waiting out ``client_timeout``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from support.group import create_stream, make_config, setup_table
from support.wait import wait_until

from kinesumer import Kinesumer


class HookFailed(RuntimeError):
    pass


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    # A long client_timeout: a shard left owned by the failed member would stay so for a
    # minute, far beyond the waits below.
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
        client_timeout=60.0,
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    return {"config": config, "stream": stream}


def owners(config: Any, stream: str) -> dict[str, str | None]:
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    )
    items = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
        ConsistentRead=True,
    )["Items"]
    return {item["sk"]["S"]: item.get("owner", {}).get("S") for item in items}


def test_failing_on_assigned_releases_the_shards_and_fails(group: dict[str, Any]) -> None:
    config, stream = group["config"], group["stream"]

    def assigned(shards: list[tuple[str, str]]) -> None:
        raise HookFailed("the application could not load its state")

    failing = Kinesumer(config.replace(client_id="a"), on_assigned=assigned)
    try:
        with pytest.raises(HookFailed):
            next(iter(failing.consume([stream])))
        assert failing.stats().state == "failed"
        claimed = owners(config, stream)
        assert len(claimed) == 2, "the member claimed nothing before its hook"
        assert set(claimed.values()) == {None}, f"still owned after the raise: {claimed}"
    finally:
        failing.close()
    with Kinesumer(config.replace(client_id="b")) as other:
        other.subscribe([stream])  # joins: claims what the assignment gives it
        wait_until(
            lambda: set(owners(config, stream).values()) == {"b"}, 20, "b owning both shards"
        )


def test_failing_on_assigned_after_the_join_gives_the_shard_back(group: dict[str, Any]) -> None:
    """The hook fails on a shard gained by a rebalance after the join (the member that held it
    handed it off): raised from consume(), state failed, and the member that handed it off
    takes it back at once (the failed member left the group)."""
    config, stream = group["config"], group["stream"]

    def assigned(shards: list[tuple[str, str]]) -> None:
        raise HookFailed("the application could not load its state")

    with Kinesumer(config.replace(client_id="b")) as holder:
        holder.subscribe([stream])
        wait_until(lambda: set(owners(config, stream).values()) == {"b"}, 20, "b owning both")
        joining = Kinesumer(config.replace(client_id="a"), on_assigned=assigned)
        try:
            with pytest.raises(HookFailed):
                for _ in joining.consume([stream]):
                    pass
            assert joining.stats().state == "failed"
            assert "a" not in set(owners(config, stream).values())
        finally:
            joining.close()
        wait_until(lambda: set(owners(config, stream).values()) == {"b"}, 20, "b owning both again")
