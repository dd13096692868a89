"""A stand-in enhanced fan-out transport that pushes a real stream's records (kinesalite).

Each subscription reads the shard with GetShardIterator/GetRecords from the subscription's
starting position and yields them as SubscribeToShard events would come: records, the
continuation sequence number (the last record's; None at SHARD_END), MillisBehindLatest and, at
the end, the child shards when ``send_children``. It also plays AWS's awkward parts on demand:
a subscription that ends after ``expire_after`` events (AWS: every 5 minutes), ResourceInUse
while another subscription to the shard is open (kinesis-local's answer to a second one) and
for the first ``busy_first`` attempts of each shard, and it records every starting position so
that a test can check resubscriptions start right after the last record.

Plugged into a member with ``engine_of(consumer).efo_transport = fake.transport()``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import boto3

from kinesumer.read.efo_session import EfoTransport


class FakeSubscribeError(Exception):
    """An error SubscribeToShard answers with (its ``code`` is AWS's error code)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class FakeEvent:
    records: list[dict[str, Any]]
    continuation_sequence_number: str | None
    millis_behind_latest: int | None
    child_shards: list[dict[str, Any]] | None


@dataclass
class FakeEfo:
    url: str
    expire_after: int = 0  # events per subscription (0: never expires)
    busy_first: int = 0  # ResourceInUse for the first N subscriptions of each shard
    send_children: bool = False
    never_end: bool = False  # kinesis-local: a closed shard's subscription never says SHARD_END
    event_records: int = 25  # at most this many records per event
    refuse: set[str] = field(default_factory=set)  # shards whose subscriptions are refused
    starve: set[str] = field(default_factory=set)  # shards sent empty events "5 s behind"
    positions: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events_sent: Counter[str] = field(default_factory=Counter)
    #: Subscriptions whose reading position is set (their iterator opened), by shard: at LATEST,
    #: a record written before this is legitimately not read, so a test waits for it.
    opened: Counter[str] = field(default_factory=Counter)
    registrations: list[tuple[str, str]] = field(default_factory=list)
    _open: set[tuple[str, str]] = field(default_factory=set)
    _attempts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def transport(self) -> EfoTransport:
        async def stream_arn(client: Any, stream: str) -> str:
            return f"arn:aws:kinesis:us-east-1:123456789012:stream/{stream}"

        async def register(client: Any, stream_arn: str, name: str) -> str:
            self.registrations.append((stream_arn, name))
            return f"{stream_arn}/consumer/{name}:1"

        return EfoTransport(stream_arn, register, lambda: self)

    def subscribe(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[FakeEvent]:
        return self._events(consumer_arn, shard_id, dict(position))

    async def _events(
        self, consumer_arn: str, shard_id: str, position: dict[str, Any]
    ) -> AsyncIterator[FakeEvent]:
        stream = consumer_arn.split("stream/")[1].split("/consumer/")[0]
        key = (consumer_arn, shard_id)
        with self._lock:
            self.positions.append((shard_id, position))
            self._attempts[shard_id] += 1
            busy = key in self._open or shard_id in self.refuse
            if busy or self._attempts[shard_id] <= self.busy_first:
                raise FakeSubscribeError("ResourceInUseException")
            self._open.add(key)
        client = boto3.client("kinesis", endpoint_url=self.url, region_name="us-east-1")
        try:
            iterator = await asyncio.to_thread(self._iterator, client, stream, shard_id, position)
            self.opened[shard_id] += 1
            sent = 0
            last: str | None = position.get("SequenceNumber")
            while True:
                if shard_id in self.starve and last is not None:
                    await asyncio.sleep(0.2)
                    yield FakeEvent([], last, 5000, None)
                    continue
                response = await asyncio.to_thread(
                    client.get_records, ShardIterator=iterator, Limit=self.event_records
                )
                records = response["Records"]
                iterator = response.get("NextShardIterator")
                if records:
                    last = records[-1]["SequenceNumber"]
                elif iterator is None and self.never_end:
                    while True:  # until the subscriber closes the subscription
                        await asyncio.sleep(0.2)
                        self.events_sent[shard_id] += 1
                        yield FakeEvent([], last, 0, None)
                elif iterator is not None:
                    await asyncio.sleep(0.1)
                    if last is None:
                        continue  # nothing to continue from yet: send nothing
                children = self._children(client, stream, shard_id) if iterator is None else None
                self.events_sent[shard_id] += 1
                yield FakeEvent(
                    records,
                    None if iterator is None else last,
                    response.get("MillisBehindLatest", 0),
                    children,
                )
                sent += 1
                if iterator is None or (self.expire_after and sent >= self.expire_after):
                    return
        finally:
            with self._lock:
                self._open.discard(key)

    @staticmethod
    def _iterator(client: Any, stream: str, shard_id: str, position: dict[str, Any]) -> str:
        kwargs: dict[str, Any] = {
            "StreamName": stream,
            "ShardId": shard_id,
            "ShardIteratorType": position["Type"],
        }
        if "SequenceNumber" in position:
            kwargs["StartingSequenceNumber"] = position["SequenceNumber"]
        if "Timestamp" in position:
            kwargs["Timestamp"] = position["Timestamp"]
        iterator: str = client.get_shard_iterator(**kwargs)["ShardIterator"]
        return iterator

    def _children(self, client: Any, stream: str, shard_id: str) -> list[dict[str, Any]] | None:
        if not self.send_children:
            return None
        shards = client.list_shards(StreamName=stream)["Shards"]
        return [
            {"ShardId": s["ShardId"], "ParentShards": [shard_id]}
            for s in shards
            if shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))
        ]
