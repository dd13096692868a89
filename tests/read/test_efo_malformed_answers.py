"""Enhanced fan-out's GetRecords paths against an answer that is not Kinesis's: the polling
interlude of a stalled shard, and the end check of a closed shard's idle subscription.

Both read with the engine's :class:`KinesisReader` on kinesalite, through the fault proxy,
which answers one GetRecords with a gateway's page (or with a well-formed "end" of the open
shard). Before, the interlude took it for SHARD_END and finished the open shard; the end check
took it for the end of a closed shard that still held records.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream, make_config, put, split_in_two
from support.read_ahead import kinesis_client

from kinesumer.aws import AwsClients, RequestStats
from kinesumer.kinesis.reader import KinesisReader
from kinesumer.models import Checkpoint, Record
from kinesumer.observability.metrics import Metrics
from kinesumer.read.buffer import RecordBuffer
from kinesumer.read.efo_fallback import EndCheck, PollingInterlude, ResumePoint
from kinesumer.read.progress import ShardLease, shard_lease

SHARD = "shardId-000000000000"
PAGES = {
    "html": Fault.answer(b"<html>gateway</html>"),
    "end-of-an-open-shard": Fault.answer(
        b'{"Records": [], "MillisBehindLatest": 0}', "application/x-amz-json-1.1"
    ),
}


class Shard:
    """A 1-shard stream on kinesalite holding a first record and then ``produced``, read
    through the proxy (``reader``) with 25 records per GetRecords."""

    def __init__(self, kinesalite: Any, dynalite: Any, names: Callable[[str], str]) -> None:
        self.proxy = FaultProxy(kinesalite.url)
        self.config = make_config(
            self.proxy.url,
            dynalite.url,
            names("app"),
            names("state"),
            initial_position="LATEST",
            scan_limit=25,
        )
        self.url, self.stream = kinesalite.url, names("s")
        create_stream(self.url, self.stream, 1)
        self.first: str = kinesis_client(self.url).put_record(
            StreamName=self.stream, Data=b"first", PartitionKey="k"
        )["SequenceNumber"]
        self.produced = put(self.url, self.stream, 0, 100)
        self.stats = RequestStats()
        self.clients = AwsClients(self.config, self.stats)

    async def __aenter__(self) -> KinesisReader:
        await self.clients.open()
        return KinesisReader(self.clients.kinesis, self.stats, "us-east-1")

    async def __aexit__(self, *exc_info: object) -> None:
        await self.clients.close()
        self.proxy.stop()


@pytest.fixture
async def shard(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> AsyncIterator[Shard]:
    yield Shard(kinesalite, dynalite, unique_name)


async def read(buffer: RecordBuffer, count: int, ended: asyncio.Task[bool]) -> list[Record]:
    """``count`` records from ``buffer``; fails when the interlude stopped with fewer."""
    got: list[Record] = []
    while len(got) < count:
        getting = asyncio.ensure_future(buffer.get())
        await asyncio.wait([getting, ended], timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not getting.done():
            getting.cancel()
            raise AssertionError(f"polling stopped after {len(got)} records: {ended.result()}")
        got.extend(getting.result()[1])
    return got


@pytest.mark.parametrize("page", sorted(PAGES))
async def test_the_polling_interlude_reads_through_a_page(shard: Shard, page: str) -> None:
    """A stalled shard polled from after its first record; the page answers the second
    GetRecords: every record is buffered and the shard is not ended."""
    ends: list[ShardLease] = []
    lease = shard_lease(
        Checkpoint(shard.stream, SHARD, sequence_number=shard.first, owner="m", lease=1)
    )
    buffer = RecordBuffer(1000, 1 << 20)
    resume = ResumePoint(
        {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": shard.first}, None, None, None
    )
    rule = shard.proxy.add_rule(
        PAGES[page], service="kinesis", operation="GetRecords", skip=1, count=1
    )
    async with shard as reader:
        interlude = PollingInterlude(
            lease, reader, buffer, shard.config, Metrics(), resume, ends.append, "[m] s/0"
        )
        task = asyncio.create_task(interlude.run())
        try:
            got = await read(buffer, 100, task)
        finally:
            lease.claim.begin_handoff()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert rule.fired == 1
    assert [r.data for r in got] == shard.produced
    assert not ends and not lease.progress.reached_end


async def test_the_end_check_of_a_closed_shard_is_not_fooled_by_a_page(shard: Shard) -> None:
    """A split parent still holding 100 records after the subscription's continuation (its
    first record): a page instead of the first of them is not the parent's end."""
    split_in_two(shard.url, shard.stream)
    shard.proxy.add_rule(PAGES["html"], service="kinesis", operation="GetRecords", count=1)
    async with shard as reader:
        check = EndCheck(reader, shard.stream, lambda shard_id: True)
        assert not await check(SHARD, shard.first)
        # Read past its records, the parent's real end is seen.
        last = await last_sequence_number(reader, shard.stream)
        assert await check(SHARD, last)


async def last_sequence_number(reader: KinesisReader, stream: str) -> str:
    iterator: str | None = await reader.shard_iterator(stream, SHARD, None, "TRIM_HORIZON")
    last = ""
    while iterator is not None:
        batch = await reader.get_records(stream, SHARD, iterator, 10_000, None)
        if not batch.records and last:
            break
        last = batch.records[-1].sequence_number if batch.records else last
        iterator = batch.next_iterator
    return last
