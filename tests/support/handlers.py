"""``run()`` on the real engine (kinesalite + dynalite): a run in a background thread, the
checkpoints it left, and a stream read back (dead letters, retry-later writes)."""

from __future__ import annotations

import threading
from typing import Any

import boto3

from kinesumer import Config, Kinesumer, Record
from support.group import kinesis
from support.scenario import read_checkpoints


class Run:
    """``consumer.run(...)`` on a thread of its own; what it raised, once it returned."""

    def __init__(self, consumer: Kinesumer, *args: Any, **kwargs: Any) -> None:
        self.consumer = consumer
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=args, kwargs=kwargs, daemon=True)
        self.thread.start()

    def _main(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.consumer.run(*args, **kwargs)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run() did not return"

    def stop(self) -> None:
        """Close from another thread, as an application's signal helper would; run() returns."""
        self.consumer.close()
        self.join()
        assert self.error is None, f"run() raised {self.error!r}"


def checkpoints(config: Config, stream: str) -> dict[str, int | None]:
    """Shard id -> checkpointed sequence number (as an int), read from the table."""
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name="us-east-1"
    )
    items = read_checkpoints(client, config.dynamodb_table, config.app, stream)
    return {
        shard: None if item["sequence_number"] is None else int(item["sequence_number"])
        for shard, item in items.items()
    }


def read_stream(url: str, stream: str) -> list[Record]:
    """Every record of ``stream``, from its start, shard by shard."""
    client = kinesis(url)
    found: list[Record] = []
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for r in client.get_records(ShardIterator=iterator)["Records"]:
            found.append(
                Record(
                    stream,
                    shard["ShardId"],
                    r["SequenceNumber"],
                    0,
                    r["PartitionKey"],
                    r["Data"],
                    r["ApproximateArrivalTimestamp"],
                )
            )
    return found
