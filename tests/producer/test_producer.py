"""Producer and AsyncProducer on kinesalite: batching, futures, flush, close, bounds, bad input.

Partial failures and per-key order: ``test_producer_faults.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support.group import create_stream
from support.produced import by_key, read_all
from support.standins import NodeStandIn

from kinesumer import AsyncProducer, Producer, PutResult
from kinesumer.errors import (
    BufferFullError,
    ConfigError,
    FlushError,
    InvalidRecordError,
    ProducerClosedError,
    RecordTooLargeError,
    StreamNotFoundError,
)
from kinesumer.producer.records import check_record


def test_every_record_is_written_once_and_its_future_says_where(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("p")
    create_stream(kinesalite.url, stream, 3)
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1") as producer:
        futures = [
            producer.put(stream, f"{i}".encode(), partition_key=f"k{i % 17}") for i in range(1200)
        ]
        producer.flush()
        assert all(f.done() for f in futures)
        stats = producer.stats()
    results = [f.result() for f in futures]
    assert all(isinstance(r, PutResult) for r in results)
    records = read_all(kinesalite.url, stream)
    assert sorted(int(r.data) for r in records) == list(range(1200))
    landed = {(r.shard_id, r.sequence_number) for r in records}
    assert {(r.shard_id, r.sequence_number) for r in results} == landed
    for key, datas in by_key(records).items():
        assert [int(d) for d in datas] == sorted(int(d) for d in datas), key
    assert stats.records_put == 1200 and stats.records_failed == 0
    assert stats.buffered_records == 0 and stats.latency.count == 1200


def test_async_producer_puts_and_awaits(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("p")
    create_stream(kinesalite.url, stream, 2)

    async def main() -> list[PutResult]:
        async with AsyncProducer(kinesis_endpoint=kinesalite.url, region="us-east-1") as p:
            futures = [await p.put(stream, b"x%d" % i, partition_key=str(i)) for i in range(50)]
            await p.flush()
            return [await f for f in futures]

    results = asyncio.run(main())
    assert len({r.sequence_number for r in results}) == 50
    assert len(read_all(kinesalite.url, stream)) == 50


def test_bad_input_raises_named_errors_at_put(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1") as producer:
        with pytest.raises(RecordTooLargeError, match="10 MiB"):  # no stream takes it
            producer.put("s", b"x" * (10 * 1024 * 1024), partition_key="k")
        with pytest.raises(InvalidRecordError, match="non-empty"):
            producer.put("s", b"x", partition_key="")
        with pytest.raises(InvalidRecordError, match="256"):
            producer.put("s", b"x", partition_key="k" * 257)
        with pytest.raises(InvalidRecordError, match="must be bytes"):
            producer.put("s", {"id": 1}, partition_key="k")
        with pytest.raises(InvalidRecordError, match="explicit_hash_key"):
            producer.put("s", b"x", partition_key="k", explicit_hash_key=str(2**128))
        with pytest.raises(InvalidRecordError, match="stream"):
            producer.put("bad name!", b"x", partition_key="k")
        assert producer.stats().buffered_records == 0
    # The largest record Kinesis takes (10 MiB with its key, on a raised stream) passes the
    # checks made without the stream's limit.
    assert len(check_record(b"x" * (10 * 1024 * 1024 - 1), "k", None)) == 10 * 1024 * 1024 - 1
    with pytest.raises(ConfigError, match=r"Producer\(ordering\)"):
        Producer(kinesis_endpoint=kinesalite.url, region="us-east-1", ordering="shard")  # type: ignore[arg-type]


def test_a_missing_stream_fails_the_records_futures_and_flush(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    producer = Producer(kinesis_endpoint=kinesalite.url, region="us-east-1")
    future = producer.put(unique_name("missing"), b"x", partition_key="k")
    with pytest.raises(FlushError) as raised:
        producer.flush()
    assert raised.value.failures == {"StreamNotFoundError": 1}
    with pytest.raises(StreamNotFoundError, match="does not exist"):
        future.result()
    producer.flush()  # reported once
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.put("s", b"x", partition_key="k")


def test_a_full_buffer_raises_without_block_and_blocks_with_it(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("p")
    create_stream(kinesalite.url, stream, 1)
    # A long linger keeps the records buffered until flush.
    with Producer(
        kinesis_endpoint=kinesalite.url, region="us-east-1", max_buffered_records=3, linger=60
    ) as producer:
        for i in range(3):
            producer.put(stream, b"%d" % i, partition_key="k", block=False)
        with pytest.raises(BufferFullError, match="max_buffered_records=3"):
            producer.put(stream, b"3", partition_key="k", block=False)
        with pytest.raises(BufferFullError):
            producer.put(stream, b"3", partition_key="k", timeout=0.2)
        producer.flush()
        producer.put(stream, b"3", partition_key="k", block=False)
    assert [r.data for r in read_all(kinesalite.url, stream)] == [b"0", b"1", b"2", b"3"]


def test_async_put_waits_for_buffer_room_or_raises_without_block(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("p")
    create_stream(kinesalite.url, stream, 1)

    async def main() -> None:
        async with AsyncProducer(
            kinesis_endpoint=kinesalite.url, region="us-east-1", max_buffered_records=2, linger=60
        ) as producer:
            await producer.put(stream, b"0", partition_key="k")
            await producer.put(stream, b"1", partition_key="k")
            with pytest.raises(BufferFullError):
                await producer.put(stream, b"2", partition_key="k", block=False)
            waiting = asyncio.create_task(producer.put(stream, b"2", partition_key="k"))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # no room until the first two are written
            await producer.flush()
            last = await waiting
            await producer.flush()
            await last

    asyncio.run(main())
    assert [r.data for r in read_all(kinesalite.url, stream)] == [b"0", b"1", b"2"]
