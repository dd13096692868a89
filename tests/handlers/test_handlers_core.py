"""The handler runner's pure parts: the per-key scheduler, the low-water tracker, run()'s checks.

Property tests (hypothesis) drive the scheduler and the tracker with random arrivals and random
completion orders; no AWS, no threads except where thread-safety is the point.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.dispatch import GOOD, dispatch_for, handle, lease_of, record

from kinesumer import ConfigError
from kinesumer.handlers.options import Batch, run_options
from kinesumer.handlers.policies import Discard, Stop
from kinesumer.handlers.progress import LowWater
from kinesumer.handlers.scheduler import Call, Scheduler
from kinesumer.models import Checkpoint, Record
from kinesumer.read.progress import ShardLease, shard_lease


# -- the scheduler ---------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.sampled_from("abcde"), min_size=1, max_size=60),
    seed=st.integers(0, 2**32),
    ordering=st.sampled_from(["key", "shard", "none"]),
    max_in_flight=st.integers(1, 12),
    batch_size=st.integers(1, 4),
    one_key=st.booleans(),
)
def test_scheduler_orders_keys_and_respects_the_bound(
    keys: list[str], seed: int, ordering: str, max_in_flight: int, batch_size: int, one_key: bool
) -> None:
    rng = random.Random(seed)  # arrivals, takes and completions interleave at random
    scheduler: Scheduler[tuple[str, int]] = Scheduler(
        ordering != "none", max_in_flight, batch_size, one_key_per_call=one_key
    )
    pending = list(enumerate(keys))  # (sequence, key) in arrival order
    in_flight: list[Call[tuple[str, int]]] = []
    started: dict[str, list[int]] = defaultdict(list)
    seen: list[int] = []
    while pending or in_flight or scheduler.admitted:
        action = rng.choice(["add", "take", "done"])
        if action == "add" and pending and scheduler.room() > 0:
            seq, key = pending.pop(0)
            scheduler.add((key, seq), key if ordering != "none" else None)
        elif action == "take":
            call = scheduler.take(force=rng.random() < 0.5)
            if call is None:
                continue
            assert 1 <= len(call.items) <= batch_size
            if one_key and ordering != "none":
                assert len({k for k, _ in call.items}) == 1
            if ordering != "none":
                busy = {k for c in in_flight for k, _ in c.items}
                assert not busy & {k for k, _ in call.items}, "a key has two calls in flight"
            for key, seq in call.items:
                started[key].append(seq)
                seen.append(seq)
            in_flight.append(call)
        elif action == "done" and in_flight:
            index = rng.randrange(len(in_flight))
            scheduler.done(in_flight.pop(index))
        elif not pending and not in_flight:
            # Only forced takes remain useful: drain.
            call = scheduler.take(force=True)
            assert call is not None, "records admitted but nothing may start"
            for key, seq in call.items:
                started[key].append(seq)
                seen.append(seq)
            in_flight.append(call)
        assert 0 <= scheduler.admitted <= max_in_flight
    assert sorted(seen) == list(range(len(keys))), "every record dispatched exactly once"
    if ordering != "none":
        for key, seqs in started.items():
            assert seqs == sorted(seqs), f"key {key} started out of order"


def test_scheduler_worked_example() -> None:
    scheduler: Scheduler[str] = Scheduler(True, 10, batch_size=2)
    for item in ("a1", "a2", "b1", "a3"):
        scheduler.add(item, item[0])
    first = scheduler.take()
    assert first is not None and first.items == ["a1", "a2"]
    second = scheduler.take()
    assert second is not None and second.items == ["b1"]
    assert scheduler.take() is None
    scheduler.done(first)
    third = scheduler.take()
    assert third is not None and third.items == ["a3"]


def test_scheduler_waits_for_a_full_batch_unless_forced() -> None:
    scheduler: Scheduler[int] = Scheduler(False, 10, batch_size=3)
    scheduler.add(1)
    scheduler.add(2)
    assert scheduler.take(force=False) is None
    scheduler.add(3)
    full = scheduler.take(force=False)
    assert full is not None and full.items == [1, 2, 3]
    scheduler.add(4)
    forced = scheduler.take(force=True)
    assert forced is not None and forced.items == [4]


def test_scheduler_drop_forgets_waiting_records_only() -> None:
    scheduler: Scheduler[str] = Scheduler(True, 10)
    for item in ("a1", "x1", "a2", "x2"):
        scheduler.add(item, item[0])
    running = scheduler.take()
    assert running is not None and running.items == ["a1"]
    assert scheduler.drop(lambda item: item.endswith("2")) == ["a2", "x2"]
    assert scheduler.admitted == 2
    nxt = scheduler.take()
    assert nxt is not None and nxt.items == ["x1"]
    scheduler.done(running)
    assert scheduler.take() is None


# -- the low-water tracker -------------------------------------------------------------------
def lease() -> ShardLease:
    return shard_lease(Checkpoint("s", "shard-0", owner="me", lease=1))


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_low_water_never_passes_an_unfinished_record(order: list[int], finished: int) -> None:
    owned = lease()
    tracker = LowWater(owned)
    entries = [tracker.admit(record(i)) for i in range(30)]
    done: set[int] = set()
    for i in order[:finished]:
        tracker.finish(entries[i])
        done.add(i)
        processed = owned.progress.processed
        prefix = 0
        while prefix in done:
            prefix += 1
        if prefix == 0:
            assert processed is None
        else:
            assert processed is not None
            assert int(processed.sequence_number) == prefix - 1, "mark is not the done prefix"


def test_low_water_from_many_threads_ends_at_the_last_record() -> None:
    owned = lease()
    tracker = LowWater(owned)
    entries = [tracker.admit(record(i)) for i in range(4000)]
    parts = [entries[i::8] for i in range(8)]
    marks: list[int] = []

    def finish(part: list[Any]) -> None:
        for entry in reversed(part):
            tracker.finish(entry)
            if owned.progress.processed is not None:
                marks.append(int(owned.progress.processed.sequence_number))

    threads = [threading.Thread(target=finish, args=(part,)) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (
        owned.progress.processed is not None
        and int(owned.progress.processed.sequence_number) == 3999
    )
    assert tracker.pending == 0


async def handle_async(record: Record) -> None:
    pass


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("concurrency", 0),
        ("concurrency", 1.5),
        ("concurrency", True),
        ("ordering", "partition"),
        ("max_in_flight", 0),
        ("max_in_flight", "many"),
        ("batch", 10),
        ("on_failure", "retry"),
        ("decode", 42),
        ("sink", object()),
        ("name", ""),
    ],
)
def test_bad_run_arguments_name_the_argument(argument: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        run_options(handle, is_async=False, **{**GOOD, argument: value})
    assert raised.value.field == argument
    assert str(raised.value).startswith(f"run({argument}): ")


def test_handler_kind_must_match_the_face() -> None:
    with pytest.raises(ConfigError, match=r"run\(handler\).*coroutine"):
        run_options(handle_async, is_async=False, **GOOD)
    with pytest.raises(ConfigError, match=r"run\(handler\).*coroutine"):
        run_options(handle, is_async=True, **GOOD)
    with pytest.raises(ConfigError, match=r"run\(handler\)"):
        run_options("nope", is_async=False, **GOOD)  # type: ignore[arg-type]


def test_a_sink_needs_shard_ordering() -> None:
    class Sink:
        def attach(self, engine: Any) -> None: ...
        def transact_sync(self, *args: Any) -> None: ...

    with pytest.raises(ConfigError, match=r"run\(ordering\)"):
        run_options(handle, is_async=False, **{**GOOD, "sink": Sink(), "ordering": "key"})


@pytest.mark.parametrize(("field", "value"), [("max_size", 0), ("max_wait", -1.0)])
def test_bad_batch_settings(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"Batch\({field}\)"):
        Batch(**{field: value})


def test_defaults() -> None:
    options = run_options(handle, is_async=False, **GOOD)
    assert options.on_failure == Stop() and options.name == "handle"
    assert options.max_in_flight >= 100
    big = run_options(
        handle,
        is_async=False,
        **{**GOOD, "concurrency": 8, "batch": Batch(50), "on_failure": Discard()},
    )
    assert big.max_in_flight == 2 * 8 * 50 and big.batch_size == 50


# -- outcome counters ------------------------------------------------------------------------
def test_handler_counters_feed_stats_and_prometheus() -> None:
    from prometheus_client import CollectorRegistry

    from kinesumer.handlers.counters import HandlerCounters
    from kinesumer.observability.metrics import PrometheusMetrics

    registry = CollectorRegistry()
    counters = HandlerCounters("orders", PrometheusMetrics("app", "c1", registry))
    counters.add("ok", 5)
    counters.add("ok")
    counters.add("dead_lettered")
    assert counters.snapshot() == {"ok": 6, "dead_lettered": 1}
    labels = {"app": "app", "client_id": "c1", "handler": "orders"}
    value = registry.get_sample_value
    assert value("kinesumer_handler_records_total", {**labels, "outcome": "ok"}) == 6
    assert value("kinesumer_handler_records_total", {**labels, "outcome": "dead_lettered"}) == 1
    with pytest.raises(ValueError, match="unknown handler outcome"):
        counters.add("fine")


def test_dispatch_drops_the_queue_of_a_lost_lease_and_goes_on() -> None:
    from kinesumer.sinks.base import LeaseLostError

    dispatch = dispatch_for(concurrency=1, ordering="key")
    kept, lost = lease_of("shard-0"), lease_of("shard-1")
    dispatch.set_batch(lost, [record(i, f"k{i}", "shard-1") for i in range(5)])
    dispatch.admit()
    dispatch.set_batch(kept, [record(i, f"k{i}", "shard-0") for i in range(5)])
    dispatch.admit()
    call = dispatch.next_call(0.0)
    assert call is not None and call.items[0].lease is lost
    dispatch.finished(call, LeaseLostError("s", "shard-1", 1, "fence refused"))
    assert [lease for lease, _ in dispatch.lost] == [lost], "the engine is told"
    assert dispatch.failure is None, "a lost lease does not stop the run"
    started = []
    while (nxt := dispatch.next_call(0.0)) is not None:
        started += nxt.items
        dispatch.finished(nxt, None)
    assert {entry.lease for entry in started} == {kept}
    assert len(started) == 5


def test_dispatch_sweeps_released_leases_and_stops_on_failure() -> None:
    dispatch = dispatch_for(concurrency=2, ordering="none")
    gone, other = lease_of("shard-0"), lease_of("shard-1")
    dispatch.set_batch(gone, [record(i) for i in range(3)])
    dispatch.admit()
    dispatch.set_batch(other, [record(i, shard="shard-1") for i in range(3)])
    dispatch.admit()
    gone.claim.lose()
    dispatch.sweep()
    assert dispatch.scheduler.admitted == 3
    first = dispatch.next_call(0.0)
    assert first is not None and first.items[0].lease is other
    dispatch.finished(first, ValueError("bug below the handler"))
    assert dispatch.stopping and dispatch.next_call(0.0) is None
    assert isinstance(dispatch.handler_error(), ValueError)


def test_dispatch_batch_timer() -> None:
    dispatch = dispatch_for(concurrency=1, batch=Batch(4, max_wait=1.0))
    owned = lease_of("shard-0")
    dispatch.set_batch(owned, [record(i) for i in range(2)])
    dispatch.admit()
    assert dispatch.next_call(10.0) is None  # a partial batch waits
    assert dispatch.wait_time(10.5) == pytest.approx(0.5)
    late = dispatch.next_call(11.0)
    assert late is not None and len(late.items) == 2
    dispatch.set_batch(owned, [record(i) for i in range(2, 8)])
    dispatch.admit()
    assert dispatch.next_call(11.0) is None, "one call in flight at concurrency 1"
    dispatch.finished(late, None)
    full = dispatch.next_call(11.0)
    assert full is not None and len(full.items) == 4, "a full batch starts at once"


def test_a_handoff_gives_up_only_the_unstarted_tail() -> None:
    """Key ordering: records 0 1 3 started, 2 waits behind its key, 4 queued. A handoff gives up
    4 (nothing after it started) but not 2 (3 after it is started); once 0-3 are done the lease
    holds nothing in hand and its mark is 3."""
    from kinesumer.models import Position

    owned = lease()
    tracker = LowWater(owned)
    entries = []
    for i in range(5):
        assert owned.progress.mark_delivered(record(i))
        entries.append(tracker.admit(record(i)))
    for i in (0, 1, 3):
        entries[i].started = True
    assert owned.claim.begin_handoff()
    assert tracker.give_up_unstarted() == [entries[4]]
    for i in (0, 1, 3, 2):
        entries[i].started = True
        tracker.finish(entries[i])
    assert owned.progress.processed == Position(f"{3:056d}") == owned.progress.delivered
    assert not owned.progress.in_hand


def test_dispatch_lets_a_handoff_wait_only_for_calls_in_flight() -> None:
    dispatch = dispatch_for(concurrency=1, ordering="shard")
    owned = lease_of("shard-0")
    dispatch.set_batch(owned, [record(i) for i in range(6)])
    dispatch.admit()
    call = dispatch.next_call(0.0)
    assert call is not None and len(call.items) == 1
    assert owned.claim.begin_handoff()
    dispatch.sweep()
    assert dispatch.scheduler.admitted == 1, "the five queued records were given up"
    (entry,) = call.items
    entry.tracker.finish(entry)
    dispatch.finished(call, None)
    assert not owned.progress.in_hand and owned.progress.processed == entry.position
    assert dispatch.next_call(0.0) is None
