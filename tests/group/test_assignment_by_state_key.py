"""Two members naming one stream two ways (``orders`` here, its home ARN there, as in a rolling
upgrade) compute one assignment: every shard has exactly one owner, in both members' views."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from kinesumer import Config
from kinesumer.accounts import Home, state_key
from kinesumer.group.coordinator import Coordinator
from kinesumer.models import ClientInfo
from kinesumer.observability.metrics import Metrics

HOME = Home("us-east-1", "123456789012")
ORDERS_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
SHARDS = [f"shardId-{n}" for n in range(3)]


class Members:
    """The membership as the tick reads it: everyone live, nobody leading."""

    def __init__(self, live: list[ClientInfo]) -> None:
        self.live = live
        self.leader = False
        self.is_live = True

    async def read_members(self) -> list[ClientInfo]:
        return []


class Shards:
    """Shard caches of this member's streams, by its names."""

    def __init__(self, streams: tuple[str, ...]) -> None:
        listed = [SimpleNamespace(shard_id=s) for s in SHARDS]
        self.caches = {s: SimpleNamespace(shards=listed, finished=set()) for s in streams}

    def due(self, interval: float) -> bool:
        return False

    async def refresh(self, streams: tuple[str, ...], to_sync: set[str]) -> None:
        return None


class Leases:
    """Records what the tick hands to the leasing; owners come from one table, by state key."""

    def __init__(self, owners: dict[str, dict[str, str]]) -> None:
        self.owners = owners
        self.has_pending = False
        self.wanted: dict[str, tuple[str, ...]] = {}

    async def read_owners(self, streams: Any) -> dict[str, dict[str, str]]:
        return {s: dict(self.owners.get(state_key(s, HOME), {})) for s in streams}

    async def rebalance(self, wanted: dict[str, tuple[str, ...]]) -> None:
        self.wanted = wanted


def coordinator(
    mode: str, client_id: str, streams: tuple[str, ...], live: list[ClientInfo], table: Any
) -> tuple[Coordinator, Leases]:
    config = Config(app="a", dynamodb_table="state", assignment=mode)
    leasing = Leases(table)
    member: Any = Members(live)
    shard_sync: Any = Shards(streams)
    coordinator = Coordinator(config, client_id, {}, member, shard_sync, leasing, Metrics())  # type: ignore[arg-type]
    coordinator.streams = streams
    coordinator.stream_key = partial(state_key, home=HOME)
    return coordinator, leasing


@pytest.mark.parametrize("mode", ["range", "sticky"])
@pytest.mark.parametrize("ids", [("a", "b"), ("b", "a"), ("m1", "m2"), ("x", "c")])
async def test_a_member_naming_orders_and_one_naming_its_home_arn_leave_no_shard_unowned(
    mode: str, ids: tuple[str, str]
) -> None:
    by_name, by_arn = ids
    name_streams = ("billing", "orders")
    arn_streams = ("billing", ORDERS_ARN)
    live = [
        ClientInfo(by_name, 0, frozenset(name_streams), assignment=mode),
        # A member naming a home ARN announces its plain name beside it (member.py).
        ClientInfo(by_arn, 0, frozenset({*arn_streams, "orders"}), assignment=mode),
    ]
    table: dict[str, dict[str, str]] = {}
    first, first_leases = coordinator(mode, by_name, name_streams, live, table)
    second, second_leases = coordinator(mode, by_arn, arn_streams, live, table)
    both = ((first, first_leases, by_name), (second, second_leases, by_arn))
    for _ in range(2):  # sticky: the second tick reads the owners the first one left
        for member, leases, client in both:
            await member.tick()
            for stream, ids_ in leases.wanted.items():
                for shard in ids_:
                    table.setdefault(state_key(stream, HOME), {})[shard] = client

    # Each member leases under its own names ...
    assert set(first_leases.wanted) <= {"billing", "orders"}
    assert set(second_leases.wanted) <= {"billing", ORDERS_ARN}
    # ... and, by state key, every shard of both streams has exactly one owner.
    owned: dict[tuple[str, str], list[str]] = {}
    for leases, client in ((first_leases, by_name), (second_leases, by_arn)):
        for stream, shards in leases.wanted.items():
            for shard in shards:
                owned.setdefault((state_key(stream, HOME), shard), []).append(client)
    expected = {(stream, shard) for stream in ("billing", "orders") for shard in SHARDS}
    assert set(owned) == expected
    assert all(len(owners) == 1 for owners in owned.values()), owned
