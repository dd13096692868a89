"""Lambda-style controls (issue 23): ``run(max_record_age)``, ``Batch(bisect_on_error=True)``.

A record older than ``max_record_age`` goes to the failure policy instead of the handler; its age
is measured on Kinesis's clock as the reads showed it (arrival timestamps and
``MillisBehindLatest``), never against this host's wall clock. A failing batch is split in halves
until the failing record is alone: only it reaches the policy's final action.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from support.invocation import (
    Counters,
    FakeFactory,
    FakeKinesis,
    Options,
    invocation,
    lease,
)

from kinesumer import ConfigError, Record
from kinesumer.handlers import Batch, Block, DeadLetter, Discard, Retry, RetryLater
from kinesumer.handlers.age import KinesisClock, RecordTooOldError
from kinesumer.handlers.invoke import CallEnvironment, Invocation
from kinesumer.handlers.options import run_options
from kinesumer.models import Checkpoint
from kinesumer.read.progress import shard_lease

#: Far from this host's clock on purpose: only Kinesis's timestamps may decide a record's age.
T0 = datetime(2001, 1, 1, tzinfo=timezone.utc)


def at(seconds: float, seq: int, data: bytes = b"x") -> Record:
    arrival = T0 + timedelta(seconds=seconds)
    return Record("orders", "shardId-000000000001", str(seq), 0, f"k{seq}", data, arrival)


def handled_by(**options: Any) -> tuple[Any, Any, list[Any], FakeKinesis]:
    client = FakeKinesis()
    seen: list[Any] = []
    made, counters = invocation(seen.append, client, **options)
    return made, counters, seen, client


def test_records_older_than_max_record_age_go_to_the_policy() -> None:
    """Read together: the newest arrived at T0+300 s, so Kinesis's clock is past that; the
    record of T0 is 300 s old there (> 60 s), the one of T0+290 s 10 s old."""
    made, counters, seen, client = handled_by(
        max_record_age=60.0, on_failure=DeadLetter("orders-dlq")
    )
    owned = lease()
    records = [at(0, 1), at(290, 2), at(300, 3)]
    made.observe(records, owned)  # the runner, as the engine's batch arrives
    for record in records:
        made.call_sync([record], owned, threading.Event())
    assert [r.sequence_number for r in seen] == ["2", "3"]
    [dead] = client.puts
    assert dead["PartitionKey"] == "k1"
    assert counters.counts == {"too_old": 1, "dead_lettered": 1, "ok": 2}


def test_this_hosts_wall_clock_is_not_used() -> None:
    """Records stamped in 2001, read at the tip (MillisBehindLatest 0): young by Kinesis's
    clock, however old by this host's."""
    made, counters, seen, _ = handled_by(max_record_age=60.0, on_failure=Discard())
    owned = lease()
    owned.progress.observe_read(0, 2)
    made.call_sync([at(0, 1)], owned, threading.Event())
    made.call_sync([at(1, 2)], owned, threading.Event())
    assert len(seen) == 2 and counters.counts == {"ok": 2}


def test_millis_behind_latest_moves_the_clock() -> None:
    """One record read 5 minutes behind the tip: the tip arrived 300 s after it, so it is at
    least 300 s old."""
    made, counters, seen, _ = handled_by(max_record_age=60.0, on_failure=Discard())
    owned = lease()
    owned.progress.observe_read(300_000, 1)
    made.call_sync([at(0, 1)], owned, threading.Event())
    assert seen == [] and counters.counts == {"too_old": 1, "discarded": 1}


def test_too_old_is_not_retried_nor_sent_to_retry_later() -> None:
    made, counters, seen, client = handled_by(
        max_record_age=1.0,
        on_failure=RetryLater("orders-retry", retry=Retry(attempts=5), then=DeadLetter("dlq")),
    )
    owned = lease()
    owned.progress.observe_read(10_000, 1)
    made.call_sync([at(0, 1)], owned, threading.Event())
    assert seen == []
    assert [put["StreamName"] for put in client.puts] == ["dlq"]
    assert counters.counts == {"too_old": 1, "dead_lettered": 1}


def test_the_kinesis_clock_advances_by_elapsed_monotonic_time_only() -> None:
    now = [100.0]
    clock = KinesisClock(monotonic=lambda: now[0])
    assert clock.now_ms() is None and clock.age(at(0, 1)) is None
    clock.observe([at(10, 1)], 0)
    now[0] += 50
    assert clock.age(at(10, 1)) == pytest.approx(50.0)
    error = clock.too_old(at(0, 1), 30.0)
    assert isinstance(error, RecordTooOldError) and error.age == pytest.approx(60.0)
    clock.observe([at(5, 2)], 0)  # an older instant never moves the clock back
    assert clock.age(at(10, 1)) == pytest.approx(50.0)


def test_a_batch_spanning_shards_is_aged_by_each_shards_own_lag() -> None:
    """Default ordering ("key"), batches, no sink: one call may hold records of two shards and
    is made with the first record's lease. Shard 1 is an hour behind its tip, shard 2 is at its
    tip: shard 1's MillisBehindLatest says nothing of shard 2's records. Added with shard 2's
    newest arrival it would put Kinesis's clock an hour in the future, and the record that just
    arrived on shard 2 would be an hour old (discarded without ever reaching the handler)."""
    made, counters, seen, _ = handled_by(
        max_record_age=60.0, batch=Batch(max_size=8), on_failure=Discard()
    )
    behind, at_tip = lease(), shard_lease(Checkpoint("orders", "shardId-000000000002"))
    behind.progress.observe_read(3_600_000, 1)
    at_tip.progress.observe_read(0, 1)
    old = at(0, 1)  # shard 1: an hour behind its tip, T0 + 3600 s
    fresh = Record("orders", "shardId-000000000002", "2", 0, "k2", b"x", T0 + timedelta(hours=1))
    made.observe([old], behind)  # the runner, as each engine batch arrives
    made.observe([fresh], at_tip)
    made.call_sync([old, fresh], behind, threading.Event())  # one call, the first one's lease
    assert [r.sequence_number for r in seen[0]] == ["2"]
    assert counters.counts == {"too_old": 1, "discarded": 1, "ok": 1}


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "60", True])
def test_bad_max_record_age_is_named(value: object) -> None:
    with pytest.raises(ConfigError, match="max_record_age"):
        options(max_record_age=value)


def test_max_record_age_with_block_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"max_record_age.*Block"):
        options(max_record_age=60.0, on_failure=Block())


def options(**given: Any) -> Any:
    every = {
        "concurrency": 1,
        "ordering": "shard",
        "max_in_flight": None,
        "batch": None,
        "on_failure": None,
        "decode": None,
        "sink": None,
        "name": None,
        **given,
    }
    return run_options(lambda record: None, is_async=False, **every)


# ---- bisect on error -------------------------------------------------------------------------
class FailsOn:
    """A batch handler failing every call that holds a record with data in ``bad``."""

    def __init__(self, *bad: bytes) -> None:
        self.bad = set(bad)
        self.calls: list[list[bytes]] = []
        self.succeeded: list[bytes] = []

    def __call__(self, records: list[Record]) -> None:
        datas = [r.data for r in records]
        self.calls.append(datas)
        if self.bad & set(datas):
            raise RuntimeError("bad record in the batch")
        self.succeeded += datas


def batch_of(n: int) -> list[Record]:
    return [at(i, i, b"%d" % i) for i in range(n)]


def test_bisect_isolates_the_failing_record() -> None:
    handler = FailsOn(b"5")
    client = FakeKinesis()
    made, counters = invocation(
        handler,
        client,
        batch=Batch(max_size=8, bisect_on_error=True),
        on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=1)),
    )
    made.call_sync(batch_of(8), lease(), threading.Event())
    assert handler.calls == [
        [b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7"],
        [b"0", b"1", b"2", b"3"],
        [b"4", b"5", b"6", b"7"],
        [b"4", b"5"],
        [b"4"],
        [b"5"],
        [b"6", b"7"],
    ]
    assert sorted(handler.succeeded) == sorted(b"%d" % i for i in range(8) if i != 5)
    assert [put["PartitionKey"] for put in client.puts] == ["k5"]
    assert counters.counts["ok"] == 7 and counters.counts["dead_lettered"] == 1


def test_without_bisect_the_whole_batch_goes_to_the_policy() -> None:
    handler = FailsOn(b"5")
    client = FakeKinesis()
    made, counters = invocation(
        handler,
        client,
        batch=Batch(max_size=8),
        on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=1)),
    )
    made.call_sync(batch_of(8), lease(), threading.Event())
    assert len(handler.calls) == 1 and len(client.puts) == 8
    assert counters.counts == {"dead_lettered": 8}


def test_bisect_with_two_failing_records_and_stop() -> None:
    """Under Stop the first isolated failing record stops the run; the records before it in
    its key order were handled."""
    from kinesumer.handlers.policies import HandlerFailedError

    handler = FailsOn(b"2", b"6")
    made, _ = invocation(handler, batch=Batch(max_size=8, bisect_on_error=True))
    with pytest.raises(HandlerFailedError) as raised:
        made.call_sync(batch_of(8), lease(), threading.Event())
    assert raised.value.record.data == b"2"
    assert sorted(handler.succeeded) == [b"0", b"1"]


def test_bisect_on_error_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="bisect_on_error"):
        Batch(bisect_on_error="yes")  # type: ignore[arg-type]


def test_an_added_handlers_key_of_raising_goes_to_its_own_policy() -> None:
    """add_handler(keys=..., key_of=...) whose key_of raises on one payload (the field is
    missing): that handler's policy (here DeadLetter) disposes of the record and the handler is
    not called with it; the filter does not stop the whole run (a poison record would stop
    every restart) nor skip the record silently."""
    from kinesumer.handlers.policies import KeyOfError
    from kinesumer.handlers.registry import AddedHandler, KeyOfCheck, wanted

    asked: list[str] = []

    def owner(record: Record) -> str:
        asked.append(record.sequence_number)
        return str(record.data.split(b"=")[1], "ascii")

    seen: list[Any] = []
    client = FakeKinesis()
    counters = Counters()
    made = Invocation(  # as add_handler builds it
        seen.append,
        Options(on_failure=DeadLetter("audit-dlq")),
        FakeFactory(client),  # type: ignore[arg-type]
        counters,  # type: ignore[arg-type]
        False,
        environment=CallEnvironment(write_attempts=2),
        refuse=(check := KeyOfCheck("audit", owner)),
    )
    audit = AddedHandler("audit", made, None, frozenset({"o7"}), check)
    good, other, bad = at(0, 1, b"owner=o7"), at(1, 2, b"owner=o8"), at(2, 3, b"no owner")
    calls = wanted([(good, (audit,)), (other, (audit,)), (bad, (audit,))])
    assert [(h, [r.sequence_number for r in rs]) for h, rs in calls] == [(audit, ["1", "3"])]
    for record in calls[0][1]:
        made.call_sync([record], lease(), threading.Event())
    assert [r.sequence_number for r in seen] == ["1"]
    [dead] = client.puts
    assert dead["StreamName"] == "audit-dlq" and dead["PartitionKey"] == "k3"
    assert counters.counts == {"ok": 1, "dead_lettered": 1}
    assert sorted(asked) == ["1", "2", "3"], "key_of runs once per record"
    assert audit.wants(bad) and isinstance(check(bad), KeyOfError) and check(bad) is None


def test_a_retry_later_round_is_aged_from_when_it_became_due() -> None:
    """RetryLater(delay=120) with max_record_age=60: a record read back from the retry stream
    waits out its delay before it is handled. Aged by its arrival there, every round would be
    120 s old once due, and go to ``then`` without the handler ever being tried again. Its age
    counts from its arrival plus the delay (a duration: no clock of this host compared with
    Kinesis's)."""
    wall, mono = [1_000_000.0], [50.0]
    seen: list[Any] = []
    fails = [True]

    def handler(record: Record) -> None:
        if fails.pop(0) if fails else False:
            raise RuntimeError("down")
        seen.append(record)

    client = FakeKinesis()
    policy = RetryLater("orders-retry", delay=120.0, retry=Retry(attempts=1), then=Discard())
    counters = Counters()
    made = Invocation(
        handler,
        Options(on_failure=policy, max_record_age=60.0),
        FakeFactory(client),  # type: ignore[arg-type]
        counters,  # type: ignore[arg-type]
        False,
        environment=CallEnvironment(clock=lambda: wall[0], write_attempts=2),
    )
    made.kinesis_clock = KinesisClock(monotonic=lambda: mono[0])
    first = at(0, 1)
    owned = lease()
    owned.progress.observe_read(0, 1)
    made.observe([first], owned)
    made.call_sync([first], owned, threading.Event())  # fails: to the retry stream
    [put] = client.puts
    assert put["StreamName"] == "orders-retry"
    # Read back at once (arrived 1 s later on the retry stream, at its tip), due 120 s later.
    back = Record(
        "orders-retry",
        "shardId-000000000001",
        "7",
        0,
        put["PartitionKey"],
        put["Data"],
        T0 + timedelta(seconds=1),
    )
    retry_lease = shard_lease(Checkpoint("orders-retry", "shardId-000000000001"))
    retry_lease.progress.observe_read(0, 1)
    made.observe([back], retry_lease)
    wall[0] += 120.0
    mono[0] += 120.0
    made.call_sync([back], retry_lease, threading.Event())
    assert [r.sequence_number for r in seen] == ["1"]  # the original, handled on its round
    assert counters.counts == {"retry_later": 1, "ok": 1}


@pytest.mark.parametrize("bad", [{0}, {5}, {7}, {3, 7}, {6, 7}])
def test_bisect_with_a_sink_commits_each_record_exactly_once_in_order(bad: set[int]) -> None:
    """With an exactly-once sink each half that succeeds commits its writes with its own end
    (a failed attempt's writes are rolled back), so every good record is written once, the
    committed ends only move forward, the last commit carries the call's end (a disposed last
    half commits it alone), and the dead letters come in the records' order."""
    from support.invocation import FakeSink

    def handler(values: list[Record], tx: list[int]) -> None:
        numbers = [int(v.data) for v in values]
        if bad & set(numbers):
            raise RuntimeError("bad record in the batch")
        tx.extend(numbers)

    sink, client = FakeSink(), FakeKinesis()
    made, _ = invocation(
        handler,
        client,
        sink=sink,
        batch=Batch(max_size=8, bisect_on_error=True),
        on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=1)),
    )
    made.call_sync(batch_of(8), lease(), threading.Event())
    written = [n for _, tx in sink.commits for n in tx]
    assert written == [n for n in range(8) if n not in bad]
    ends = [int(end.sequence_number) for end, _ in sink.commits]
    assert ends == sorted(set(ends)) and ends[-1] == 7
    assert [put["PartitionKey"] for put in client.puts] == [f"k{n}" for n in sorted(bad)]
