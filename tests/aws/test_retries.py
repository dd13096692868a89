"""Retry paths no stand-in produces by itself: ListShards paging, throttling, 5xx, expired
iterators. Faults come from the loopback fault proxy between the library and kinesalite/dynalite."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.faultproxy import Fault, OpKey
from support.group import POSITIONS, Member, create_stream, datas, duplicates, put, wait_reading
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.aws import RequestStats
from kinesumer.kinesis.reader import KinesisReader

Names = Callable[[str], str]


async def test_list_shards_follows_every_page_with_next_token_only() -> None:
    calls: list[dict[str, Any]] = []

    class PagingKinesis:
        async def list_shards(self, **kwargs: Any) -> dict[str, Any]:
            calls.append(kwargs)
            page = len(calls)
            shards = [
                {
                    "ShardId": f"shardId-{page:06d}",
                    "ParentShardId": f"shardId-{page - 1:06d}" if page > 1 else None,
                    "SequenceNumberRange": {"StartingSequenceNumber": "1"}
                    | ({"EndingSequenceNumber": "9"} if page < 3 else {}),
                }
            ]
            return {"Shards": shards} | ({"NextToken": f"t{page}"} if page < 3 else {})

    shards = await KinesisReader(PagingKinesis(), RequestStats(), "us-east-1").list_shards("s")
    assert [s.shard_id for s in shards] == ["shardId-000001", "shardId-000002", "shardId-000003"]
    assert [s.closed for s in shards] == [True, True, False]
    assert shards[1].parent_shard_id == "shardId-000001"
    assert calls == [{"StreamName": "s"}, {"NextToken": "t1"}, {"NextToken": "t2"}]


@pytest.fixture(params=POSITIONS)
def at(request: pytest.FixtureRequest, proxied: dict[str, Any]) -> dict[str, Any]:
    """:func:`proxied` with its members at ``initial_position`` ``LATEST`` (the default) and
    ``TRIM_HORIZON``: records are put once the members read every shard."""
    config = proxied["config"].replace(initial_position=request.param)
    return {**proxied, "config": config}


async def test_throttled_reads_and_writes_slow_down_but_lose_nothing(at: dict[str, Any]) -> None:
    url, stream, proxied = at["url"], at["stream"], at
    create_stream(url, stream, 2)
    proxied["kinesis"].add_rule(Fault.throttle(), operation="GetRecords", rate=0.3, seed=1)
    proxied["dynamodb"].add_rule(Fault.throttle(), operation="UpdateItem", rate=0.3, seed=2)
    proxied["dynamodb"].add_rule(Fault.http_500(), operation="PutItem", rate=0.2, seed=3)
    sink: list[tuple[str, Record]] = []
    member = Member(at["config"], [stream], sink).start()
    await wait_reading([member], 2)  # at LATEST, through the throttled start records too
    produced = put(url, stream, 0, 200)
    await eventually(lambda: len(sink) >= 200, what="200 records")
    retries = member.consumer.stats().retries
    await member.close()
    assert sorted(datas(sink)) == sorted(produced)
    assert retries.get("kinesis.GetRecords:ProvisionedThroughputExceededException", 0) > 0
    injected = proxied["kinesis"].stats()[OpKey("kinesis", "GetRecords")].faults
    assert sum(injected.values()) > 0


async def test_expired_iterator_resumes_after_last_delivered_not_checkpoint(
    at: dict[str, Any],
) -> None:
    url, stream, proxied = at["url"], at["stream"], at
    create_stream(url, stream, 1)
    # No checkpoint is written during the test: a resume from the checkpoint (or, at LATEST,
    # from where the read began) would replay all.
    config = at["config"].replace(commit_interval=600)
    consumer = AsyncKinesumer(config)
    sink: list[tuple[str, Record]] = []

    async def run() -> None:
        async for record in consumer.consume([stream]):
            sink.append(("c", record))

    import asyncio

    task = asyncio.create_task(run())
    await eventually(
        lambda: any(s.millis_behind is not None for s in consumer.stats().shards), what="reading"
    )
    produced = put(url, stream, 0, 100)
    await eventually(lambda: len(sink) == 100, what="first 100")
    before = proxied["kinesis"].stats()[OpKey("kinesis", "GetShardIterator")].forwarded
    proxied["kinesis"].add_rule(Fault.expired_iterator(), operation="GetRecords", count=1)
    produced += put(url, stream, 100, 100)
    await eventually(lambda: len(sink) >= 200, what="the next 100")
    await asyncio.sleep(0.5)
    after = proxied["kinesis"].stats()[OpKey("kinesis", "GetShardIterator")].forwarded
    await consumer.aclose()
    await asyncio.wait_for(task, 10)
    assert after == before + 1  # one fresh iterator
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}


async def test_dynamodb_outage_past_client_timeout_loses_and_regains_shards(
    proxied: dict[str, Any],
) -> None:
    """A member cut off from DynamoDB longer than client_timeout: it stops delivering before the
    survivor takes its shards over (never both at once); when it comes back it rejoins; the only
    duplicates are records it delivered during the outage and could not checkpoint."""

    url, stream = proxied["url"], proxied["stream"]
    create_stream(url, stream, 2)
    config = proxied["config"]
    direct = config.replace(dynamodb_endpoint=proxied["dynamodb"].upstream_url)
    sink: list[tuple[str, Record]] = []
    cut = Member(config.replace(client_id="cut"), [stream], sink).start()
    other = Member(direct.replace(client_id="other"), [stream], sink).start()
    await eventually(lambda: len(cut.owned()) == 1 and len(other.owned()) == 1, what="split")
    produced = put(url, stream, 0, 100)
    await eventually(lambda: len(sink) >= 100, what="first 100")
    await eventually(lambda: cut.flushed() and other.flushed(), what="both checkpoints flushed")
    rule = proxied["dynamodb"].add_rule(Fault.http_503())
    produced += put(url, stream, 100, 100)  # written during the outage
    await eventually(lambda: len(other.owned()) == 2, timeout=20, what="takeover")
    await eventually(lambda: len(set(datas(sink))) >= 200, timeout=20, what="all 200")
    rule.remove()
    await eventually(
        lambda: len(cut.owned()) == 1 and len(other.owned()) == 1, timeout=20, what="rejoin"
    )
    produced += put(url, stream, 200, 100)
    await eventually(lambda: len(set(datas(sink))) >= 300, timeout=20, what="all 300")
    stats = cut.consumer.stats()
    await cut.close()
    await other.close()
    assert sorted(set(datas(sink))) == sorted(produced)
    assert any(key.startswith("dynamodb.") for key in stats.retries)
    copies: dict[bytes, list[str]] = {}
    for client, record in sink:
        copies.setdefault(record.data, []).append(client)
    twice = {data: who for data, who in copies.items() if len(who) > 1}
    print(f"duplicates after the outage: {len(twice)}")
    for data, who in twice.items():
        # Delivered by the cut-off member during the outage (no checkpoint possible), then by
        # the survivor; never the other way round, which would mean both read at once.
        assert who == ["cut", "other"], (data, who)
        assert 100 <= int(data) < 200


async def test_handoff_release_survives_writes_failing_past_the_retry_budget(
    proxied: dict[str, Any],
) -> None:
    """The release write of a handoff keeps trying: until it lands the shard is owned by a live
    member and nobody else may claim it, so giving up would strand the shard."""
    url, stream = proxied["url"], proxied["stream"]
    create_stream(url, stream, 2)
    config = proxied["config"]
    direct = config.replace(dynamodb_endpoint=proxied["dynamodb"].upstream_url)
    sink: list[tuple[str, Record]] = []
    a = Member(config.replace(client_id="a"), [stream], sink).start()
    await eventually(lambda: len(a.owned()) == 2, what="a owns both shards")
    produced = put(url, stream, 0, 50)
    await eventually(lambda: len(sink) >= 50, what="first 50")
    # Many more failures than one write's retry budget (6 attempts), periodic flushes included.
    rule = proxied["dynamodb"].add_rule(Fault.http_500(), operation="UpdateItem", count=30)
    b = Member(direct.replace(client_id="b"), [stream], sink).start()
    await eventually(
        lambda: len(a.owned()) == 1 and len(b.owned()) == 1, timeout=30, what="handoff to b"
    )
    assert rule.exhausted  # the handoff went through only after the faults ran out
    produced += put(url, stream, 50, 50)
    await eventually(lambda: len(set(datas(sink))) >= 100, what="all 100")
    assert a.error is None and a.consumer.stats().state == "running"  # a kept going throughout
    await a.close()
    await b.close()
    assert sorted(set(datas(sink))) == sorted(produced)
    assert duplicates(sink) == {}
