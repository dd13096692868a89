"""The future ``Producer.put`` returns (``kinesumer/producer/futures.py``): one object until looked
at, and from the holder's side exactly a ``concurrent.futures.Future``, whichever comes first of
the producer settling it and the holder waiting, adding callbacks, cancelling or wrapping it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from support.group import create_stream
from support.standins import NodeStandIn

from kinesumer import Producer, PutResult
from kinesumer.errors import RecordRejectedError
from kinesumer.producer.futures import LAZY, RecordFuture, settle

RESULT = PutResult("shardId-000000000000", "1", 0)


def _tracked_parts(future: object) -> list[object]:
    """What the garbage collector reaches from ``future`` that it also tracks (but its class)."""
    return [
        part
        for part in gc.get_referents(future)
        if gc.is_tracked(part) and part is not type(future)
    ]


def _has_lock(future: object) -> bool:
    """Whether ``future`` holds a Condition (directly, or one step further)."""
    parts = gc.get_referents(future)
    return any(isinstance(p, threading.Condition) for p in parts + gc.get_referents(*parts))


def test_this_python_gets_the_lazy_future() -> None:
    assert LAZY, "concurrent.futures.Future's attributes changed: RecordFuture needs a look"


def test_put_returns_a_future_that_holds_no_lock_until_looked_at(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("p")
    create_stream(kinesalite.url, stream, 1)
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1") as producer:
        future = producer.put(stream, b"x", partition_key="k")
        producer.flush()
        # Written and settled, never looked at: no Condition, no waiter or callback list.
        assert [type(part) for part in _tracked_parts(future)] == [PutResult]
    assert isinstance(future, concurrent.futures.Future)
    assert future.result().shard_id == "shardId-000000000000"


def test_an_unlooked_at_future_is_one_tracked_object_settled_or_not() -> None:
    future: RecordFuture[PutResult] = RecordFuture()
    assert _tracked_parts(future) == []
    future.settle(RESULT)
    assert [type(part) for part in _tracked_parts(future)] == [PutResult]
    assert future.result() == RESULT and future.done()


def test_result_waits_in_another_thread_until_settled() -> None:
    future: RecordFuture[PutResult] = RecordFuture()
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(future.result(timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not _has_lock(future) and time.monotonic() < deadline:
        time.sleep(0.001)  # until the waiter has looked (made the lock) and waits
    assert _has_lock(future)
    future.settle(RESULT)
    waiter.join(10)
    assert got == [RESULT]


def test_callbacks_run_once_whether_added_before_or_after_settling() -> None:
    calls: list[str] = []
    before: RecordFuture[PutResult] = RecordFuture()
    before.add_done_callback(lambda f: calls.append(f"before {f.result().sequence_number}"))
    before.settle(RESULT)
    after: RecordFuture[PutResult] = RecordFuture()
    after.settle(RESULT)
    after.add_done_callback(lambda f: calls.append(f"after {f.result().sequence_number}"))
    assert calls == ["before 1", "after 1"]


def test_errors_wait_as_completed_and_cancel_behave_as_standard() -> None:
    failed: RecordFuture[PutResult] = RecordFuture()
    error = RecordRejectedError("s", "InvalidArgumentException", "no")
    settle(failed, error=error)
    assert failed.exception() is error
    with pytest.raises(RecordRejectedError):
        failed.result()

    pending: list[RecordFuture[PutResult]] = [RecordFuture() for _ in range(3)]
    timer = threading.Timer(0.05, lambda: [f.settle(RESULT) for f in pending])
    timer.start()
    done, not_done = concurrent.futures.wait(pending, timeout=10)
    assert len(done) == 3 and not not_done
    more: list[RecordFuture[PutResult]] = [RecordFuture() for _ in range(2)]
    threading.Timer(0.05, lambda: [f.settle(RESULT) for f in more]).start()
    assert [f.result() for f in concurrent.futures.as_completed(more, timeout=10)] == [RESULT] * 2

    cancelled: RecordFuture[PutResult] = RecordFuture()
    assert cancelled.cancel()
    cancelled.settle(RESULT)  # the producer's late answer is dropped, as for a standard future
    assert cancelled.cancelled()
    assert "cancelled" in repr(cancelled)


def test_asyncio_wraps_it() -> None:
    future: RecordFuture[PutResult] = RecordFuture()

    async def main() -> PutResult:
        wrapped = asyncio.wrap_future(future)
        asyncio.get_running_loop().call_later(0.01, future.settle, RESULT)
        return await asyncio.wait_for(wrapped, 10)

    assert asyncio.run(main()) == RESULT


# A first look that a garbage collection interrupts, whose gc callback (a stand-in for a cyclic
# object's finalizer, or a signal handler) looks at another unlooked future in the same thread.
_LOOK_DURING_A_COLLECTION = """
import gc
from kinesumer.producer.futures import RecordFuture
unlooked = [RecordFuture() for _ in range(1000)]
def look(phase, info):
    if phase == "start" and unlooked:
        unlooked.pop().done()
gc.callbacks.append(look)
gc.set_threshold(1)  # every allocation may collect: the first look's own included
RecordFuture().done()
gc.set_threshold(700)
print("looked")
"""


def test_a_first_look_survives_a_collection_that_looks_at_another_future() -> None:
    # In a child process: before the fix this thread deadlocked on the module's lock, held
    # while the first look allocated its Condition (the timeout only bounds that hang).
    child = subprocess.run(
        [sys.executable, "-c", _LOOK_DURING_A_COLLECTION],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert child.stdout.strip() == "looked", child.stderr


class _CancelledWhileChecked(concurrent.futures.Future[PutResult]):
    """A standard future (this Python's fallback) its holder's thread cancels between the
    producer's ``done()`` check and its ``set_result``."""

    def done(self) -> bool:
        was_done = super().done()
        self.cancel()
        return was_done


def test_settling_a_standard_future_cancelled_meanwhile_does_not_raise() -> None:
    future = _CancelledWhileChecked()
    settle(future, RESULT)  # raised InvalidStateError on the producer's loop before the fix
    assert future.cancelled()
