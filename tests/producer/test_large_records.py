"""Records over 1 MiB (up to 10 MiB) on a stream whose maximum record size was raised: the
producer learns each stream's limit and takes records up to it, alone in their call and never in
a KPL aggregate; a record over the limit is refused at ``put()`` by name.

kinesis-local (kinesis-mock 0.6.2) is the stand-in that knows ``MaxRecordSizeInKiB``
(CreateStream, DescribeStreamSummary, UpdateMaxRecordSize) and takes a record of up to the
stream's limit in PutRecords (kinesalite and moto refuse anything over 1 MiB). Its GetRecords
cannot answer with a record of 10 MiB (it fails with a 500): records read back here are 3 MiB;
the read paths of a 10 MiB record are in ``test_large_records_read.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from support.faultproxy import Fault, FaultKind, FaultProxy, OpKey
from support.standins import KinesisLocalStandIn

from kinesumer import AsyncProducer, Producer, cli
from kinesumer.errors import (
    FlushError,
    RecordRejectedError,
    RecordTooLargeError,
    StreamNotFoundError,
)
from kinesumer.producer.batching import Lane, fill_call, hold_back
from kinesumer.producer.options import ProducerOptions
from kinesumer.producer.records import PendingRecord
from kinesumer.producer.shards import ShardPacer

MIB = 1024 * 1024
#: A key of one character: data of TEN_MIB - 1 bytes makes a record of exactly 10 MiB.
TEN_MIB = 10 * MIB


def _client(url: str) -> Any:
    return boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")


def _create(url: str, name: str, max_kib: int | None = None) -> None:
    client = _client(url)
    extra = {} if max_kib is None else {"MaxRecordSizeInKiB": max_kib}
    client.create_stream(StreamName=name, ShardCount=1, **extra)
    client.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )


def _read(url: str, stream: str) -> list[dict[str, Any]]:
    client = _client(url)
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records: list[dict[str, Any]] = []
    for _ in range(20):
        answer = client.get_records(ShardIterator=iterator, Limit=1)
        records.extend(answer["Records"])
        if not answer["Records"] and answer.get("MillisBehindLatest", 0) == 0:
            break
        iterator = answer["NextShardIterator"]
    return records


def test_a_large_record_is_written_between_small_ones_in_put_order(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    # 2 MiB, not 10: kinesis-local takes ~1.5 s per MiB of PutRecords on a busy machine (16 s
    # for 10 MiB), past the producer's 10 s read timeout; 10 MiB is taken at put() below and
    # batched in the unit tests at the end.
    stream = unique_name("large")
    _create(kinesis_local.url, stream, max_kib=10240)
    large = b"x" * (2 * MIB)
    with Producer(kinesis_endpoint=kinesis_local.url, region="us-east-1") as producer:
        futures = [
            producer.put(stream, b"before", partition_key="k"),
            producer.put(stream, large, partition_key="k"),
            producer.put(stream, b"after", partition_key="k"),
        ]
        producer.flush()
        stats = producer.stats()
    sequences = [int(f.result().sequence_number) for f in futures]
    assert sequences == sorted(sequences)  # one key, in put order
    assert [r["Data"] for r in _read(kinesis_local.url, stream)] == [b"before", large, b"after"]
    assert stats.records_put == 3 and stats.bytes_put == 2 * MIB + len("beforeafter") + 3


def test_a_large_record_is_refused_at_put_by_its_streams_limit_and_the_message_says_why(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    default, raised = unique_name("one-mib"), unique_name("five-mib")
    _create(kinesis_local.url, default)
    _create(kinesis_local.url, raised, max_kib=5 * 1024)
    with Producer(kinesis_endpoint=kinesis_local.url, region="us-east-1") as producer:
        with pytest.raises(RecordTooLargeError, match="takes at most 1048576 bytes") as one:
            producer.put(default, b"x" * (2 * MIB), partition_key="k")
        assert (one.value.size, one.value.limit, one.value.stream) == (2 * MIB + 1, MIB, default)
        assert "UpdateMaxRecordSize" in str(one.value)
        with pytest.raises(RecordTooLargeError, match="at most 5242880 bytes"):
            producer.put(raised, b"x" * (5 * MIB), partition_key="k")  # + its key: 1 byte over
        with pytest.raises(RecordTooLargeError, match="10 MiB"):
            producer.put(raised, b"x" * TEN_MIB, partition_key="k")  # no stream takes it
        assert producer.stats().records_failed == 0


def test_a_10_mib_record_is_taken_at_put_and_sent_alone(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    """kinesis-local takes ~16 s to write 10 MiB on a busy machine, past the producer's 10 s
    read timeout: the fault proxy answers the PutRecords call itself (refusing its entries for
    good), after put() took the record by the stream's limit, which kinesis-local answers."""
    stream = unique_name("ten-mib")
    _create(kinesis_local.url, stream, max_kib=10240)
    with FaultProxy(kinesis_local.url) as proxy:
        proxy.add_rule(
            Fault.refuse_entries(1.0, code="ValidationException"),
            service="kinesis",
            operation="PutRecords",
        )
        with Producer(kinesis_endpoint=proxy.url, region="us-east-1") as producer:
            small = producer.put(stream, b"small", partition_key="a")
            large = producer.put(stream, b"x" * (TEN_MIB - 1), partition_key="b")
            with contextlib.suppress(FlushError):
                producer.flush()
            stats = producer.stats()
        calls = proxy.stats()[OpKey("kinesis", "PutRecords")].faults[FaultKind.REFUSE_ENTRIES]
    for future in (small, large):
        with pytest.raises(RecordRejectedError, match="refused by the fault proxy"):
            future.result()
    assert calls == stats.calls == 2  # the 10 MiB record went alone in its call


def test_a_raised_limit_is_learned_again_when_a_record_would_be_refused(
    kinesis_local: KinesisLocalStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kinesumer.producer.limits.RELEARN_AFTER", 0.0)
    stream = unique_name("raised-later")
    _create(kinesis_local.url, stream)
    client = _client(kinesis_local.url)

    async def main() -> None:
        async with AsyncProducer(kinesis_endpoint=kinesis_local.url, region="us-east-1") as p:
            with pytest.raises(RecordTooLargeError):
                await p.put(stream, b"x" * (3 * MIB), partition_key="k")
            arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
                "StreamARN"
            ]
            client.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=4096)
            deadline = time.monotonic() + 10
            while (
                client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"].get(
                    "MaxRecordSizeInKiB"
                )
                != 4096
            ):
                assert time.monotonic() < deadline, "UpdateMaxRecordSize did not take"
                await asyncio.sleep(0.1)
            future = await p.put(stream, b"y" * (3 * MIB), partition_key="k")
            await p.flush()
            await future

    asyncio.run(main())
    assert [len(r["Data"]) for r in _read(kinesis_local.url, stream)] == [3 * MIB]


def test_an_aggregating_producer_puts_a_large_record_alone_and_plain(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("large-agg")
    _create(kinesis_local.url, stream, max_kib=10240)
    large = b"L" * (3 * MIB)
    with Producer(
        kinesis_endpoint=kinesis_local.url, region="us-east-1", aggregate=True, linger=0.5
    ) as producer:
        futures = [producer.put(stream, b"s%d" % i, partition_key="k") for i in range(3)]
        futures.append(producer.put(stream, large, partition_key="k"))
        futures += [producer.put(stream, b"t%d" % i, partition_key="k") for i in range(3)]
        producer.flush()
    results = [f.result() for f in futures]
    records = _read(kinesis_local.url, stream)
    # Three entries: an aggregate, the large record as it was put, an aggregate.
    assert len(records) == 3 and records[1]["Data"] == large
    assert records[0]["Data"][:4] == records[2]["Data"][:4] == b"\xf3\x89\x9a\xc2"  # KPL magic
    assert results[3].sub_sequence_number == 0
    assert len({r.sequence_number for r in results}) == 3


def _record(key: str, size: int, seq: int) -> PendingRecord:
    record = PendingRecord("s", b"x" * (size - len(key)), key, None, None)
    record.seq = seq
    return record


@pytest.mark.parametrize("aggregate", [False, True])
def test_a_large_record_goes_alone_in_its_call_from_a_full_pace_and_bursts(
    aggregate: bool,
) -> None:
    pacer = ShardPacer(1000, MIB, now=0.0)
    lane = Lane("shard-0", pacer)
    lane.queue.extend(
        [_record("a", 100, 1), _record("b", TEN_MIB, 2), _record("c", 100, 3)],
    )
    # The small record goes; the large one waits for a call of its own and a full pace.
    entries, _ = fill_call([lane], 0.0, by_key=True, busy=set(), aggregate=aggregate)
    assert [r.key for e in entries for r in e.records] == ["a"]
    entries, wake = fill_call([lane], 0.0, by_key=True, busy=set(), aggregate=aggregate)
    assert entries == [] and 0 < wake <= 0.001
    entries, _ = fill_call([lane], 0.001, by_key=True, busy=set(), aggregate=aggregate)
    assert [(len(e.records), e.size) for e in entries] == [(1, TEN_MIB)]
    assert entries[0].data == b"x" * (TEN_MIB - 1)  # plain: never in an aggregate
    # A call of one large entry is never held back for being small.
    options = ProducerOptions(aggregate=aggregate)
    assert not hold_back(entries, {"shard-0": lane}, set(), options)
    # The burst left the pace in debt: the next record waits about nine seconds.
    entries, wake = fill_call([lane], 0.002, by_key=True, busy=set(), aggregate=aggregate)
    assert entries == [] and 8.9 < wake < 10.1


def test_a_large_record_never_shares_a_call_with_another_lanes_records() -> None:
    lanes = [Lane(f"shard-{i}", ShardPacer(1000, MIB, now=0.0)) for i in range(2)]
    lanes[0].queue.append(_record("big", 4 * MIB, 1))
    lanes[1].queue.extend(_record(f"k{i}", 1000, 2 + i) for i in range(10))
    entries, _ = fill_call(lanes, 0.0, by_key=True, busy=set(), aggregate=False)
    assert [e.records[0].key for e in entries] == ["big"]
    entries, _ = fill_call(lanes, 0.0, by_key=True, busy=set(), aggregate=False)
    assert len(entries) == 10 and all(e.shard_id == "shard-1" for e in entries)


def test_a_record_larger_than_the_buffer_bound_waits_for_an_empty_buffer_not_forever(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("large-buffer")
    _create(kinesis_local.url, stream, max_kib=10240)
    with Producer(
        kinesis_endpoint=kinesis_local.url, region="us-east-1", max_buffered_bytes=MIB
    ) as producer:
        large = producer.put(stream, b"x" * (2 * MIB), partition_key="k", block=False)
        producer.flush()
        assert large.result().sequence_number


def test_kinesumer_produce_writes_a_large_line_to_a_raised_stream_and_names_the_limit(
    kinesis_local: KinesisLocalStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    raised, default = unique_name("cli-large"), unique_name("cli-default")
    _create(kinesis_local.url, raised, max_kib=4096)
    _create(kinesis_local.url, default)
    line = b"y" * (2 * MIB)
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesis_local.url, "--key", "k"]
    for stream in (raised, default):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"small\n" + line)))
        codes = cli.main(["produce", stream, *where])
        err = capsys.readouterr().err
        if stream == raised:
            assert codes == 0, err
        else:
            assert codes == 1 and "RecordTooLargeError" in err and "1048576" in err, err
    assert [len(r["Data"]) for r in _read(kinesis_local.url, raised)] == [5, 2 * MIB]
    assert [r["Data"] for r in _read(kinesis_local.url, default)] == [b"small"]


def test_the_spark_sinks_task_writes_a_large_row_and_fails_on_one_over_the_limit(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql import Row

    from kinesumer.spark.sink.writer import parse_sink_options, write_rows

    raised, default = unique_name("sink-large"), unique_name("sink-default")
    _create(kinesis_local.url, raised, max_kib=4096)
    _create(kinesis_local.url, default)
    large = b"z" * (3 * MIB)
    options = {"region": "us-east-1", "kinesis_endpoint": kinesis_local.url}
    rows = [Row(data=b"small", partition_key="k"), Row(data=large, partition_key="k")]
    parsed = parse_sink_options({**options, "stream": raised})
    assert write_rows(parsed, iter(rows)).rows == 2
    assert [r["Data"] for r in _read(kinesis_local.url, raised)] == [b"small", large]
    with pytest.raises(RecordTooLargeError, match="at most 1048576 bytes"):
        write_rows(parse_sink_options({**options, "stream": default}), iter(rows))


def test_a_lowered_limit_is_learned_again_after_kinesis_refused_a_large_record(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("lowered")
    _create(kinesis_local.url, stream, max_kib=4096)
    client = _client(kinesis_local.url)
    arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    with Producer(kinesis_endpoint=kinesis_local.url, region="us-east-1") as producer:
        producer.put(stream, b"a" * (2 * MIB), partition_key="k").result(timeout=60)
        client.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=1024)
        refused = producer.put(stream, b"b" * (2 * MIB), partition_key="k")  # 4 MiB, it knew
        with pytest.raises(RecordRejectedError, match="max record size"):
            refused.result(timeout=60)
        with pytest.raises(RecordTooLargeError, match="at most 1048576 bytes"):
            producer.put(stream, b"c" * (2 * MIB), partition_key="k")
        with contextlib.suppress(FlushError):
            producer.flush()


def test_an_unknown_limit_lets_kinesis_judge_and_put_raises_nothing_new(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    """DescribeStreamSummary throttled past retries (the fault proxy), or the stream missing:
    put() takes the large record and Kinesis decides; a missing stream fails its future with
    StreamNotFoundError, as a small record's (the outbox relay, for one, expects no other
    error from put())."""
    stream, missing = unique_name("unknown-limit"), unique_name("missing")
    _create(kinesis_local.url, stream, max_kib=4096)
    large = b"u" * (2 * MIB)
    with FaultProxy(kinesis_local.url) as proxy:
        proxy.add_rule(Fault.throttle(), service="kinesis", operation="DescribeStreamSummary")
        with Producer(kinesis_endpoint=proxy.url, region="us-east-1") as producer:
            written = producer.put(stream, large, partition_key="k")
            lost = producer.put(missing, large, partition_key="k")
            with contextlib.suppress(FlushError):
                producer.flush()
    assert written.result().sequence_number
    with pytest.raises(StreamNotFoundError):
        lost.result()
    assert [r["Data"] for r in _read(kinesis_local.url, stream)] == [large]


def test_a_large_put_from_a_futures_done_callback_does_not_freeze_the_producer(
    kinesis_local: KinesisLocalStandIn, unique_name: Callable[[str], str]
) -> None:
    """Futures settle on the producer's loop, so their done-callbacks run there: a large put
    chained from one must not wait for that loop (it would wait for itself, and every put,
    flush and close after it would hang)."""
    stream = unique_name("chained")
    _create(kinesis_local.url, stream, max_kib=10240)
    producer = Producer(kinesis_endpoint=kinesis_local.url, region="us-east-1")
    chained: list[Any] = []
    returned = threading.Event()

    def chain(_: Any) -> None:
        try:
            chained.append(producer.put(stream, b"x" * (2 * MIB), partition_key="k"))
        finally:
            returned.set()

    try:
        producer.put(stream, b"small", partition_key="k").add_done_callback(chain)
        assert returned.wait(60), "the callback's put never returned: the loop waits for itself"
        after = producer.put(stream, b"after", partition_key="j")
        producer.flush()
        assert after.result(timeout=60).shard_id
        (large,) = chained
        assert large.result(timeout=60).shard_id  # not refused: the stream takes 10 MiB
    finally:
        producer.close()


class _ModelWithout:
    """A botocore client whose Kinesis model predates ``MaxRecordSizeInKiB`` (botocore 1.34,
    which aioboto3 13 brings): its parse never shows the field, also for a raised stream."""

    class meta:
        class service_model:
            @staticmethod
            def operation_model(name: str) -> Any:
                class Shape:
                    members = {"StreamDescriptionSummary": type("S", (), {"members": {}})()}

                return type("Op", (), {"output_shape": Shape()})()

    async def describe_stream_summary(self, StreamName: str) -> dict[str, Any]:
        return {"StreamDescriptionSummary": {"StreamName": StreamName, "OpenShardCount": 1}}


def test_an_older_botocore_that_cannot_show_the_limit_leaves_large_records_to_kinesis() -> None:
    """Without the field in its model, "absent" cannot mean "1 MiB": the limit is unknown and
    Kinesis judges, instead of every large record refused on a raised stream."""
    from kinesumer.kinesis.transport import AwsKinesisTransport
    from kinesumer.producer.limits import describe_max_record_bytes

    kinesis = AwsKinesisTransport(_ModelWithout(), lean=False)
    assert asyncio.run(describe_max_record_bytes(kinesis, "orders")) == TEN_MIB
