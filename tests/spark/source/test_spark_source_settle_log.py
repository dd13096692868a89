"""What the source logs when a batch settles for a shard it no longer holds: the planner knows
only that the lease is gone. After a DynamoDB outage a query that was the group's only member
lets its shards go (its heartbeats did not land): saying the shard "moved to another member"
sends an operator looking for a member that does not exist."""

from __future__ import annotations

import logging

import pytest

from kinesumer.models import Position
from kinesumer.spark.source.driver.settle import Settlement
from kinesumer.spark.source.ledger import LedgerEntry
from kinesumer.spark.source.offsets import SourceOffset, Start

KEY = ("orders", "shardId-000000000000")


class LeaseLostMember:
    """The only member of its group, whose lease on KEY lapsed while DynamoDB was away."""

    def complete(self, key: object, position: object, *, finished: bool = False) -> bool:
        return False

    def abandon(self, key: object) -> None:
        raise AssertionError("the batch read records: it is completed, not abandoned")


def test_a_batch_settled_after_the_lease_was_lost_says_so_without_blaming_another_member(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settlement = Settlement()
    settlement.planned(7, {KEY})
    entry = LedgerEntry(7, *KEY, Position("49590", 0), count=3, caught_up=True, shard_end=False)
    offset = SourceOffset("query", 7, shards={KEY: Start(after=Position("49580", 0), lease=1)})
    with caplog.at_level(logging.WARNING, logger="kinesumer"):
        settlement.settle(LeaseLostMember(), offset, {KEY: entry})  # type: ignore[arg-type]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "another member" not in line
    assert "orders/shardId-000000000000 was no longer held when batch 7 settled" in line
    assert "read again by the shard's next holder" in line
