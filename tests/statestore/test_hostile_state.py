"""One app cannot stop, stall or exhaust another on a shared state table (issue 18).

Items are tampered with through a plain boto3 client on the same table, as another app's
consumer policy could: a malformed client item (a bare KeyError('N') in every member before), a
checkpoint that is not one, a view head and controls of the wrong types, and a shard cache chunk
that inflates to 300 MB. The members keep running: they skip what they cannot read (logged once,
counted in ``stats()``), do not read a shard whose checkpoint is corrupt nor overwrite it, keep
their last good shard list, and read the shard again once its checkpoint is repaired. Every
decoder raises :class:`CorruptStateError` naming the item.
"""

from __future__ import annotations

import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.group import Member, create_stream, make_config, setup_table
from support.wait import eventually

from kinesumer import CorruptStateError, Record
from kinesumer.aws import AwsClients, RequestStats
from kinesumer.statestore import DynamoDBStateStore
from kinesumer.statestore.dynamodb import codecs, view
from kinesumer.statestore.dynamodb.controls import decode_controls
from kinesumer.statestore.dynamodb.shard_cache import (
    MAX_BODY_BYTES,
    MAX_CHUNKS,
    ShardCacheItems,
    inflate,
)
from kinesumer.statestore.dynamodb.table import StateTable

Names = Callable[[str], str]


def dynamodb(url: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")


def bomb(inflated: int = 300 * 1024 * 1024) -> bytes:
    """``inflated`` zero bytes, compressed (about 300 KB for 300 MB: one chunk item)."""
    packer = zlib.compressobj(9)
    block = bytes(1024 * 1024)
    parts = [packer.compress(block) for _ in range(inflated // len(block))]
    return b"".join([*parts, packer.flush()])


def put_bomb(url: str, table: str, app: str, stream: str, chunks: int = 1) -> None:
    """Point ``stream``'s shard cache head at a decompression bomb."""
    client = dynamodb(url)
    client.put_item(TableName=table, Item=codecs.chunk_item(app, "bomb", 0, bomb()))
    head = codecs.shard_cache_head(
        app, stream, digest="0" * 32, body_key="bomb", chunks=chunks, shard_count=1
    )
    client.put_item(TableName=table, Item=head)


@pytest.fixture
def table(moto_url: str, unique_name: Names) -> dict[str, Any]:
    config = make_config(moto_url, moto_url, unique_name("app"), unique_name("state"))
    setup_table(config)
    return {"config": config, "url": moto_url, "app": config.app, "table": config.dynamodb_table}


async def test_a_decompression_bomb_is_refused_within_the_bound(table: dict[str, Any]) -> None:
    """A 306 KB chunk that inflated to 300 MB raised a member's peak from 143 to 775 MB."""
    put_bomb(table["url"], table["table"], table["app"], "orders")
    stats = RequestStats()
    aws = AwsClients(table["config"], stats)
    await aws.open()
    try:
        items = ShardCacheItems(StateTable(aws.dynamodb, table["table"], stats), table["app"])
        tracemalloc.start()
        try:
            with pytest.raises(CorruptStateError, match="inflates past") as caught:
                await items.load("orders")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 * MAX_BODY_BYTES, f"peak {peak / 1e6:.0f} MB"
        assert (caught.value.pk, caught.value.sk) == (f"shard_cache#{table['app']}", "orders")
        # The store's reader skips it (the caller keeps its cache), counted once; the refused
        # body is not fetched again while the head names it.
        store = DynamoDBStateStore(aws.dynamodb, table["table"], table["app"], stats)
        gets = stats.counts()["requests"]["dynamodb:GetItem"]
        assert await store.load_shard_cache("orders") is None
        assert await store.load_shard_cache("orders") is None
        assert stats.counts()["requests"]["dynamodb:GetItem"] == gets + 3  # head, chunk, head
        assert stats.counts()["corrupt_state_items"] == {"shard_cache": 1}
        # A head naming more chunks than any valid body needs: refused before any chunk read.
        put_bomb(table["url"], table["table"], table["app"], "payments", chunks=MAX_CHUNKS + 1)
        with pytest.raises(CorruptStateError, match="chunks"):
            await items.load("payments")
        assert stats.counts()["requests"]["dynamodb:GetItem"] == gets + 4
    finally:
        await aws.close()


def test_inflate_stops_at_the_bound() -> None:
    with pytest.raises(ValueError, match="inflates past"):
        inflate(bomb(2 * MAX_BODY_BYTES))
    assert inflate(zlib.compress(bytes(MAX_BODY_BYTES))) == bytes(MAX_BODY_BYTES)
    with pytest.raises(ValueError, match="truncated"):
        inflate(zlib.compress(b"x" * 1000)[:-4])


# -- every decoder: a value or CorruptStateError naming the item, never KeyError & co --------
values = st.one_of(
    st.fixed_dictionaries({"S": st.text(max_size=5)}),
    st.fixed_dictionaries({"N": st.sampled_from(["1", "-1", "1.5", "x", "", "1e3"])}),
    st.fixed_dictionaries({"BOOL": st.booleans()}),
    st.fixed_dictionaries({"L": st.lists(st.just({"N": "1"}), max_size=2)}),
    st.fixed_dictionaries({"M": st.dictionaries(st.text(max_size=3), st.just({"S": "x"}))}),
    st.fixed_dictionaries({"NULL": st.just(True)}),
    st.just({}),
)
NAMES = [
    "last_update", "streams", "host", "pid", "owned", "owned_count", "assignment", "version",
    "sequence_number", "sub_sequence_number", "owner", "lease", "finished", "members",
    "read_at", "digests", "changes", "pins", "step_downs", "rebalance",
]  # fmt: skip
items = st.dictionaries(st.sampled_from(NAMES), values, max_size=6).map(
    lambda d: {"pk": {"S": "client#victim"}, "sk": {"S": "intruder"}, **d}
)


@settings(max_examples=300, deadline=None)
@given(items)
def test_every_decoder_gives_a_value_or_names_the_item(item: dict[str, Any]) -> None:
    decoders: list[Callable[[dict[str, Any]], object]] = [
        codecs.decode_client,
        lambda i: codecs.decode_checkpoint("s", i, "t"),
        view.decode_head,
        decode_controls,
    ]
    for decode in decoders:
        try:
            decode(item)
        except CorruptStateError as exc:
            assert "intruder" in str(exc)
            assert (exc.pk, exc.sk) == ("client#victim", "intruder")


def test_the_reported_client_item() -> None:
    """``last_update`` as a string: KeyError('N') in every member before."""
    item = {"pk": {"S": "client#victim"}, "sk": {"S": "x"}, "last_update": {"S": "soon"}}
    with pytest.raises(CorruptStateError, match="'last_update' is not of type N") as caught:
        codecs.decode_client(item)
    assert (caught.value.pk, caught.value.sk) == ("client#victim", "x")
    clients, errors = codecs.readable_clients([item, {**item, "last_update": {"N": "5"}}])
    assert [c.last_update_ms for c in clients] == [5] and len(errors) == 1


# -- a running group ---------------------------------------------------------------------------
def put_keyed(url: str, stream: str, numbers: range) -> dict[bytes, str]:
    """Put records b"<n>" with varied keys; data -> the shard each landed in."""
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    records = [{"Data": str(n).encode(), "PartitionKey": f"key-{n}"} for n in numbers]
    answer = client.put_records(StreamName=stream, Records=records)
    return {r["Data"]: a["ShardId"] for r, a in zip(records, answer["Records"], strict=True)}


async def test_tampered_items_do_not_stop_a_running_group(
    table: dict[str, Any], unique_name: Names
) -> None:
    url, app, name = table["url"], table["app"], table["table"]
    stream = unique_name("s")
    create_stream(url, stream, 2)
    shards = put_keyed(url, stream, range(40))
    victim_shard = shards[b"0"]
    sink: list[tuple[str, Record]] = []
    config = table["config"]
    a = Member(config.replace(client_id="a"), [stream], sink).start()
    b = Member(config.replace(client_id="b"), [stream], sink).start()
    await eventually(lambda: len({r.data for _, r in sink}) == 40, 30, "the first 40 records")

    intruder = dynamodb(url)

    def put(**item: Any) -> None:
        intruder.put_item(TableName=name, Item=item)

    put(pk={"S": f"client#{app}"}, sk={"S": "0-intruder"}, last_update={"S": "soon"})
    put(pk={"S": f"view#{app}"}, sk={"S": "head"}, version={"S": "x"}, digests={"S": "x"})
    put(pk={"S": f"controls#{app}"}, sk={"S": "controls"}, version={"S": "x"})
    put(
        pk={"S": f"check_point#{app}#{stream}"},
        sk={"S": victim_shard},
        sequence_number={"S": "not-a-number"},
    )
    put_bomb(url, name, app, stream)

    def delivered() -> set[bytes]:
        return {r.data for _, r in sink}

    def stats() -> list[Any]:
        return [m.consumer.stats() for m in (a, b)]

    # Its owner loses the shard at its next checkpoint write (refused: no owner in the item).
    await eventually(
        lambda: any(s.unreadable_shards for s in stats()), 30, "the corrupt checkpoint noted"
    )
    later = put_keyed(url, stream, range(40, 80))
    readable = {data for data, shard in later.items() if shard != victim_shard}
    assert readable and len(readable) < 40
    await eventually(lambda: readable <= delivered(), 30, "the records of the readable shard")
    # A member joining now (a restart) joins too; the shard stays unread, its item untouched.
    c = Member(config.replace(client_id="c"), [stream], sink).start()
    await eventually(lambda: c.consumer.stats().state == "running", 30, "c joined")
    await eventually(lambda: len(c.consumer.stats().live_members) == 3, 30, "c counted")
    assert all(m.error is None and m.task and not m.task.done() for m in (a, b, c))
    assert not any(d in delivered() for d, shard in later.items() if shard == victim_shard)
    noted = {key: why for s in stats() for key, why in s.unreadable_shards.items()}
    assert list(noted) == [f"{stream}/{victim_shard}"]
    assert "not-a-number" in noted[f"{stream}/{victim_shard}"]
    kinds = set().union(*(s.corrupt_state_items for s in stats()))
    assert {"client", "checkpoint", "shard_cache", "view"} <= kinds
    key = {"pk": {"S": f"check_point#{app}#{stream}"}, "sk": {"S": victim_shard}}
    item = intruder.get_item(TableName=name, Key=key, ConsistentRead=True)["Item"]
    assert item["sequence_number"] == {"S": "not-a-number"} and "owner" not in item

    # The leader's next shard sync writes a fresh shard cache over the refused one.
    cache_key = codecs.shard_cache_key(app, stream)

    def head_digest() -> str:
        head = intruder.get_item(TableName=name, Key=cache_key, ConsistentRead=True)["Item"]
        return str(head["digest"]["S"])

    await eventually(lambda: head_digest() != "0" * 32, 30, "the shard cache rewritten")
    # Repaired (deleted): the shard is read again, from the initial position.
    intruder.delete_item(TableName=name, Key=key)
    await eventually(lambda: set(later) <= delivered(), 30, "the repaired shard's records")
    await eventually(
        lambda: not any(m.consumer.stats().unreadable_shards for m in (a, b, c)), 30, "cleared"
    )
    for member in (a, b, c):
        await member.close()
        assert member.error is None


def test_a_checkpoint_attribute_of_another_type_is_corrupt() -> None:
    """Read as lease 0 before: every claim of it was refused, retried five times a second."""
    item = {"pk": {"S": "check_point#a#s"}, "sk": {"S": "shard-1"}, "lease": {"S": "7"}}
    with pytest.raises(CorruptStateError, match="'lease' is not of type N") as caught:
        codecs.decode_checkpoint("s", item, "t")
    assert (caught.value.pk, caught.value.sk) == ("check_point#a#s", "shard-1")
