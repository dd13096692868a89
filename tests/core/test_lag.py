"""The lag probe's pure rules (``kinesumer.core.lag``): where a shard's unread records begin, the
figure of one record, the verdict on one page, the finished-parent rule, and the group's maxima,
property-tested without I/O or clocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinesumer.core.lag import (
    DATE_RESOLUTION_MS,
    GroupLag,
    PageVerdict,
    ProbeStart,
    ShardLag,
    StartKind,
    judge_page,
    probe_start,
    record_lag,
    server_now_ms,
    settled_lag,
)
from kinesumer.models import Position

positions = st.builds(
    Position, st.from_regex(r"[1-9][0-9]{0,55}", fullmatch=True), st.integers(0, 1000)
)
instants = st.integers(0, 2**45)
maybe = st.one_of(st.none(), instants)
lags = st.integers(0, 10**9)
names = st.sampled_from(["orders", "payments", "refunds"])
shard_ids = st.sampled_from([f"shardId-{i:012d}" for i in range(5)])
rows = st.builds(
    ShardLag,
    stream=names,
    shard_id=shard_ids,
    owner=st.one_of(st.none(), st.sampled_from(["m1", "m2"])),
    checkpoint=st.one_of(st.none(), st.from_regex(r"[0-9]{1,56}", fullmatch=True)),
    millis_behind=lags,
    finished=st.booleans(),
)


@given(position=st.one_of(st.none(), positions), started=maybe, pinned=maybe)
def test_a_shard_is_probed_where_its_next_reader_starts(
    position: Position | None, started: int | None, pinned: int | None
) -> None:
    """After the checkpoint when there is one; else at the recorded LATEST start (the Spark
    pin after it); else at TRIM_HORIZON."""
    start = probe_start(position, started, pinned)
    if position is not None:
        assert start == ProbeStart(StartKind.AFTER_CHECKPOINT, position=position)
    elif started is not None:
        assert start == ProbeStart(StartKind.SINCE, since_ms=started)
    elif pinned is not None:
        assert start == ProbeStart(StartKind.SINCE, since_ms=pinned)
    else:
        assert start == ProbeStart(StartKind.TRIM_HORIZON)


@given(now=maybe, arrival=instants, reported=st.one_of(st.none(), lags))
def test_a_records_lag_is_its_age_by_kinesis_clock_at_least_millis_behind_latest(
    now: int | None, arrival: int, reported: int | None
) -> None:
    figure = record_lag(now, arrival, reported)
    assert figure >= 0
    assert figure >= (reported or 0)
    if now is not None:
        assert figure >= now - arrival
    assert figure in {0, reported or 0, (now - arrival) if now is not None else 0}


@given(date=instants)
def test_a_date_header_stands_for_the_end_of_its_second(date: int) -> None:
    """The header drops the fraction: its second's end is never before the answer."""
    assert server_now_ms(date) == date + DATE_RESOLUTION_MS
    assert server_now_ms(None) is None


@given(
    unread=st.integers(0, 3),
    raw=st.integers(0, 3),
    limit=st.integers(1, 3),
    has_next=st.booleans(),
    behind=st.one_of(st.none(), lags),
)
def test_a_page_is_judged_found_caught_up_or_read_on(
    unread: int, raw: int, limit: int, has_next: bool, behind: int | None
) -> None:
    verdict = judge_page(
        unread=unread, raw_count=raw, limit=limit, has_next=has_next, millis_behind_latest=behind
    )
    if unread:
        assert verdict is PageVerdict.FOUND
    elif not has_next:
        assert verdict is PageVerdict.CAUGHT_UP  # a closed shard read to its end
    elif not behind and raw < limit:
        assert verdict is PageVerdict.CAUGHT_UP  # at the tip
    else:
        # Skipped records, or empty pages behind the tip (trimmed or sparse): read on.
        assert verdict is PageVerdict.READ_ON


@pytest.mark.parametrize(
    ("raw", "behind", "verdict"),
    [
        (0, 0, PageVerdict.CAUGHT_UP),  # an empty page at the tip
        (0, 5_000, PageVerdict.READ_ON),  # AWS: an empty page over trimmed or sparse data
        (1, 0, PageVerdict.CAUGHT_UP),  # only the checkpointed record, at the tip
        (2, 0, PageVerdict.READ_ON),  # kinesalite: a full page, though it always says 0
    ],
)
def test_pages_without_an_unread_record(raw: int, behind: int, verdict: PageVerdict) -> None:
    assert (
        judge_page(unread=0, raw_count=raw, limit=2, has_next=True, millis_behind_latest=behind)
        is verdict
    )


@given(finished=st.booleans(), probed=st.integers(-10, 10**9))
def test_a_finished_shard_has_no_lag_an_unfinished_one_counts(finished: bool, probed: int) -> None:
    assert settled_lag(finished, probed) == (0 if finished else max(probed, 0))


@given(shards=st.lists(rows, max_size=12), extra=st.lists(names, max_size=2))
def test_the_group_and_each_stream_take_the_maximum_of_their_shards(
    shards: list[ShardLag], extra: list[str]
) -> None:
    figure = GroupLag.of("shop", "state", shards, extra)
    latest = {(row.stream, row.shard_id): row for row in shards}  # a later row replaces one
    assert list(figure.shards) == [latest[key] for key in sorted(latest)]
    assert figure.max_millis_behind == max((r.millis_behind for r in latest.values()), default=0)
    assert set(figure.streams) == {*extra, *(stream for stream, _ in latest)}
    for stream, most in figure.streams.items():
        mine = [r.millis_behind for r in latest.values() if r.stream == stream]
        assert most == max(mine, default=0)
    assert figure.max_millis_behind == max(figure.streams.values(), default=0)


def test_the_json_document_has_the_documented_keys() -> None:
    figure = GroupLag.of(
        "shop",
        "state",
        [
            ShardLag("orders", "shardId-000000000001", None, "49590", 1_500),
            ShardLag("orders", "shardId-000000000000", "m1", None, 250),
            ShardLag("payments", "shardId-000000000000", None, "7", 0, finished=True),
        ],
        ["refunds"],
    )
    assert figure.to_json() == {
        "app": "shop",
        "table": "state",
        "max_millis_behind": 1_500,
        "streams": {
            "orders": {"max_millis_behind": 1_500},
            "payments": {"max_millis_behind": 0},
            "refunds": {"max_millis_behind": 0},
        },
        "shards": [
            {
                "stream": "orders",
                "shard_id": "shardId-000000000000",
                "owner": "m1",
                "checkpoint": None,
                "millis_behind": 250,
            },
            {
                "stream": "orders",
                "shard_id": "shardId-000000000001",
                "owner": None,
                "checkpoint": "49590",
                "millis_behind": 1_500,
            },
            {
                "stream": "payments",
                "shard_id": "shardId-000000000000",
                "owner": None,
                "checkpoint": "7",
                "millis_behind": 0,
            },
        ],
    }
