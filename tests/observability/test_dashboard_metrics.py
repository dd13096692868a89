"""The series added for the dashboard, from real members: enhanced fan-out subscriptions and
their failures (kinesalite + dynalite, with the stand-in SubscribeToShard transport of
``support/efo_fake.py``). The handler-duration histogram is checked from a real run() in
test_telemetry.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY
from support.efo_fake import FakeEfo
from support.group import Member, create_stream, make_config, put, setup_table
from support.wait import eventually

from kinesumer import Record
from kinesumer.consumer.base import engine_of


def value(name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples of the default registry matching ``labels``."""
    total = 0.0
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


async def test_efo_subscriptions_and_their_failures_are_counted(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    """Every shard's first subscription finds it busy (ResourceInUse), and subscriptions end
    every 2 events: each attempt is counted per shard, each refusal by its error code."""
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        enhanced_fan_out=True,
        metrics=True,
        client_id="efo-1",
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    fake = FakeEfo(kinesalite.url, expire_after=2, busy_first=1, event_records=5)
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink)
    engine_of(member.consumer).efo_transport = fake.transport()
    member.start()
    put(kinesalite.url, stream, 0, 60)
    try:
        await eventually(lambda: len(sink) >= 60, what="every record")
        app = {"app": config.app, "client_id": "efo-1", "stream": stream}
        shards = {r.shard_id for _, r in sink}
        before = len(fake.positions)  # every SubscribeToShard the transport was asked for
        by_shard = {
            shard: value("kinesumer_efo_subscriptions_total", **app, shard_id=shard)
            for shard in shards
        }
        after = len(fake.positions)
        # Resubscribing goes on meanwhile; a subscription is counted as it is asked for, a
        # moment before the transport records it (at most one ahead per shard).
        assert before <= sum(by_shard.values()) <= after + len(shards), (by_shard, before)
        assert all(n >= 2 for n in by_shard.values())  # busy first, then subscribed
        busy = value(
            "kinesumer_efo_subscription_failures_total", **app, error="ResourceInUseException"
        )
        assert busy >= 2  # one per shard at least (busy_first=1)
    finally:
        await member.close()
