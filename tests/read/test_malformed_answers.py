"""A GetRecords answer that is not Kinesis's never ends a shard.

A gateway's or proxy's page (HTTP 200, an HTML body) or a garbled body is refused by the lean
decoder and parsed by botocore into no members at all: read as "no next iterator", it ended an
open shard for good (SHARD_END checkpointed: nobody read the rest). Now an answer must carry
``Records`` and ``MillisBehindLatest`` (Kinesis, kinesalite, kinesis-local and moto send both in
every answer), and an answer without a next iterator ends the shard only if the shard is closed
(its ``ChildShards``, or its listing); anything else is retried with the same iterator, counted
in ``stats().retries`` and logged.

Members on kinesalite + dynalite at the defaults (``initial_position="LATEST"``), Kinesis
through the fault proxy, which answers one GetRecords with the page mid-stream: after the
member delivered half of the records, with the other half waiting. Then the botocore-only path
(``KINESUMER_BOTOCORE_GET_RECORDS=1``), and a real end (a split) that still ends the parent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import Member, create_stream, datas, make_config, put, split_in_two, state_store
from support.group import setup_table as create_table
from support.wait import eventually

from kinesumer import Record
from kinesumer.kinesis.reader import BOTOCORE_GET_RECORDS_ENV

Names = Callable[[str], str]

#: What a proxy or gateway on the way may answer with HTTP 200 instead of Kinesis's JSON.
PAGES = {
    "html": Fault.answer(b"<html>gateway</html>"),
    "empty-json": Fault.answer(b"{}", "application/x-amz-json-1.1"),
    # Well-formed, but an open shard's "end": the listing shows it open.
    "end-of-an-open-shard": Fault.answer(
        b'{"Records": [], "MillisBehindLatest": 0}', "application/x-amz-json-1.1"
    ),
}
MALFORMED = "kinesis.GetRecords:MalformedAnswer"


def malformed_retries(member: Member) -> int:
    return member.consumer.stats().retries.get(MALFORMED, 0)


async def read_through_a_page(
    kinesalite: Any, dynalite: Any, names: Names, proxy: FaultProxy, page: Fault
) -> None:
    """One shard read at LATEST by one member; 50 records delivered, then ``page`` answers the
    next GetRecords while 50 more wait: every record is delivered, nothing is finished."""
    config = make_config(
        proxy.url, dynalite.url, names("app"), names("state"), initial_position="LATEST"
    )
    create_table(config)
    url, stream = kinesalite.url, names("s")
    create_stream(url, stream, 1)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="a"), [stream], sink).start()
    try:
        await eventually(
            lambda: any(s.caught_up for s in member.consumer.stats().shards),
            what="the shard read at the tip",
        )
        produced = put(url, stream, 0, 50)
        await eventually(lambda: len(sink) >= 50, what="the first half delivered")
        rule = proxy.add_rule(page, service="kinesis", operation="GetRecords", count=1)
        produced += put(url, stream, 50, 50)
        await eventually(lambda: rule.fired == 1, what="the page answered a GetRecords")
        await eventually(lambda: len(sink) >= 100, timeout=60, what="the second half delivered")
        assert datas(sink) == produced
        (status,) = member.consumer.stats().shards
        assert not status.ended and not status.finished
        assert malformed_retries(member) >= 1
        assert member.error is None
    finally:
        await member.close()
    async with state_store(config) as store:
        (checkpoint,) = (await store.get_checkpoints(stream)).values()
    assert not checkpoint.finished  # a fresh member would read on from it


@pytest.mark.parametrize("page", sorted(PAGES))
async def test_a_page_instead_of_an_answer_ends_no_shard(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Names,
    fault_proxy: Callable[[str], FaultProxy],
    page: str,
) -> None:
    proxy = fault_proxy(kinesalite.url)
    await read_through_a_page(kinesalite, dynalite, unique_name, proxy, PAGES[page])


async def test_the_botocore_only_reader_is_held_to_the_same_rule(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Names,
    fault_proxy: Callable[[str], FaultProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BOTOCORE_GET_RECORDS_ENV, "1")
    proxy = fault_proxy(kinesalite.url)
    await read_through_a_page(kinesalite, dynalite, unique_name, proxy, PAGES["html"])


async def test_a_real_shard_end_still_finishes_the_parent(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Names,
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    """kinesalite ends a split parent with an answer without a next iterator (and without
    ``ChildShards``): its listing shows the parent closed, so the parent is finished and its
    children read, every record once."""
    proxy = fault_proxy(kinesalite.url)
    config = make_config(
        proxy.url, dynalite.url, unique_name("app"), unique_name("state"), initial_position="LATEST"
    )
    create_table(config)
    url, stream = kinesalite.url, unique_name("s")
    create_stream(url, stream, 1)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="a"), [stream], sink).start()
    try:
        await eventually(
            lambda: any(s.caught_up for s in member.consumer.stats().shards),
            what="the shard read at the tip",
        )
        produced = put(url, stream, 0, 30)
        parent = split_in_two(url, stream)
        produced += put(url, stream, 30, 30)
        await eventually(lambda: len(sink) >= 60, timeout=60, what="parent and children read")
        assert sorted(datas(sink)) == sorted(produced) and len(sink) == 60
        async with state_store(config) as store:
            checkpoints = await store.get_checkpoints(stream)
        assert checkpoints[parent].finished
        assert malformed_retries(member) == 0
        assert member.error is None
    finally:
        await member.close()
