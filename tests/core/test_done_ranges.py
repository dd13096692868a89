"""Done runs above the checkpoint, attacked (issue 17 review): the encoding round-trips whatever
the position it is written with, truncation never claims an undone record done, and a new owner
whose mark stops inside a run it inherited writes that run back readable.

Pure parts (hypothesis) and the lease with its low-water tracker, as the dispatcher drives them.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kinesumer.core import done_ranges
from kinesumer.handlers.progress import LowWater
from kinesumer.models import Checkpoint, Position, Record
from kinesumer.read.progress import shard_lease

#: Records of one shard: (sequence number, sub-sequence number), some inside KPL aggregates.
_SHARD = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 4)), min_size=1, max_size=60).map(
    lambda steps: [
        (seq, sub)
        for seq, subs in _cumulative(steps)
        for sub in (range(subs) if subs > 1 else (0,))
    ]
)


def _cumulative(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    seq, out = 49_600_000_000_000_000_000_000_000_000, []
    for gap, subs in steps:
        seq += gap
        out.append((seq, subs))
    return out


def _position(key: tuple[int, int]) -> Position:
    return Position(str(key[0]), key[1])


@settings(max_examples=300, deadline=None)
@given(_SHARD, st.data())
def test_runs_round_trip_from_any_position(
    records: list[tuple[int, int]], data: st.DataObject
) -> None:
    """``above(runs, position)`` encodes and decodes to itself, whatever ``position`` is (inside
    a run included: a new owner's mark can stop inside a run it inherited)."""
    flags = data.draw(st.lists(st.booleans(), min_size=len(records), max_size=len(records)))
    runs = done_ranges.runs_of((_position(k), f) for k, f in zip(records, flags, strict=True))
    base = data.draw(st.none() | st.sampled_from(records).map(_position))
    kept = done_ranges.above(runs, base)
    blob, count = done_ranges.encode(base, kept, budget=1 << 20)
    assert count == len(kept)
    if not kept:
        assert blob == b""
        return
    assert done_ranges.decode(blob) == (base, kept)


@settings(max_examples=300, deadline=None)
@given(_SHARD, st.data(), st.integers(40, 400))
def test_truncation_never_claims_an_undone_record(
    records: list[tuple[int, int]], data: st.DataObject, budget: int
) -> None:
    """Whatever the budget cuts, every record a reader would skip (above the base, inside a
    decoded run) was done."""
    flags = data.draw(st.lists(st.booleans(), min_size=len(records), max_size=len(records)))
    done = {k for k, f in zip(records, flags, strict=True) if f}
    runs = done_ranges.runs_of((_position(k), f) for k, f in zip(records, flags, strict=True))
    base = data.draw(st.none() | st.sampled_from(records).map(_position))
    blob, _ = done_ranges.encode(base, done_ranges.above(runs, base), budget=budget)
    assert len(blob) <= budget
    if not blob:
        return
    decoded_base, decoded = done_ranges.decode(blob)
    assert decoded_base == base
    skip = done_ranges.DoneRuns(decoded)
    floor = done_ranges.key_of(base) if base is not None else None
    for key in records:
        if floor is not None and key <= floor:
            continue
        if skip.contains(_position(key)):
            assert key in done, f"{key} would be skipped but was not done"


def test_a_mark_inside_an_inherited_run_keeps_it_readable() -> None:
    """Owner A wrote runs (105-110) above its checkpoint 100. Owner B fetched only up to 107,
    finished 101-104 itself and passed 105-107 as done: its mark is 107, inside A's run. What B
    writes must still say that 108-110 are done (a third owner must not handle them again),
    and must decode (a run that starts below the mark used to encode a negative gap, which
    every reader refuses, so all runs were lost)."""
    seq = 49_600_000_000_000_000_000_000_000_000

    def key(n: int) -> tuple[int, int]:
        return (seq + n, 0)

    inherited, _ = done_ranges.encode(
        _position(key(100)), [(key(105), key(110)), (key(120), key(125))]
    )
    checkpoint = Checkpoint("s", "shard", str(seq + 100), 0, "b", 2, done=inherited)
    lease = shard_lease(checkpoint)
    tracker = LowWater(lease)
    own = []
    for n in range(101, 108):  # what the dispatcher does with a fetched batch
        record = Record("s", "shard", str(seq + n), 0, "k", b"", None)
        assert lease.progress.mark_delivered(record)
        if lease.progress.skipping and lease.progress.already_done(record):
            tracker.finish(tracker.admit(record))
        else:
            own.append(tracker.admit(record))
    for entry in own:
        tracker.finish(entry)
    position, runs = lease.progress.done_marks()
    assert position == _position(key(107))
    blob, count = done_ranges.encode(position, runs)
    assert count == len(runs)
    base, _ = done_ranges.decode(blob)
    assert base == position
    # The third owner reads after 107 and skips 108-110 and 120-125, nothing else.
    third = shard_lease(Checkpoint("s", "shard", str(seq + 107), 0, "c", 3, done=blob))
    skipped = [
        n
        for n in range(108, 130)
        if third.progress.already_done(Record("s", "shard", str(seq + n), 0, "k", b"", None))
    ]
    assert skipped == [108, 109, 110, *range(120, 126)]


def test_consume_face_stopping_inside_an_inherited_run_keeps_it_readable() -> None:
    """The same through ``consume()``'s path (:meth:`ShardProgress.skip_done`, no handler tracker):
    the next owner passed 101-107 of A's run 101-110 when its checkpoint was written."""
    seq = 49_600_000_000_000_000_000_000_000_000
    inherited, _ = done_ranges.encode(_position((seq + 100, 0)), [((seq + 101, 0), (seq + 110, 0))])
    lease = shard_lease(Checkpoint("s", "shard", str(seq + 100), 0, "b", 2, done=inherited))
    for n in range(101, 108):
        record = Record("s", "shard", str(seq + n), 0, "k", b"", None)
        assert lease.progress.already_done(record) and lease.progress.skip_done(record)
    position, runs = lease.progress.done_marks()
    assert position == _position((seq + 107, 0))
    blob, _ = done_ranges.encode(position, runs)
    third = shard_lease(Checkpoint("s", "shard", str(seq + 107), 0, "c", 3, done=blob))
    assert [
        n
        for n in range(108, 112)
        if third.progress.already_done(Record("s", "shard", str(seq + n), 0, "k", b"", None))
    ] == [108, 109, 110]


def test_skipping_the_first_records_of_a_lease_moves_its_mark() -> None:
    """A new owner whose first records are all inside the inherited runs (through
    ``consume()``): nothing is in the application's hands, so a handoff need not wait, and at
    SHARD_END the shard is drained (its children can start). The mark used to stay at the
    checkpoint (nothing delivered yet was taken for something in hand): the handoff waited out
    ``handoff_timeout`` and a closed shard was never finished."""
    seq = 49_600_000_000_000_000_000_000_000_000
    blob, _ = done_ranges.encode(_position((seq + 100, 0)), [((seq + 100, 0), (seq + 110, 0))])
    lease = shard_lease(Checkpoint("s", "shard", str(seq + 100), 0, "b", 2, done=blob))
    last = _position((seq + 110, 0))
    for n in range(101, 111):
        record = Record("s", "shard", str(seq + n), 0, "k", b"", None)
        assert lease.progress.already_done(record) and lease.progress.skip_done(record)
    lease.progress.mark_fetched(last)
    lease.progress.mark_end()
    assert lease.progress.processed == last
    assert not lease.progress.in_hand
    assert lease.progress.drained
