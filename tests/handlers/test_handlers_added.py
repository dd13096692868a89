"""Handlers added and removed while ``run()`` runs, by key (issue 21), on kinesalite + dynalite.

A handler added later gets the records read after it was added, filtered by stream and key
(the partition key, or one taken from the payload), with its own policy and counters; removing
it disturbs neither ``run()``'s handler nor the checkpoints; a record's checkpoint waits for
every handler it was read for.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, make_config, setup_table
from support.handlers import Run, checkpoints
from support.wait import eventually, wait_until

from kinesumer import AsyncKinesumer, Config, ConfigError, Kinesumer, Record
from kinesumer.handlers import Discard, RetryLater


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    return {"config": config, "stream": stream, "url": kinesalite.url}


class Seen:
    """What one handler was given (thread-safe)."""

    def __init__(self, fail_on: set[int] | None = None) -> None:
        self.numbers: list[int] = []
        self.fail_on = fail_on or set()
        self.lock = threading.Lock()

    def __call__(self, record: Record) -> None:
        number = int(json.loads(record.data)["n"])
        with self.lock:
            self.numbers.append(number)
        if number in self.fail_on:
            raise RuntimeError(f"cannot take {number}")

    def __len__(self) -> int:
        with self.lock:
            return len(self.numbers)


def put_json(url: str, stream: str, start: int, count: int) -> None:
    """Records n = start..start+count-1, partition key k<n % 10>, payload {"n", "owner"}."""
    from support.group import kinesis

    client = kinesis(url)
    client.put_records(
        StreamName=stream,
        Records=[
            {
                "Data": json.dumps({"n": n, "owner": f"o{n % 4}"}).encode(),
                "PartitionKey": f"k{n % 10}",
            }
            for n in range(start, start + count)
        ],
    )


@pytest.mark.parametrize("concurrency", [1, 4])
def test_handlers_added_and_removed_during_a_run(group: dict[str, Any], concurrency: int) -> None:
    """Concurrency 1: the inline runner (the plain path switches to the full one); 4: the pool
    with key ordering."""
    config, stream, url = group["config"], group["stream"], group["url"]
    main, by_key, by_owner = Seen(), Seen(), Seen(fail_on={110})
    consumer = Kinesumer(config)
    ordering = "key" if concurrency > 1 else "shard"
    run = Run(consumer, [stream], main, concurrency=concurrency, ordering=ordering)
    put_json(url, stream, 0, 100)
    wait_until(lambda: len(main) >= 100, 60, "the first 100 records")
    consumer.add_handler("by-key", by_key, keys={"k1", "k2"})
    consumer.add_handler(
        "by-owner",
        by_owner,
        streams=[stream],
        keys={"o2"},
        key_of=lambda record: json.loads(record.data)["owner"],
        on_failure=Discard(),
    )
    put_json(url, stream, 100, 100)
    wait_until(lambda: len(main) >= 200, 60, "the next 100 records")
    wait_until(lambda: len(by_key) >= 20 and len(by_owner) >= 25, 30, "the added handlers")
    consumer.remove_handler("by-key")
    put_json(url, stream, 200, 100)
    wait_until(lambda: len(main) >= 300, 60, "the last 100 records")
    wait_until(lambda: len(by_owner) >= 50, 30, "by-owner's records of the last 100")
    last = checkpoints_wanted(config, stream)
    run.stop()
    assert sorted(main.numbers) == list(range(300))
    assert sorted(by_key.numbers) == [n for n in range(100, 200) if n % 10 in (1, 2)]
    assert sorted(set(by_owner.numbers)) == [n for n in range(100, 300) if n % 4 == 2]
    handled = consumer.stats().handled
    assert handled["by-key"] == {"ok": 20}
    assert handled["by-owner"]["ok"] == 49 and handled["by-owner"]["discarded"] == 1
    assert checkpoints(config, stream) == last


def checkpoints_wanted(config: Config, stream: str) -> dict[str, int | None]:
    """Every record handled: the checkpoints reach each shard's last record."""
    from support.group import kinesis

    client = kinesis(config.kinesis_endpoint)
    last: dict[str, int | None] = {}
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records = client.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
        last[shard["ShardId"]] = int(records[-1]["SequenceNumber"]) if records else None
    wait_until(lambda: checkpoints(config, stream) == last, 30, "checkpoints at the last records")
    return last


def test_a_checkpoint_waits_for_an_added_handler(group: dict[str, Any]) -> None:
    """run()'s handler finished record 150, the added one blocks on it: its shard's checkpoint
    stays before it until the added handler is released."""
    config, stream, url = group["config"], group["stream"], group["url"]
    main = Seen()
    release = threading.Event()
    blocked: list[Record] = []

    def slow(record: Record) -> None:
        if json.loads(record.data)["n"] == 150:
            blocked.append(record)
            release.wait(30)

    consumer = Kinesumer(config)
    run = Run(consumer, [stream], main, concurrency=4, ordering="key")
    put_json(url, stream, 0, 100)
    wait_until(lambda: len(main) >= 100, 60, "the first 100 records")
    consumer.add_handler("slow", slow)
    put_json(url, stream, 100, 100)
    wait_until(lambda: bool(blocked), 60, "the added handler blocking on record 150")
    stuck = blocked[0]
    time.sleep(2 * config.commit_interval)  # flushes happen; the mark must not pass it
    mark = checkpoints(config, stream).get(stuck.shard_id)
    assert mark is None or mark < int(stuck.sequence_number)
    assert 150 in main.numbers, "run()'s own handler was done with it"
    release.set()
    wait_until(
        lambda: (
            (checkpoints(config, stream).get(stuck.shard_id) or 0) >= int(stuck.sequence_number)
        ),
        30,
        "the checkpoint past the released record",
    )
    run.stop()


def test_bad_added_handlers_are_named(group: dict[str, Any]) -> None:
    consumer = Kinesumer(group["config"])
    with pytest.raises(ConfigError, match="on_failure"):
        consumer.add_handler("later", print, on_failure=RetryLater("retry-stream"))
    consumer.add_handler("audit", print)
    with pytest.raises(ConfigError, match="audit"):
        consumer.add_handler("audit", print)
    with pytest.raises(KeyError):
        consumer.remove_handler("nobody")
    consumer.remove_handler("audit")
    consumer.add_handler("audit", print)  # a removed name may be added again

    async def coroutine(record: Record) -> None: ...

    with pytest.raises(ConfigError, match="handler"):
        consumer.add_handler("async", coroutine)
    consumer.close()


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_async_handlers_added_and_removed(group: dict[str, Any], concurrency: int) -> None:
    """AsyncKinesumer: the same contract, inline (concurrency 1) and in tasks."""
    config, stream, url = group["config"], group["stream"], group["url"]
    main: list[int] = []
    added: list[int] = []

    async def handle(record: Record) -> None:
        main.append(json.loads(record.data)["n"])

    async def audit(record: Record) -> None:
        added.append(json.loads(record.data)["n"])

    consumer = AsyncKinesumer(config)
    ordering = "key" if concurrency > 1 else "shard"
    run = asyncio.create_task(
        consumer.run([stream], handle, concurrency=concurrency, ordering=ordering)
    )
    await asyncio.to_thread(put_json, url, stream, 0, 50)
    await eventually(lambda: len(main) >= 50, 60, "the first 50 records")
    consumer.add_handler("audit", audit, keys={"k3"})
    await asyncio.to_thread(put_json, url, stream, 50, 50)
    await eventually(lambda: len(main) >= 100 and len(added) >= 5, 60, "the next 50")
    consumer.remove_handler("audit")
    await asyncio.to_thread(put_json, url, stream, 100, 50)
    await eventually(lambda: len(main) >= 150, 60, "the last 50")
    await consumer.aclose()
    await asyncio.wait_for(run, 30)
    assert sorted(main) == list(range(150))
    assert sorted(added) == [n for n in range(50, 100) if n % 10 == 3]
    assert consumer.stats().handled["audit"] == {"ok": 5}


def test_a_handler_added_before_run_for_a_stream_run_does_not_read_is_named() -> None:
    """add_handler before run() cannot know run()'s streams: run() checks them, before
    anything starts (a handler for a stream never read would silently never be called).
    The endpoints lead nowhere: nothing may be contacted."""
    config = Config(
        "app",
        "state",
        region="us-east-1",
        kinesis_endpoint="http://127.0.0.1:9",
        dynamodb_endpoint="http://127.0.0.1:9",
    )
    consumer = Kinesumer(config)
    consumer.add_handler("audit", print, streams=["payments"])
    with pytest.raises(ConfigError, match=r"payments not read by the run.*'audit'"):
        consumer.run(["orders"], print)
    consumer.close()


def test_an_added_handlers_key_of_raising_does_not_stop_the_run(group: dict[str, Any]) -> None:
    """Payloads without the key the added handler filters on: its key_of raises. Its own
    policy (Discard) disposes of those records (it is never called with them); run()'s handler
    and the checkpoints go on to the end."""
    from support.group import kinesis

    config, stream, url = group["config"], group["stream"], group["url"]
    main, by_owner = Seen(), Seen()
    consumer = Kinesumer(config)
    consumer.add_handler(
        "by-owner",
        by_owner,
        keys={"o2"},
        key_of=lambda record: json.loads(record.data)["owner"],
        on_failure=Discard(),
    )
    run = Run(consumer, [stream], main, concurrency=4, ordering="key")
    put_json(url, stream, 0, 20)
    kinesis(url).put_records(  # no "owner": key_of raises KeyError
        StreamName=stream,
        Records=[{"Data": json.dumps({"n": n}).encode(), "PartitionKey": "x"} for n in (20, 21)],
    )
    put_json(url, stream, 22, 18)
    wait_until(lambda: len(main) >= 40, 60, "every record to run()'s handler")
    last = checkpoints_wanted(config, stream)
    run.stop()
    assert sorted(main.numbers) == list(range(40))
    assert sorted(by_owner.numbers) == [n for n in range(40) if n % 4 == 2 and n not in (20, 21)]
    handled = consumer.stats().handled["by-owner"]
    assert handled["discarded"] == 2 and handled["ok"] == len(by_owner.numbers)
    assert checkpoints(config, stream) == last
