"""The engine's lifecycle and the lease's, as written down in runtime/lifecycle.py and
group/leases.py: every transition, without I/O."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kinesumer.errors import ConsumerClosedError
from kinesumer.group.external import BatchProgress
from kinesumer.group.leases import Claim, LeaseStatus
from kinesumer.models import Checkpoint, Position, Record
from kinesumer.read.progress import ShardLease, ShardProgress, shard_lease
from kinesumer.runtime.lifecycle import EngineState, Lifecycle


def record(sequence: str) -> Record:
    return Record("s", "shard-0", sequence, 0, "k", b"x", None)


def lease(sequence: str | None = None) -> ShardLease:
    return shard_lease(Checkpoint("s", "shard-0", sequence, owner="me", lease=1))


def state(lifecycle: Lifecycle) -> EngineState:
    """Read afresh (mypy would otherwise keep the state narrowed across transitions)."""
    return lifecycle.state


def status(held: ShardLease) -> LeaseStatus:
    return held.claim.status


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
    assert resumed.progress.processed == resumed.claim.checkpointed == Position("42", 0)
    assert not resumed.progress.in_hand


def test_delivered_then_processed_or_committed() -> None:
    held = lease()
    assert held.progress.mark_delivered(record("1"))
    assert held.progress.in_hand and held.progress.delivered == Position("1", 0)
    held.progress.mark_processed(Position("1", 0))
    assert not held.progress.in_hand
    assert held.progress.mark_delivered(record("2"))
    held.progress.commit_delivered()
    assert held.progress.processed == Position("2", 0) and not held.progress.in_hand
    assert held.progress.mark_delivered(record("3"))
    held.progress.discard_delivered()  # never processed: delivered again by the next owner
    assert held.progress.delivered == Position("2", 0) and not held.progress.in_hand


def test_a_handoff_stops_deliveries_and_ends_released() -> None:
    held = lease()
    assert held.claim.begin_handoff()
    assert status(held) is LeaseStatus.REVOKING
    assert not held.progress.mark_delivered(record("1"))  # dropped: the next owner reads it
    held.claim.release()
    assert status(held) is LeaseStatus.RELEASED
    assert not held.claim.begin_handoff()  # already ended
    assert not held.claim.lose()  # a released lease is not lost


def test_a_fenced_lease_is_lost_once() -> None:
    held = lease()
    held.claim.fence()  # the delivery side, on any thread
    assert status(held) is LeaseStatus.LOST and not held.claim.deliverable
    assert held.claim.lose()  # the checkpointer handles the loss once
    assert not held.claim.lose()
    assert not held.claim.begin_handoff()


def test_finishing_needs_the_end_and_everything_processed() -> None:
    held = lease()
    assert held.progress.mark_delivered(record("5"))
    held.progress.mark_fetched(Position("5", 0))
    assert not held.progress.drained  # not at SHARD_END
    held.progress.mark_end()
    assert not held.progress.drained  # record 5 is in hand
    held.progress.mark_processed(Position("5", 0))
    assert held.progress.drained
    held.claim.finish()
    assert status(held) is LeaseStatus.RELEASED and held.claim.finished


def test_a_batch_read_elsewhere_is_in_hand_until_it_ends() -> None:
    progress = BatchProgress(Claim(Checkpoint("s", "shard-0", owner="me", lease=1)))
    progress.begin_batch()
    progress.begin_batch()
    assert progress.in_hand
    progress.end_batch()
    assert progress.in_hand  # one still open
    progress.complete_batch(Position("5", 0), finished=True)
    assert not progress.drained
    progress.end_batch()
    assert not progress.in_hand and progress.drained and progress.processed == Position("5", 0)
    progress.complete_batch(Position("4", 0), finished=False)  # a late, older batch
    assert progress.processed == Position("5", 0)


class WatchedLock:
    """A lock that says when someone starts to take it."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.entering = threading.Event()

    def __enter__(self) -> None:
        self.entering.set()
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


def test_the_admission_and_a_status_change_take_the_claims_one_lock() -> None:
    """ "Still deliverable? then delivered" must not interleave with a status change: the
    progress takes the claim's lock for it, so an admission that waits on a handoff in
    progress sees the handoff's result and delivers nothing."""
    claim = Claim(Checkpoint("s", "shard-0", owner="me", lease=1))
    watched = WatchedLock()
    claim.lock = watched  # type: ignore[assignment]
    progress = ShardProgress(claim)
    admitted: list[bool] = []
    with watched.inner:  # a status change in progress holds the lock
        thread = threading.Thread(
            target=lambda: admitted.append(progress.mark_delivered(record("1")))
        )
        thread.start()
        assert watched.entering.wait(30), "the admission did not take the claim's lock"
        claim.status = LeaseStatus.REVOKING  # what begin_handoff does under the lock
    thread.join()
    assert admitted == [False] and progress.delivered is None
