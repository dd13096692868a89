"""The engine's lifecycle and the lease's, as written down in runtime/lifecycle.py and
group/leases.py: every transition, without I/O."""

from __future__ import annotations

import asyncio

import pytest

from kinesumer.errors import ConsumerClosedError
from kinesumer.group.leases import Lease, LeaseStatus
from kinesumer.models import Checkpoint, Position, Record
from kinesumer.runtime.lifecycle import EngineState, Lifecycle


def record(sequence: str) -> Record:
    return Record("s", "shard-0", sequence, 0, "k", b"x", None)


def lease(sequence: str | None = None) -> Lease:
    return Lease(Checkpoint("s", "shard-0", sequence, owner="me", lease=1))


def state(lifecycle: Lifecycle) -> EngineState:
    """Read afresh (mypy would otherwise keep the state narrowed across transitions)."""
    return lifecycle.state


def status(held: Lease) -> LeaseStatus:
    return held.status


def test_every_state_has_a_message() -> None:
    assert all(state.message for state in EngineState)
    assert EngineState.CLOSED.message == "this consumer was closed; create a new one"


async def test_join_then_run_then_close() -> None:
    lifecycle = Lifecycle()
    assert state(lifecycle) is EngineState.NEW and not lifecycle.joined
    lifecycle.begin_join()
    assert state(lifecycle) is EngineState.JOINING and lifecycle.joining
    lifecycle.end_join(True)
    assert state(lifecycle) is EngineState.RUNNING and lifecycle.joined
    lifecycle.check()  # running: nothing to raise
    assert lifecycle.begin_close() is EngineState.RUNNING
    assert state(lifecycle) is EngineState.CLOSING
    assert lifecycle.begin_close() is None  # a second close has nothing to do
    lifecycle.closed()
    assert state(lifecycle) is EngineState.CLOSED
    with pytest.raises(ConsumerClosedError):
        lifecycle.check()
    with pytest.raises(ConsumerClosedError):
        lifecycle.begin_join()


async def test_a_failed_join_can_be_tried_again() -> None:
    lifecycle = Lifecycle()
    lifecycle.begin_join()
    lifecycle.end_join(False)
    assert state(lifecycle) is EngineState.NEW and not lifecycle.joined and not lifecycle.joining


async def test_a_failure_is_kept_through_closing() -> None:
    lifecycle = Lifecycle()
    lifecycle.begin_join()
    lifecycle.end_join(True)
    error = RuntimeError("boom")
    assert lifecycle.fail(error)
    assert state(lifecycle) is EngineState.FAILED
    assert not lifecycle.fail(RuntimeError("later"))  # the first error is the one raised
    with pytest.raises(RuntimeError, match="boom"):
        lifecycle.check()
    assert lifecycle.begin_close() is EngineState.FAILED
    lifecycle.closed()
    assert state(lifecycle) is EngineState.CLOSED
    with pytest.raises(RuntimeError, match="boom"):
        lifecycle.check()


async def test_failures_while_closing_are_only_logged() -> None:
    lifecycle = Lifecycle()
    lifecycle.begin_join()
    lifecycle.end_join(True)
    lifecycle.begin_close()
    assert not lifecycle.fail(RuntimeError("late"))
    assert lifecycle.failure is None and state(lifecycle) is EngineState.CLOSING


async def test_a_close_during_the_join_waits_for_it_and_can_be_cancelled() -> None:
    lifecycle = Lifecycle()
    lifecycle.begin_join()
    assert lifecycle.begin_close() is EngineState.JOINING
    waiting = asyncio.ensure_future(lifecycle.wait_joined())
    await asyncio.sleep(0)
    assert not waiting.done()
    lifecycle.end_join(True)
    await asyncio.wait_for(waiting, 1)
    assert state(lifecycle) is EngineState.CLOSING and lifecycle.joined  # the close goes on
    lifecycle.close_cancelled()  # ... unless it was given up: back to what the join left
    assert state(lifecycle) is EngineState.RUNNING


def test_a_lease_resumes_after_its_checkpoint() -> None:
    resumed = lease("42")
    assert status(resumed) is LeaseStatus.ACTIVE
    assert resumed.processed == resumed.checkpointed == Position("42", 0)
    assert not resumed.in_hand


def test_delivered_then_processed_or_committed() -> None:
    held = lease()
    assert held.mark_delivered(record("1"))
    assert held.in_hand and held.delivered == Position("1", 0)
    held.mark_processed(Position("1", 0))
    assert not held.in_hand
    assert held.mark_delivered(record("2"))
    held.commit_delivered()
    assert held.processed == Position("2", 0) and not held.in_hand
    assert held.mark_delivered(record("3"))
    held.discard_delivered()  # never processed: delivered again by the next owner
    assert held.delivered == Position("2", 0) and not held.in_hand


def test_a_handoff_stops_deliveries_and_ends_released() -> None:
    held = lease()
    assert held.begin_handoff()
    assert status(held) is LeaseStatus.REVOKING
    assert not held.mark_delivered(record("1"))  # dropped: the next owner reads it
    held.release()
    assert status(held) is LeaseStatus.RELEASED
    assert not held.begin_handoff()  # already ended
    assert not held.lose()  # a released lease is not lost


def test_a_fenced_lease_is_lost_once() -> None:
    held = lease()
    held.fence()  # the delivery side, on any thread
    assert status(held) is LeaseStatus.LOST and not held.deliverable
    assert held.lose()  # the checkpointer handles the loss once
    assert not held.lose()
    assert not held.begin_handoff()


def test_finishing_needs_the_end_and_everything_processed() -> None:
    held = lease()
    assert held.mark_delivered(record("5"))
    held.mark_fetched(Position("5", 0))
    assert not held.drained  # not at SHARD_END
    held.mark_end()
    assert not held.drained  # record 5 is in hand
    held.mark_processed(Position("5", 0))
    assert held.drained
    held.finish()
    assert status(held) is LeaseStatus.RELEASED and held.finished


def test_a_batch_read_elsewhere_is_in_hand_until_it_ends() -> None:
    held = lease()
    held.begin_batch()
    held.begin_batch()
    assert held.in_hand
    held.end_batch()
    assert held.in_hand  # one still open
    held.mark_end()
    assert not held.drained
    held.end_batch()
    assert not held.in_hand and held.drained
