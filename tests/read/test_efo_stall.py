"""A stalled enhanced fan-out shard is read by polling from the same position, then by
subscriptions again: kinesalite + dynalite, the stand-in transport of ``support/efo_fake.py``.

While the test says so, the stand-in refuses every subscription of the shard (ResourceInUse, as
kinesis-mock does for as long as it believes an earlier subscription is open), or sends only
empty events that say the shard is 5 s behind: the records put meanwhile can only arrive by
GetRecords. The stall window and the polling period are shortened
(module constants); the stall limit is the default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.efo_fake import FakeEfo
from support.group import Member, create_stream, datas, duplicates, make_config, put
from support.group import setup_table as create_table
from support.wait import eventually

from kinesumer import Record
from kinesumer.cli import main as cli_main
from kinesumer.consumer.base import engine_of
from kinesumer.models import ClientInfo
from kinesumer.read import efo_fallback, efo_fetcher
from kinesumer.statestore.dynamodb.codecs import (
    CLIENT_ITEM_BUDGET,
    MAX_STALLED_REPORTED,
    client_item,
    decode_client,
)
from kinesumer.statestore.schema import item_size

Names = Callable[[str], str]
SHARD = "shardId-000000000000"


async def eventually_async(
    read: Callable[[], Awaitable[str]], ok: Callable[[str], bool], what: str
) -> None:
    """Until ``ok(await read())``, for at most 30 s."""
    seen = ""
    for _ in range(60):
        seen = await read()
        if ok(seen):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last:\n{seen}")


@pytest.mark.parametrize("stall", ["refused", "empty_while_behind"])
async def test_stall_then_polling_then_subscriptions_again_without_gap_or_replay(
    stall: str,
    kinesalite: Any,
    dynalite: Any,
    unique_name: Names,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(efo_fetcher, "STALL_AFTER", 1.0, raising=False)
    monkeypatch.setattr(efo_fallback, "STALL_AFTER", 1.0)
    monkeypatch.setattr(efo_fallback, "POLL_FOR", 3.0)
    caplog.set_level(logging.INFO, logger="kinesumer.fetcher")
    url, stream = kinesalite.url, unique_name("s")
    config = make_config(
        url, dynalite.url, unique_name("app"), unique_name("state"), enhanced_fan_out=True
    )
    assert config.efo_stall_limit == 2  # the default
    create_table(config)
    create_stream(url, stream, 1)
    fake = FakeEfo(url, expire_after=2, event_records=10)
    sink: list[tuple[str, Record]] = []
    member = Member(config.replace(client_id="a"), [stream], sink)
    engine_of(member.consumer).efo_transport = fake.transport()
    member.start()
    try:
        produced = put(url, stream, 0, 50)
        await eventually(lambda: len(sink) >= 50, what="records through subscriptions")
        # From now on every subscription is refused, or sends empty events while "behind".
        (fake.refuse if stall == "refused" else fake.starve).add(SHARD)
        produced += put(url, stream, 50, 50)
        await eventually(
            lambda: member.consumer.stats().shards[0].efo_polling, what="polling", timeout=60
        )
        await eventually(lambda: len(sink) >= 100, what="records by polling", timeout=60)
        assert "EFO stalled" in caplog.text
        assert "reading by polling" in caplog.text
        shard = member.consumer.stats().shards[0]
        assert shard.efo_stalls >= 2  # the default efo_stall_limit
        # kinesumer status shows it for every member (from the client item's heartbeat).
        where = ["--app", config.app, "--table", config.dynamodb_table, "--region", "us-east-1"]
        where += ["--dynamodb-endpoint", dynalite.url]

        async def status() -> str:
            capsys.readouterr()
            code = await asyncio.to_thread(cli_main, ["status", *where])
            assert code == 0
            return capsys.readouterr().out

        await eventually_async(
            status, lambda out: f"shard {SHARD}: EFO stalled " in out, "the status line"
        )
        subscribed_before, opened_before = len(fake.positions), fake.opened[SHARD]
        fake.refuse.clear()
        fake.starve.clear()
        # A subscription open again, before the next records. A "polled" line is no such sign:
        # one can be logged while the status is awaited (a cycle: 3 s polling, 2 stalls), and
        # the next interlude then polls the next records, the subscription starting after them.
        await eventually(
            lambda: fake.opened[SHARD] > opened_before, what="EFO tried again", timeout=60
        )
        assert "polled " in caplog.text
        produced += put(url, stream, 100, 50)
        await eventually(lambda: len(sink) >= 150, what="records after", timeout=60)
    finally:
        await member.close()
    assert member.error is None
    assert datas(sink) == produced  # one shard: in order, each once
    assert duplicates(sink) == {}
    # Back on subscriptions, first AFTER the last record polling buffered (no replay, no gap),
    # and records came through them again.
    first_after_polling = fake.positions[subscribed_before]
    assert first_after_polling == (
        SHARD,
        {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": sink[99][1].sequence_number},
    )
    assert fake.events_sent[SHARD] > 0


def test_the_client_item_reports_the_most_stalled_shards_within_its_budget() -> None:
    """``kinesumer status`` reads stalls from the client item: the most stalled few are kept,
    and the item stays within its 1 KB budget however many shards the member reads."""
    stream = "s" * 128
    owned = {f"{stream}/shardId-{i:012d}": 5 for i in range(200)}
    stalls = {f"{stream}/shardId-{i:012d}": i for i in range(1, 11)}
    client = ClientInfo("m", 1, frozenset([stream]), owned=owned, efo_stalls=stalls)
    item = client_item("app", client, 3600)
    assert item_size(item) <= CLIENT_ITEM_BUDGET
    back = decode_client(item)
    assert back.efo_stalls == {k: v for k, v in stalls.items() if v > 10 - MAX_STALLED_REPORTED}
    assert back.owned  # the lags keep the rest of the budget
    assert decode_client(client_item("app", ClientInfo("m", 1), 3600)).efo_stalls == {}
