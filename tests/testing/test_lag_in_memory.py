"""The group's lag (``kinesumer.admin.probe_group_lag`` and ``LagProbe``) on
kinesumer.testing's MemoryKinesis and MemoryState: the same probe as against AWS, through the
Kinesis transport seam, on a Kinesis clock the test moves by hand. Kinesis's clock stands still
unless moved, so the figures are known to the millisecond, within the ``Date`` header's
second (the probe takes the end of the second it names)."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.kpl import aggregate

from kinesumer import Config
from kinesumer.admin import LagProbe, probe_group_lag
from kinesumer.aws import RequestStats
from kinesumer.core.lag import DATE_RESOLUTION_MS, GroupLag, PageVerdict, ProbeStart, StartKind
from kinesumer.errors import StreamNotFoundError
from kinesumer.kinesis.lag_probe import probe_shard
from kinesumer.kinesis.reader import KinesisReader
from kinesumer.models import ClientInfo, Position
from kinesumer.testing import MemoryKinesis, MemoryState

STREAM = "orders"
CONFIG = Config(app="shop", dynamodb_table="kinesumer-state", region="us-east-1")


class KinesisClock:
    """Kinesis's clock: epoch seconds, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def aged(figure: int, age_ms: float) -> bool:
    """``figure`` is a record's age ``age_ms``, within the Date header's second."""
    return age_ms <= figure <= age_ms + DATE_RESOLUTION_MS


async def write(
    state: MemoryState,
    shard_id: str,
    position: Position | None,
    *,
    owner: str = "gone",
    finished: bool = False,
    started_at_ms: int | None = None,
) -> None:
    claimed = await state.claim(STREAM, shard_id, owner, None)
    assert claimed is not None
    if started_at_ms is not None:
        assert await state.record_start(claimed, started_at_ms)
    assert await state.write_checkpoint(claimed, position, finished=finished)


def measure(memory: MemoryKinesis, state: MemoryState, *streams: str) -> GroupLag:
    return asyncio.run(probe_group_lag(CONFIG, list(streams) or None, kinesis=memory, state=state))


def test_a_kpl_aggregate_read_in_part_still_holds_the_oldest_unread_records() -> None:
    """Checkpointed at sub-record 1 of an aggregate of 3: sub-record 2 is unread, and arrived
    with the aggregate. Checkpointed at its last sub-record: the next record is the oldest."""
    clock = KinesisClock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream(STREAM, 1)
    blob = aggregate([("a", b"1"), ("b", b"2"), ("c", b"3")])
    packed = memory.put(STREAM, blob, "a")
    clock.now += 30
    memory.put(STREAM, b"plain", "d")
    clock.now += 10
    state = MemoryState()
    shard = packed["ShardId"]

    asyncio.run(write(state, shard, Position(packed["SequenceNumber"], 1)))
    (row,) = measure(memory, state, STREAM).shards
    assert row.checkpoint == f"{packed['SequenceNumber']}/1"
    assert aged(row.millis_behind, 40_000)

    state = MemoryState()
    asyncio.run(write(state, shard, Position(packed["SequenceNumber"], 2)))
    (row,) = measure(memory, state, STREAM).shards
    assert aged(row.millis_behind, 10_000)


def test_a_latest_start_skips_what_arrived_before_it_and_the_owner_shows_while_live() -> None:
    """With records behind the tip (MemoryKinesis says how far, as AWS does), the probe from a
    LATEST start opens AT_TIMESTAMP and finds the first record at or after it."""
    clock = KinesisClock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream(STREAM, 1)
    for index in range(3):
        shard = memory.put(STREAM, f"old-{index}".encode(), "k")["ShardId"]
        clock.now += 5
    start_ms = int(clock.now * 1000) + 2_500  # between two seconds: the skip is exact
    clock.now += 20
    memory.put(STREAM, b"new-0", "k")
    clock.now += 7
    memory.put(STREAM, b"new-1", "k")
    clock.now += 3
    state = MemoryState()
    asyncio.run(write(state, shard, None, owner="m1", started_at_ms=start_ms))
    # Live by its stamp as ``kinesumer status`` judges it: an hour ahead of this host's clock.
    stamp = int(time.time() * 1000) + 3_600_000
    asyncio.run(state.heartbeat(ClientInfo("m1", stamp, frozenset({STREAM})), 7200))

    (row,) = measure(memory, state, STREAM).shards
    assert (row.owner, row.checkpoint) == ("m1", None)
    assert aged(row.millis_behind, 10_000)


def test_a_caught_up_shard_and_a_finished_parent_have_no_lag_and_an_unknown_stream_is_named() -> (
    None
):
    clock = KinesisClock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream(STREAM, 1)
    last = memory.put(STREAM, b"only", "k")
    clock.now += 60
    state = MemoryState()
    asyncio.run(write(state, last["ShardId"], Position(last["SequenceNumber"])))
    assert measure(memory, state, STREAM).max_millis_behind == 0

    memory.split_shard(STREAM, last["ShardId"], 2**127)
    child = memory.put(STREAM, b"in a child", "k")["ShardId"]
    clock.now += 5
    finished = MemoryState()
    asyncio.run(write(finished, last["ShardId"], Position(last["SequenceNumber"]), finished=True))
    figure = measure(memory, finished, STREAM)
    rows = {row.shard_id: row for row in figure.shards}
    assert len(rows) == 3  # the parent and its two children, from Kinesis's listing
    assert rows[last["ShardId"]].millis_behind == 0
    assert aged(rows[child].millis_behind, 5_000)
    assert figure.max_millis_behind == rows[child].millis_behind

    with pytest.raises(StreamNotFoundError, match="nope"):
        measure(memory, finished, "nope")


def test_a_lag_probe_keeps_its_figure_for_its_interval() -> None:
    """Asked again within ``min_interval`` (its own clock), the probe answers from its last
    figure without a read; after it, it probes again and sees what arrived."""
    clock = KinesisClock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream(STREAM, 1)
    state = MemoryState()
    host = [100.0]
    probe = LagProbe(
        CONFIG, [STREAM], min_interval=10, kinesis=memory, state=state, clock=lambda: host[0]
    )

    async def scenario() -> None:
        first = await probe.measure()
        assert first.max_millis_behind == 0
        memory.put(STREAM, b"late", "k")
        clock.now += 30
        host[0] += 9.9
        assert await probe.measure() is first and probe.probes == 1
        host[0] += 0.2
        again = await probe.measure()
        assert probe.probes == 2 and aged(again.max_millis_behind, 30_000)

    asyncio.run(scenario())


def test_a_probe_out_of_pages_reports_how_far_behind_the_tip_it_got() -> None:
    """From a LATEST start with older records before it, one page is not enough: the probe
    stops at its page budget and reports the page's MillisBehindLatest, an upper bound (the
    unread records lie past that position), with the calls it spent."""
    clock = KinesisClock()
    memory = MemoryKinesis(clock=clock)
    memory.create_stream(STREAM, 1)
    shard = memory.put(STREAM, b"old-0", "k")["ShardId"]
    clock.now += 10
    memory.put(STREAM, b"old-1", "k")
    clock.now += 10
    start = ProbeStart(StartKind.SINCE, since_ms=int(clock.now * 1000))
    memory.put(STREAM, b"new", "k")
    clock.now += 10
    reader = KinesisReader(memory, RequestStats(), "us-east-1")

    probe = asyncio.run(probe_shard(reader, STREAM, shard, start, max_pages=1))
    assert probe.verdict is PageVerdict.READ_ON
    assert probe.millis_behind == 20_000  # old-1's age: the position after old-0
    assert (probe.get_shard_iterator_calls, probe.get_records_calls) == (2, 1)

    probe = asyncio.run(probe_shard(reader, STREAM, shard, start))
    assert probe.verdict is PageVerdict.FOUND and aged(probe.millis_behind, 10_000)
    with pytest.raises(ValueError, match="max_pages"):
        asyncio.run(probe_shard(reader, STREAM, shard, start, max_pages=0))
