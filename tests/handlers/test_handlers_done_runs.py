"""Records done above the checkpoint (``run(ordering="key")``): a handoff that abandons a blocked
call leaves the checkpoint below it, and the next owner must not handle again the records other
keys finished after it (kinesalite + dynalite, at the default LATEST); plus the encoding.

The done runs are written with the checkpoint (``done``, :mod:`kinesumer.core.done_ranges`); a
next owner on any face (``run()`` or ``consume()``) skips the records inside them.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from support.group import create_stream, make_config, put, setup_table
from support.handlers import Run
from support.wait import wait_until

from kinesumer import Kinesumer, Record
from kinesumer.core import done_ranges
from kinesumer.handlers import Block, Retry
from kinesumer.models import Checkpoint, Position
from kinesumer.read.progress import shard_lease

FAST_BLOCK = Block(retry=Retry(attempts=2, backoff=0.02, max_backoff=0.05))


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    return {"config": config, "stream": stream, "url": kinesalite.url}


def reading(consumer: Kinesumer) -> bool:
    """The member holds its shard and its first GetRecords came back (a LATEST iterator is
    open: records put from now on are read)."""
    shards = consumer.stats().shards
    return bool(shards) and all(s.millis_behind is not None for s in shards)


def done_attribute(config: Any, stream: str) -> bytes:
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    )
    items = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
        ConsistentRead=True,
    )["Items"]
    return b"".join(bytes(item.get("done", {}).get("B", b"")) for item in items)


def first_owner_blocks(group: dict[str, Any]) -> tuple[list[int], int]:
    """Member "a" handles record 0, blocks on record 1 (key "stuck") and handles records
    2..31 of other keys; then it closes (a graceful handoff that abandons the blocked call).
    Returns what it handled and the number of the next record to put."""
    config, stream, url = group["config"], group["stream"], group["url"]
    lock = threading.Lock()
    handled: list[int] = []

    def handle(record: Record) -> None:
        if record.partition_key == "stuck":
            raise RuntimeError("blocked")
        with lock:
            handled.append(int(record.data))

    first = Kinesumer(config.replace(client_id="a"))
    run = Run(first, [stream], handle, concurrency=8, ordering="key", on_failure=FAST_BLOCK)
    wait_until(lambda: reading(first), 30, "member a reading its shard")
    put(url, stream, 0, 1, key=lambda i: "k0")
    wait_until(lambda: handled == [0], 30, "record 0 handled")
    wait_until(lambda: first.stats().shards[0].checkpoint is not None, 30, "a checkpoint")
    put(url, stream, 1, 1, key=lambda i: "stuck")
    put(url, stream, 2, 30, key=lambda i: f"k{i % 7}")
    wait_until(lambda: len(handled) == 31, 30, "records 2..31 handled past the blocked one")
    run.stop()  # the handoff abandons the blocked call
    return sorted(handled), 32


def test_graceful_handoff_skips_records_done_after_an_abandoned_call(
    group: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    config, stream, url = group["config"], group["stream"], group["url"]
    handled_first, next_number = first_owner_blocks(group)
    assert handled_first == [0, *range(2, 32)]
    # The abandoned call left nothing in the application's hands: the handoff did not wait
    # out handoff_timeout for it.
    assert "did not finish its record" not in caplog.text
    assert done_attribute(config, stream), "no done runs written with the handoff"
    lock = threading.Lock()
    second_handled: list[int] = []

    def handle(record: Record) -> None:
        with lock:
            second_handled.append(int(record.data))

    second = Kinesumer(config.replace(client_id="b"))
    run = Run(second, [stream], handle, concurrency=8, ordering="key")
    try:
        wait_until(lambda: 1 in second_handled, 30, "the blocked record handled by b")
        put(url, stream, next_number, 1, key=lambda i: "k1")
        wait_until(lambda: next_number in second_handled, 30, "the record put after")
    finally:
        run.stop()
    # Only the abandoned record and the new one: nothing a finished twice.
    assert sorted(second_handled) == [1, next_number]


def test_consume_after_a_handoff_skips_done_records(group: dict[str, Any]) -> None:
    """The next owner iterates with consume(): it skips them too, and its own checkpoint
    moves past them (a third owner starts after the last record)."""
    config, stream, url = group["config"], group["stream"], group["url"]
    _, next_number = first_owner_blocks(group)
    put(url, stream, next_number, 1, key=lambda i: "k1")
    seen: list[int] = []
    with Kinesumer(config.replace(client_id="b")) as second:
        for record in second.consume([stream]):
            seen.append(int(record.data))
            if int(record.data) == next_number:
                break
    assert seen == [1, next_number]
    assert not done_attribute(config, stream), "done runs left behind the checkpoint"


# -- units ----------------------------------------------------------------------------------
def test_encoding_round_trips_and_stays_in_budget() -> None:
    base = Position("49590338271490256608559692538361571095921575989136588802")
    draw = random.Random(7).randrange
    runs, at = [], int(base.sequence_number)
    for _ in range(2000):  # gaps as irregular as real sequence numbers'
        first = at + draw(1, 10**12)
        at = first + draw(0, 10**12)
        runs.append(((first, 0), (at, draw(0, 3))))
    blob, kept = done_ranges.encode(base, runs)
    assert len(blob) <= done_ranges.DONE_BUDGET
    assert 0 < kept < len(runs)  # the runs nearest the base were kept
    decoded_base, decoded = done_ranges.decode(blob)
    assert decoded_base == base
    assert decoded == runs[:kept]
    small, kept_all = done_ranges.encode(None, runs[:5])
    assert kept_all == 5 and done_ranges.decode(small) == (None, runs[:5])
    with pytest.raises(ValueError):
        done_ranges.decode(b"\x02garbage")


def test_runs_apply_only_to_the_position_they_were_written_with() -> None:
    """A writer that moved the checkpoint without knowing the runs (an older member, a sink,
    an operator) voids them: nothing is skipped then."""
    seq = 10**50
    runs = [((seq + 5, 0), (seq + 9, 0))]
    blob, _ = done_ranges.encode(Position(str(seq)), runs)

    def record(n: int) -> Record:
        return Record("s", "shard", str(seq + n), 0, "k", b"", None)

    lease = shard_lease(Checkpoint("s", "shard", str(seq), owner="me", lease=2, done=blob))
    assert lease.progress.skipping
    assert [n for n in (3, 5, 7, 9, 10) if lease.progress.already_done(record(n))] == [5, 7, 9]
    assert not lease.progress.skipping  # passed the last run: no more checks
    moved = shard_lease(Checkpoint("s", "shard", str(seq + 1), owner="me", lease=2, done=blob))
    assert not moved.progress.skipping and not moved.progress.already_done(record(5))
    # What a write carries forward: the inherited runs still above the position.
    moved_on = shard_lease(Checkpoint("s", "shard", str(seq), owner="me", lease=2, done=blob))
    moved_on.progress.mark_processed(Position(str(seq + 6)))
    # (cut to start at the mark: the encoding counts from it)
    assert moved_on.progress.done_marks() == (
        Position(str(seq + 6)),
        [((seq + 6, 0), (seq + 9, 0))],
    )
    moved_on.progress.mark_processed(Position(str(seq + 9)))
    assert moved_on.progress.done_marks() == (Position(str(seq + 9)), [])


def test_checkpoint_item_codec_carries_the_done_runs() -> None:
    """Set with the position, removed when none are left, untouched when not given; an item
    without them (an older version's) reads as none; an operator's move removes them."""
    from kinesumer.statestore.dynamodb import codecs

    checkpoint = Checkpoint("s", "shard", "5", owner="me", lease=3)
    position = Position("9")
    written = codecs.checkpoint_update(
        checkpoint, position, finished=False, release=False, done=b"\x01runs"
    )
    assert "#done = :done" in written["UpdateExpression"]
    assert written["ExpressionAttributeValues"][":done"] == {"B": b"\x01runs"}
    removed = codecs.checkpoint_update(checkpoint, position, finished=False, release=True, done=b"")
    assert removed["UpdateExpression"].endswith("REMOVE #owner, #done")
    untouched = codecs.checkpoint_update(checkpoint, position, finished=False, release=False)
    assert "#done" not in untouched["UpdateExpression"]
    assert "#done" not in untouched["ExpressionAttributeNames"]
    item = {"pk": {"S": "check_point#a#s"}, "sk": {"S": "shard"}, "owner": {"S": "me"}}
    assert codecs.decode_checkpoint("s", item, "t").done == b""
    item["done"] = {"B": b"\x01runs"}
    assert codecs.decode_checkpoint("s", item, "t").done == b"\x01runs"
    assert "#done" in codecs.move_update(checkpoint, None)["UpdateExpression"]


async def test_runs_beyond_the_budget_are_left_out_and_counted() -> None:
    """A flush whose done runs would not fit writes those nearest the mark (the rest is
    delivered again, at-least-once) and counts it; the mark itself is always written."""
    from kinesumer.group.checkpointer import Checkpointer

    written: list[tuple[Position | None, bytes | None]] = []

    class Store:
        async def write_checkpoint(
            self, checkpoint: Any, position: Any, *, finished: bool, release: bool, **kw: Any
        ) -> bool:
            written.append((position, kw.get("done")))
            return True

    seq = 10**50
    draw = random.Random(3).randrange
    runs, at = [], seq
    for _ in range(3000):
        first = at + draw(2, 10**9)
        at = first + draw(0, 10**9)
        runs.append(((first, 0), (at, 0)))
    lease = shard_lease(Checkpoint("s", "shard", str(seq - 5), owner="me", lease=2))
    lease.progress.set_done_source(lambda: (Position(str(seq)), runs))
    checkpointer = Checkpointer(Store(), "me")  # type: ignore[arg-type]
    assert await checkpointer.write(lease)
    [(position, blob)] = written
    assert position == Position(str(seq)) and blob is not None
    assert len(blob) <= done_ranges.DONE_BUDGET
    base, kept = done_ranges.decode(blob)
    assert base == position and 0 < len(kept) < len(runs) and kept == runs[: len(kept)]
    assert checkpointer.done_truncated == 1
    assert lease.claim.done_written == blob
    assert await checkpointer.write(lease)  # nothing changed: no write
    assert len(written) == 1
