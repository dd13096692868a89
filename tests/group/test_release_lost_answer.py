"""A release (handoff or finish) that landed but whose answer was lost: the retry is refused
(the owner is gone already), and the member must recognise its own write instead of logging the
lease as lost (dynalite behind the fault proxy, which forwards the write and then drops the
answer).
"""

from __future__ import annotations

from typing import Any

from support.faultproxy import Fault
from support.group import state_store

from kinesumer.group.checkpointer import Checkpointer
from kinesumer.group.leases import LeaseStatus
from kinesumer.models import Position
from kinesumer.read.progress import ShardLease, shard_lease

SEQUENCE = "49590338271490256608559692538361571095921575989136588802"


async def claimed(store: Any, shard: str) -> ShardLease:
    checkpoint = await store.claim("s", shard, "me", None)
    assert checkpoint is not None
    return shard_lease(checkpoint)


async def test_handoff_whose_answer_was_lost_is_released(proxied: dict[str, Any]) -> None:
    async with state_store(proxied["config"]) as store:
        lease = await claimed(store, "shard-a")
        lease.progress.mark_processed(Position(SEQUENCE, 2))
        checkpointer = Checkpointer(store, "me")
        rule = proxied["dynamodb"].add_rule(
            Fault.lost_response(), service="dynamodb", operation="UpdateItem", count=1
        )
        assert await checkpointer.handoff(lease, timeout=1.0)
        assert rule.fired == 1
        assert lease.claim.status is LeaseStatus.RELEASED
        assert checkpointer.conflicts == 0
        item = (await store.get_checkpoints("s", ["shard-a"]))["shard-a"]
        assert item.owner is None and item.sequence_number == SEQUENCE


async def test_finish_whose_answer_was_lost_is_finished(proxied: dict[str, Any]) -> None:
    async with state_store(proxied["config"]) as store:
        lease = await claimed(store, "shard-b")
        lease.progress.mark_end()
        checkpointer = Checkpointer(store, "me")
        finished: list[ShardLease] = []
        proxied["dynamodb"].add_rule(
            Fault.lost_response(), service="dynamodb", operation="UpdateItem", count=1
        )
        await checkpointer.finish(lease, finished.append)
        assert finished == [lease] and lease.claim.finished


async def test_a_release_refused_for_another_owner_is_still_lost(proxied: dict[str, Any]) -> None:
    """The read-back recognises only its own write: a takeover (new lease) stays a loss."""
    async with state_store(proxied["config"]) as store:
        lease = await claimed(store, "shard-c")
        seen = (await store.get_checkpoints("s", ["shard-c"]))["shard-c"]
        assert await store.claim("s", "shard-c", "other", seen) is not None
        checkpointer = Checkpointer(store, "me")
        assert not await checkpointer.handoff(lease, timeout=1.0)
        assert lease.claim.status is LeaseStatus.LOST
