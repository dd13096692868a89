"""The lag figure's error against the true time behind (kinesalite + dynalite, zero members).

Records are put into chosen shards (by explicit hash key) at moments spaced apart; checkpoints
are written through the state store's own calls (claim, record_start, write_checkpoint) by an
owner that has no client item, as a member that has since gone would have left them. Then
:func:`kinesumer.admin.group_lag` probes the group several times, at different phases of the
second.

The true age: kinesalite stamps arrivals and its ``Date`` header with this host's clock, so
Kinesis's "now" for a probe (the answer that opened the shard's iterator, whose ``Date`` the
probe takes) lies between this host's clock just before that GetShardIterator was sent
(``sent``) and just after its answer came (``answered``): the probes read through a Kinesis
transport that notes both around each call (:class:`TimedTransport`). A shard's true time
behind at that moment is it minus the ApproximateArrivalTimestamp of its oldest unread record,
read back from kinesalite (whole milliseconds, exact). The documented figure (the ``Date``
header's second taken at its end, :data:`kinesumer.core.lag.DATE_RESOLUTION_MS`: never below
the true age, at most a second above) must then satisfy::

    sent - arrival  <=  figure  <=  answered - arrival + MARGIN_MS

that is, at least the true age when the call was sent, and at most the true age then plus a
second (the whole-second ``Date``) plus the call's own latency (``answered - sent``, measured
per call and printed: a few ms here). ``MARGIN_MS`` is 1,000: 999 ms of the ``Date``'s dropped
fraction and 1 ms for the arrival's truncation to whole milliseconds in the probe. One more
probe through :func:`kinesumer.admin.group_lag` (its own clients) is held to the same bounds
with the whole call as the window (its latency includes the DynamoDB reads and the clients'
setup, a few hundred ms here).

A ``Date`` that names a second which had ended before the call was sent is kinesalite's
(node caches the header for a second and resets it by a timer); no probe could do better with
it. Such a sample is counted and printed, and held only to the upper bound.

The observed error (the figure minus the true age when the call was sent, and when its answer
came) is printed, min/median/max over the probes: run with ``-s`` to read it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from support.group import create_stream, kinesis, make_config, setup_table, state_store
from support.standins import NodeStandIn

from kinesumer import Config
from kinesumer.admin import group_lag, probe_group_lag
from kinesumer.aws import ClientFactory
from kinesumer.core.lag import GroupLag
from kinesumer.kinesis.transport import AwsKinesisTransport, IteratorAnswer, IteratorType
from kinesumer.models import Position

Names = Callable[[str], str]

#: The figure's documented excess over the true age at its ``Date`` (see the docstring).
MARGIN_MS = 1_000
#: Probes made, spaced so that they fall at different phases of the ``Date``'s second.
PROBES = 10
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def ms_of(arrival: datetime) -> int:
    return (arrival - EPOCH) // timedelta(milliseconds=1)


def put_into(client: Any, stream: str, hash_key: str, tag: str, count: int) -> None:
    for i in range(count):
        client.put_record(
            StreamName=stream,
            Data=f"{tag}-{i}".encode(),
            PartitionKey=tag,
            ExplicitHashKey=hash_key,
        )


def arrivals(client: Any, stream: str, shard_id: str) -> list[tuple[str, int]]:
    """The shard's records as (sequence number, arrival in epoch ms), oldest first."""
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    return [
        (r["SequenceNumber"], ms_of(r["ApproximateArrivalTimestamp"]))
        for r in client.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
    ]


async def checkpoint(
    config: Config,
    stream: str,
    shard_id: str,
    sequence_number: str | None,
    started_at_ms: int | None = None,
) -> None:
    """A checkpoint as a member writes it (claimed, start recorded, position written under the
    claim), left owned by a member that is gone (no client item)."""
    async with state_store(config) as store:
        claimed = await store.claim(stream, shard_id, "gone-member", None)
        assert claimed is not None
        if started_at_ms is not None:
            assert await store.record_start(claimed, started_at_ms)
        position = None if sequence_number is None else Position(sequence_number)
        assert await store.write_checkpoint(claimed, position)


class TimedTransport(AwsKinesisTransport):
    """The AWS transport, noting this host's clock (epoch ms) before each GetShardIterator is
    sent and after its answer came, and the answer's ``Date``, by shard."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.calls: dict[str, tuple[float, float, datetime | None]] = {}

    async def get_shard_iterator(
        self,
        stream: str,
        shard_id: str,
        iterator_type: IteratorType,
        *,
        sequence_number: str | None = None,
        timestamp: datetime | None = None,
    ) -> IteratorAnswer:
        sent = time.time() * 1000
        answer = await super().get_shard_iterator(
            stream, shard_id, iterator_type, sequence_number=sequence_number, timestamp=timestamp
        )
        self.calls[shard_id] = (sent, time.time() * 1000, answer.served_at)
        return answer


async def timed_probe(
    config: Config, stream: str
) -> tuple[GroupLag, dict[str, tuple[float, float, datetime | None]]]:
    async with ClientFactory(config).kinesis() as client:
        transport = TimedTransport(client)
        figure = await probe_group_lag(config, [stream], kinesis=transport)
    return figure, transport.calls


def spread(values: list[float]) -> str:
    return f"min {min(values):.0f} median {statistics.median(values):.0f} max {max(values):.0f}"


def test_the_lag_figure_is_the_true_age_plus_at_most_a_second_and_the_probes_latency(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names
) -> None:
    url = kinesalite.url
    config = make_config(url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("stream")
    create_stream(url, stream, 4)
    client = kinesis(url)
    shards = sorted(client.list_shards(StreamName=stream)["Shards"], key=lambda s: s["ShardId"])
    ids = [s["ShardId"] for s in shards]
    hash_of = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards}

    # Two groups of records per shard, put apart (the sleeps only space arrivals: every
    # expectation below is read back from kinesalite's stamps).
    for shard_id in ids:
        put_into(client, stream, hash_of[shard_id], f"early-{shard_id}", 3)
    time.sleep(0.6)
    for shard_id in ids:
        put_into(client, stream, hash_of[shard_id], f"late-{shard_id}", 3)
    stamps = {shard_id: arrivals(client, stream, shard_id) for shard_id in ids}
    assert all(len(found) == 6 for found in stamps.values())
    for found in stamps.values():
        assert found[3][1] > found[2][1]  # the late group arrived after the early one

    # Shard 0: checkpointed in the middle: its oldest unread record is the 4th.
    # Shard 1: no checkpoint: read from TRIM_HORIZON, the 1st.
    # Shard 2: checkpointed at its last record: nothing unread, lag 0.
    # Shard 3: no position but a recorded LATEST start between the groups: the 4th.
    first_late = stamps[ids[3]][3][1]
    asyncio.run(checkpoint(config, stream, ids[0], stamps[ids[0]][2][0]))
    asyncio.run(checkpoint(config, stream, ids[2], stamps[ids[2]][5][0]))
    asyncio.run(checkpoint(config, stream, ids[3], None, started_at_ms=first_late))
    oldest_unread = {
        ids[0]: stamps[ids[0]][3][1],
        ids[1]: stamps[ids[1]][0][1],
        ids[3]: first_late,
    }

    errors_sent: list[float] = []
    errors_answered: list[float] = []
    latencies: list[float] = []
    stale_dates = 0
    for n in range(PROBES):
        figure, calls = asyncio.run(timed_probe(config, stream))
        rows = {row.shard_id: row for row in figure.shards}
        assert set(rows) == set(ids)
        assert rows[ids[2]].millis_behind == 0
        assert all(row.owner is None for row in rows.values())  # the owner is gone
        assert figure.max_millis_behind == max(r.millis_behind for r in rows.values())
        for shard_id, arrival in oldest_unread.items():
            got = rows[shard_id].millis_behind
            sent, answered, date = calls[shard_id]
            assert date is not None
            latencies.append(answered - sent)
            high = answered - arrival + MARGIN_MS
            if ms_of(date) + 1000 <= sent:  # the Date named a second over before the call
                stale_dates += 1
                assert got <= high, (n, shard_id, got, high, date)
            else:
                assert sent - arrival <= got <= high, (n, shard_id, got, sent - arrival, high)
            errors_sent.append(got - (sent - arrival))
            errors_answered.append(got - (answered - arrival))
        time.sleep(0.37)  # a different phase of the Date's second next time (not asserted)

    before = time.time() * 1000
    figure = group_lag(config, [stream])
    after = time.time() * 1000
    rows = {row.shard_id: row for row in figure.shards}
    for shard_id, arrival in oldest_unread.items():
        got = rows[shard_id].millis_behind
        low, high = before - arrival, after - arrival + MARGIN_MS
        assert low <= got <= high, ("group_lag", shard_id, got, low, high)

    print(
        f"lag error ms over {PROBES} probes x {len(oldest_unread)} shards: vs the true age "
        f"when GetShardIterator was sent {spread(errors_sent)}; when it was answered "
        f"{spread(errors_answered)}; its latency ms {spread(latencies)}; "
        f"stale Date headers {stale_dates}; group_lag's whole call {after - before:.0f} ms"
    )
