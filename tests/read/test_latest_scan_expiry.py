"""At the default ``LATEST``, the next owner reopens a shard from where the first owner began
(``started_at``) through the scan that stands in for AT_TIMESTAMP on kinesalite
(:meth:`KinesisReader.scan_since`): an iterator that expires on the probe or in the middle of
the scan (several GetRecords pages of older records) must neither stop the member nor skip a
record (issue 17 review; kinesalite + dynalite behind the fault proxy).
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.faultproxy import Fault, FaultKind, OpKey
from support.group import Member, create_stream, datas, duplicates, put
from support.wait import eventually

from kinesumer import Record
from kinesumer.kinesis.reader import SERVER_CLOCK_MARGIN_MS

GET_RECORDS = OpKey("kinesis", "GetRecords")


async def test_expiries_on_the_probe_and_in_the_scan_skip_nothing(proxied: dict[str, Any]) -> None:
    url, stream, proxy = proxied["url"], proxied["stream"], proxied["kinesis"]
    config = proxied["config"].replace(initial_position="LATEST", commit_interval=600, scan_limit=3)
    create_stream(url, stream, 1)
    old = put(url, stream, 1000, 20)  # 7 pages of 3 before the start: skipped by arrival
    await asyncio.sleep(SERVER_CLOCK_MARGIN_MS / 1000 + 1.5)
    sink: list[tuple[str, Record]] = []
    first = Member(config.replace(client_id="a"), [stream], sink)
    await first.consumer.subscribe([stream])  # reading at LATEST; the application never polls
    await eventually(
        lambda: any(s.caught_up for s in first.consumer.stats().shards), what="A at the tip"
    )
    produced = put(url, stream, 0, 10)
    await eventually(lambda: first.consumer.stats().buffered_records >= 10, what="A fetched")
    await first.consumer.aclose()  # nothing processed: no position, only started_at
    produced += put(url, stream, 10, 5)
    # B's first GetRecords is the probe of the scan: it expires; then some of the scan's pages.
    proxy.add_rule(Fault.expired_iterator(), operation="GetRecords", count=1)
    proxy.add_rule(Fault.expired_iterator(), operation="GetRecords", rate=0.3, count=3, seed=7)
    second = Member(config.replace(client_id="b"), [stream], sink).start()
    try:
        await eventually(
            lambda: set(datas(sink)) >= set(produced) or second.error is not None,
            timeout=60,
            what="every record",
        )
        assert second.error is None, f"the member stopped: {second.error!r}"
    finally:
        await second.close()
    assert proxy.stats()[GET_RECORDS].faults[FaultKind.EXPIRED_ITERATOR] >= 2
    assert sorted(datas(sink)) == sorted(produced)
    assert not set(old) & set(datas(sink))
    assert not duplicates(sink)
