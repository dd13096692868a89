"""``kinesumer lag`` on kinesalite and dynalite, with no member running: the figure comes from the
streams themselves.

Checkpoints are written through the state store's own calls (claim, write_checkpoint,
record_start), as members write them, by owners that have no client item (no member is live),
except one written with a heartbeat stamp far ahead so that it stays live however slow the
machine is.

Timing: kinesalite runs on this host, so its arrival stamps and ``Date`` headers are on this
host's clock, and a shard's true lag during the command is the command's start and end minus the
arrival of its oldest unread record. The probe's figure must lie within those bounds widened by
:data:`MARGIN_MS`: the ``Date`` header counts whole seconds (the probe takes the end of the second
it names, so it may be up to a second above), and node caches it per second (so it may name the
second before). Nothing waits on a timer racing the machine: the waits only space arrivals apart,
and every assertion reads the arrival stamps back from kinesalite.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, kinesis, make_config, put, setup_table, state_store
from support.standins import NodeStandIn

from kinesumer import Config, cli
from kinesumer.models import ClientInfo, Position

Names = Callable[[str], str]

#: How far the figure may lie outside the command's own span (see the module docstring).
MARGIN_MS = 1_000


@pytest.fixture
def group(kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names) -> dict[str, Any]:
    app, table = unique_name("app"), unique_name("state")
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    where = ["--app", app, "--table", table, "--region", "us-east-1"]
    where += ["--dynamodb-endpoint", dynalite.url, "--kinesis-endpoint", kinesalite.url]
    return {"config": config, "where": where, "url": kinesalite.url, "names": unique_name}


def lag_json(
    capsys: pytest.CaptureFixture[str], g: dict[str, Any], *extra: str
) -> tuple[dict[str, Any], float, float]:
    """``kinesumer lag --json``'s document, and this host's clock (ms) before and after it."""
    before = time.time() * 1000
    code = cli.main(["lag", "--json", *g["where"], *extra])
    after = time.time() * 1000
    out, err = capsys.readouterr()
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document, before, after


def arrivals(url: str, stream: str, shard_id: str) -> list[tuple[str, float]]:
    """The shard's records as (sequence number, arrival in epoch ms), oldest first."""
    client = kinesis(url)
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = client.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
    return [
        (r["SequenceNumber"], r["ApproximateArrivalTimestamp"].timestamp() * 1000) for r in records
    ]


def shard_ids(url: str, stream: str) -> list[str]:
    return sorted(s["ShardId"] for s in kinesis(url).list_shards(StreamName=stream)["Shards"])


def spaced() -> None:
    """Let this host's clock (kinesalite's) move 2.5 s on: the next records arrive apart from
    the last ones, by more than the ``Date`` header's second."""
    time.sleep(2.5)  # no race: the assertions read the arrival stamps back, not this sleep


async def checkpoint(
    config: Config,
    stream: str,
    shard_id: str,
    sequence_number: str | None,
    *,
    owner: str = "gone-member",
    finished: bool = False,
    started_at_ms: int | None = None,
) -> None:
    """A checkpoint written as a member writes it: claimed, the start recorded, the position
    (and finished flag) written under the claim; the shard is left owned by ``owner``."""
    async with state_store(config) as store:
        claimed = await store.claim(stream, shard_id, owner, None)
        assert claimed is not None
        if started_at_ms is not None:
            assert await store.record_start(claimed, started_at_ms)
        position = None if sequence_number is None else Position(sequence_number)
        assert await store.write_checkpoint(claimed, position, finished=finished)


async def heartbeat_ahead(config: Config, client_id: str, streams: frozenset[str]) -> None:
    """A client item stamped an hour ahead: live for the whole test on any machine."""
    async with state_store(config) as store:
        stamp = int(time.time() * 1000) + 3_600_000
        await store.heartbeat(ClientInfo(client_id, stamp, streams), ttl_seconds=7200)


def within(figure: int, arrival_ms: float, before: float, after: float) -> None:
    """``figure`` is the age of a record that arrived at ``arrival_ms`` at some moment of the
    command (``before``..``after``, this host's clock), give or take :data:`MARGIN_MS`."""
    low, high = before - arrival_ms - MARGIN_MS, after - arrival_ms + MARGIN_MS
    assert low <= figure <= high, (figure, low, high)


def rows_of(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["stream"], row["shard_id"]): row for row in document["shards"]}


def test_lag_with_no_member_is_the_age_of_the_oldest_record_not_yet_checkpointed(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Three streams: ``behind`` read up to its first batch (its owner gone), ``caught_up``
    read to its last record (its owner live), ``untouched`` never read (no checkpoint: readers
    start at TRIM_HORIZON). The figures are the oldest unread records' ages, 0 when read; each
    stream's and the group's maximum are their rows' maxima."""
    names, url, config = group["names"], group["url"], group["config"]
    behind, caught_up, untouched = names("behind"), names("caught"), names("untouched")
    for stream in (behind, caught_up, untouched):
        create_stream(url, stream, 1)
    put(url, untouched, 0, 3)
    put(url, behind, 0, 5)
    put(url, caught_up, 0, 4)
    spaced()
    put(url, behind, 5, 5)
    (shard,) = shard_ids(url, behind)
    behind_records = arrivals(url, behind, shard)
    caught_records = arrivals(url, caught_up, shard)
    untouched_records = arrivals(url, untouched, shard)
    # Two batches, further apart than the margins.
    assert behind_records[5][1] - behind_records[4][1] >= 2_000

    asyncio.run(checkpoint(config, behind, shard, behind_records[4][0]))
    asyncio.run(checkpoint(config, caught_up, shard, caught_records[-1][0], owner="live-member"))
    asyncio.run(heartbeat_ahead(config, "live-member", frozenset({caught_up})))
    streams = [a for s in (behind, caught_up, untouched) for a in ("--stream", s)]
    document, before, after = lag_json(capsys, group, *streams)

    assert set(document) == {"app", "table", "max_millis_behind", "streams", "shards"}
    assert (document["app"], document["table"]) == (config.app, config.dynamodb_table)
    rows = rows_of(document)
    assert set(rows) == {(behind, shard), (caught_up, shard), (untouched, shard)}
    late = rows[(behind, shard)]
    assert late["owner"] is None  # its owner has no client item: not live
    assert late["checkpoint"] == behind_records[4][0]
    within(late["millis_behind"], behind_records[5][1], before, after)
    read = rows[(caught_up, shard)]
    assert (read["owner"], read["checkpoint"], read["millis_behind"]) == (
        "live-member",
        caught_records[-1][0],
        0,
    )
    never = rows[(untouched, shard)]
    assert (never["owner"], never["checkpoint"]) == (None, None)
    within(never["millis_behind"], untouched_records[0][1], before, after)

    # Ordering: a shard with unread records is behind one read to its end; per stream and for
    # the group, the maximum of the rows.
    assert late["millis_behind"] > 0 and never["millis_behind"] > 0
    assert document["streams"] == {
        stream: {"max_millis_behind": rows[(stream, shard)]["millis_behind"]}
        for stream in (behind, caught_up, untouched)
    }
    assert document["max_millis_behind"] == max(row["millis_behind"] for row in rows.values())


def test_a_finished_parent_has_no_lag_and_an_unfinished_one_counts(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two streams split after records were put. ``done``'s parent is checkpointed finished:
    0, though it holds records; ``waiting``'s parent is checkpointed half-way: its oldest unread
    record's age, and the stream's maximum, while its children (no checkpoint: TRIM_HORIZON)
    count their own records."""
    names, url, config = group["names"], group["url"], group["config"]
    done, waiting = names("done"), names("waiting")
    for stream in (done, waiting):
        create_stream(url, stream, 1)
        put(url, stream, 0, 4)
    spaced()  # the parents' records arrive well before the children's
    parents = {}
    for stream in (done, waiting):
        (parents[stream],) = shard_ids(url, stream)
        client = kinesis(url)
        client.split_shard(
            StreamName=stream,
            ShardToSplit=parents[stream],
            NewStartingHashKey=str(2**127),
        )
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
        put(url, stream, 4, 20)  # into the children
    parent_records = {s: arrivals(url, s, parents[s]) for s in (done, waiting)}
    asyncio.run(checkpoint(config, done, parents[done], parent_records[done][-1][0], finished=True))
    asyncio.run(checkpoint(config, waiting, parents[waiting], parent_records[waiting][1][0]))

    document, before, after = lag_json(capsys, group, "--stream", done, "--stream", waiting)

    rows = rows_of(document)
    assert rows[(done, parents[done])]["millis_behind"] == 0
    unfinished = rows[(waiting, parents[waiting])]
    within(unfinished["millis_behind"], parent_records[waiting][2][1], before, after)
    for stream in (done, waiting):
        children = [
            (shard, rows[(stream, shard)])
            for shard in shard_ids(url, stream)
            if shard != parents[stream]
        ]
        assert len(children) == 2
        for shard, row in children:
            child_records = arrivals(url, stream, shard)
            if child_records:  # both halves got some of the 20 keys, most likely
                within(row["millis_behind"], child_records[0][1], before, after)
            else:
                assert row["millis_behind"] == 0
        # The children's records came after the parent's: the waiting parent is the stream's
        # maximum; the finished one is not counted at all.
        assert document["streams"][stream]["max_millis_behind"] == max(
            row["millis_behind"] for (s, _), row in rows.items() if s == stream
        )
    assert document["streams"][waiting]["max_millis_behind"] == unfinished["millis_behind"]
    assert document["max_millis_behind"] == max(
        document["streams"][s]["max_millis_behind"] for s in (done, waiting)
    )


def test_lag_from_a_recorded_latest_start_counts_only_what_arrived_after_it(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A shard read from LATEST keeps its start while it has no position: the records before
    it are not the group's to read, the ones after are."""
    names, url, config = group["names"], group["url"], group["config"]
    stream = names("latest")
    create_stream(url, stream, 1)
    put(url, stream, 0, 3)
    spaced()
    (shard,) = shard_ids(url, stream)
    old = arrivals(url, stream, shard)
    start_ms = int(old[-1][1]) + 500  # between the two batches
    spaced()
    put(url, stream, 3, 2)
    records = arrivals(url, stream, shard)
    asyncio.run(checkpoint(config, stream, shard, None, started_at_ms=start_ms))

    document, before, after = lag_json(capsys, group, "--stream", stream)

    (row,) = document["shards"]
    assert row["checkpoint"] is None
    within(row["millis_behind"], records[3][1], before, after)


def test_lag_prints_a_table_per_stream_and_names_an_unknown_stream(
    group: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The text form: the group's maximum, then per stream its maximum and one row per shard.
    A stream Kinesis does not know is a one-line error (exit 1); so is a missing table."""
    names, url = group["names"], group["url"]
    stream = names("text")
    create_stream(url, stream, 2)
    code = cli.main(["lag", *group["where"], "--stream", stream])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"app {group['config'].app}  table ")
    assert "group lag 0 ms (the most of 2 shards)" in lines[0]
    assert f"stream {stream}: lag 0 ms" in lines
    assert sum(1 for line in lines if line.strip().startswith("shardId-")) == 2

    missing = names("missing")
    code = cli.main(["lag", *group["where"], "--stream", missing])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert "does not exist" in err and missing in err and "Traceback" not in err

    where = list(group["where"])
    where[where.index("--table") + 1] = names("no-table")
    code = cli.main(["lag", *where, "--stream", stream])
    _, err = capsys.readouterr()
    assert code == 1 and "does not exist" in err and "create-table" in err
