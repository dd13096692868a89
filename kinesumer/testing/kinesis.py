"""``MemoryKinesis``: Kinesis in memory, a :class:`~kinesumer.kinesis.transport.KinesisTransport`
the reader and producer call as they call AWS.

What it keeps as Kinesis does: streams of N shards splitting the 128-bit hash key space evenly;
a record routed by the MD5 of its partition key (or its ExplicitHashKey) into the open shard
whose range holds it; sequence numbers (56 digits) increasing in every shard and across the
stream; iterators of all five types, which expire five minutes after they were issued by its
clock; GetRecords with Limit (at most 10,000) and a 10 MiB cap, NextShardIterator,
MillisBehindLatest, and ChildShards with no next iterator at a closed shard's end; resharding
(:meth:`~MemoryKinesis.split_shard`, :meth:`~MemoryKinesis.merge_shards`,
:meth:`~MemoryKinesis.update_shard_count`) with parent ids and closed parents; retention
(records older than the stream's retention by its clock are gone, and so are closed shards
whose last record went); records stored as put (a KPL aggregate stays one record: the reader
unpacks it); stream consumers and SubscribeToShard; failures on demand
(:meth:`~MemoryKinesis.fail_next`, :meth:`~MemoryKinesis.fail_next_entries`).

Errors are botocore ``ClientError``\\ s with AWS's codes and HTTP status. Its clock is
``clock()`` (epoch seconds; wall time by default): it never sleeps, and a test moves time by
moving the clock. Every call holds one lock: threads and event loops may share it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import ClientError

from ..kinesis.lean import EpochRawRecord, PutEntry, RawRecord, RecordsAnswer
from ..kinesis.transport import (
    ConsumerDescription,
    ConsumerPage,
    IteratorAnswer,
    IteratorType,
    PutRecordAnswer,
    PutRecordsAnswer,
    PutResultEntry,
    ShardPage,
    StartingPosition,
    StreamSummary,
    SubscribeEvent,
    SubscriptionEnded,
)
from ..models import Record
from .kinesis_model import (
    EPOCH,
    ITERATOR_LIFETIME,
    MAX_ANSWER_BYTES,
    MAX_HASH_KEY,
    MAX_LIMIT,
    MAX_PUT_ENTRIES,
    SEQUENCE_BASE,
    SHARD_SLOTS,
    STATUS_OF_CODE,
    SUBSCRIPTION_LIFETIME,
    ConsumerState,
    Cursor,
    Failure,
    ShardState,
    StoredRecord,
    StreamState,
    child_shard,
    client_error,
    consumer_description,
    decode_cursor,
    encode_cursor,
    event_records,
    hash_key_of,
    shard_description,
    shard_index,
)


class MemoryKinesis:
    """Kinesis in memory (see the module): ``memory = MemoryKinesis();
    memory.create_stream("orders", shards=4)``, then hand it where a Kinesis transport is
    taken. ``clock``: epoch seconds (default :func:`time.time`)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        region: str = "us-east-1",
        account: str = "123456789012",
        create_streams_on_put: bool = False,
    ) -> None:
        """``create_streams_on_put``: a put to a stream that does not exist creates it with one
        shard (a dead-letter stream a handler test never created), where Kinesis answers
        ResourceNotFoundException."""
        self.clock = clock or time.time
        self.region = region
        self.account = account
        self._create_on_put = create_streams_on_put
        self._lock = threading.RLock()
        self._streams: dict[str, StreamState] = {}
        self._count = 0
        self._failures: dict[str, list[Failure]] = {}
        self._entry_failures: list[Failure] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # ---- streams and shards (what a test sets up) -----------------------------------------

    def create_stream(self, name: str, shards: int = 1, *, retention_hours: int = 24) -> None:
        """A stream of ``shards`` open shards splitting the hash key space evenly."""
        if shards < 1:
            raise ValueError("a stream has at least one shard")
        with self._lock:
            if name in self._streams:
                raise client_error(
                    "CreateStream", "ResourceInUseException", f"Stream {name} already exists"
                )
            now = self.clock()
            arn = f"arn:aws:kinesis:{self.region}:{self.account}:stream/{name}"
            stream = StreamState(name, arn, now, retention_hours)
            width = (MAX_HASH_KEY + 1) // shards
            for index in range(shards):
                end = MAX_HASH_KEY if index == shards - 1 else (index + 1) * width - 1
                self._new_shard(stream, index * width, end)
            self._streams[name] = stream

    def delete_stream(self, name: str) -> None:
        with self._lock:
            self._stream("DeleteStream", name)
            del self._streams[name]
        self._wake()

    def set_retention(self, stream: str, hours: int) -> None:
        """The stream's retention (Kinesis: 24 hours to 365 days; any here)."""
        with self._lock:
            self._stream("IncreaseStreamRetentionPeriod", stream).retention_hours = hours

    def split_shard(self, stream: str, shard_id: str, new_starting_hash_key: int | str) -> None:
        """Close ``shard_id`` and open two children: its range below ``new_starting_hash_key``
        and from it."""
        with self._lock:
            s = self._stream("SplitShard", stream)
            parent = self._open_shard("SplitShard", s, shard_id)
            at = int(new_starting_hash_key)
            if not parent.start_hash < at <= parent.end_hash:
                raise client_error(
                    "SplitShard",
                    "InvalidArgumentException",
                    f"NewStartingHashKey {at} is not inside {shard_id}'s hash key range",
                )
            self._close(parent)
            for start, end in ((parent.start_hash, at - 1), (at, parent.end_hash)):
                child = self._new_shard(s, start, end, parent=shard_id)
                parent.children.append(child.shard_id)
        self._wake()

    def merge_shards(self, stream: str, shard_id: str, adjacent_shard_id: str) -> None:
        """Close the two adjacent shards and open one child over both ranges."""
        with self._lock:
            s = self._stream("MergeShards", stream)
            first = self._open_shard("MergeShards", s, shard_id)
            second = self._open_shard("MergeShards", s, adjacent_shard_id)
            low, high = sorted((first, second), key=lambda shard: shard.start_hash)
            if low.end_hash + 1 != high.start_hash:
                raise client_error(
                    "MergeShards",
                    "InvalidArgumentException",
                    f"{shard_id} and {adjacent_shard_id} are not adjacent",
                )
            self._close(first)
            self._close(second)
            child = self._new_shard(
                s, low.start_hash, high.end_hash, parent=shard_id, adjacent=adjacent_shard_id
            )
            first.children.append(child.shard_id)
            second.children.append(child.shard_id)
        self._wake()

    def update_shard_count(self, stream: str, target: int) -> None:
        """Reach ``target`` open shards by splits (of the widest shard, at its middle) and
        merges (of the adjacent pair with the narrowest joint range): every child keeps its
        parents, as with Kinesis's uniform scaling, though the ranges it reaches may differ."""
        if target < 1:
            raise ValueError("a stream has at least one shard")
        with self._lock:
            s = self._stream("UpdateShardCount", stream)
            while True:
                open_shards = sorted(
                    (shard for shard in s.shards.values() if shard.closed_at is None),
                    key=lambda shard: shard.start_hash,
                )
                if len(open_shards) == target:
                    break
                if len(open_shards) < target:
                    widest = max(open_shards, key=lambda shard: shard.end_hash - shard.start_hash)
                    middle = (widest.start_hash + widest.end_hash + 1) // 2
                    self.split_shard(stream, widest.shard_id, middle)
                else:
                    pairs = list(itertools.pairwise(open_shards))
                    low, high = min(pairs, key=lambda pair: pair[1].end_hash - pair[0].start_hash)
                    self.merge_shards(stream, low.shard_id, high.shard_id)

    # ---- failures on demand ---------------------------------------------------------------

    def fail_next(
        self,
        operation: str,
        *,
        code: str = "ProvisionedThroughputExceededException",
        times: int = 1,
        status: int | None = None,
        message: str | None = None,
    ) -> None:
        """The next ``times`` calls of ``operation`` (its API name: ``GetRecords``,
        ``PutRecords``, ``ListShards``, ...) fail with ``code`` (HTTP ``status``: AWS's for the
        code by default) before doing anything."""
        with self._lock:
            self._failures.setdefault(operation, []).append(
                Failure(
                    code,
                    status if status is not None else STATUS_OF_CODE.get(code, 400),
                    message or f"{code} (injected by MemoryKinesis)",
                    times,
                )
            )

    def fail_next_entries(
        self,
        times: int = 1,
        *,
        code: str = "ProvisionedThroughputExceededException",
        message: str | None = None,
    ) -> None:
        """The next ``times`` PutRecords entries are not written: the call succeeds and
        answers them with ``ErrorCode`` (how Kinesis throttles a batch)."""
        with self._lock:
            self._entry_failures.append(
                Failure(code, 200, message or "Rate exceeded for shard (MemoryKinesis)", times)
            )

    # ---- looking inside -------------------------------------------------------------------

    def records(self, stream: str) -> list[Record]:
        """Every record ``stream`` still holds, shard by shard in the order shards were made,
        in sequence order within a shard (aggregates as put, not unpacked)."""
        with self._lock:
            s = self._retained("DescribeStream", stream)
            return [
                Record(
                    stream,
                    shard.shard_id,
                    str(r.sequence),
                    0,
                    r.partition_key,
                    r.data,
                    r.arrival,
                )
                for shard in s.shards.values()
                for r in shard.records
            ]

    def stream_names(self) -> list[str]:
        with self._lock:
            return sorted(self._streams)

    # ---- the transport: one method per Kinesis call ----------------------------------------

    async def describe_stream_summary(self, stream: str) -> StreamSummary:
        with self._lock:
            self._injected("DescribeStreamSummary")
            s = self._retained("DescribeStreamSummary", stream)
            return {
                "StreamDescriptionSummary": {
                    "StreamName": s.name,
                    "StreamARN": s.arn,
                    "StreamStatus": "ACTIVE",
                    "RetentionPeriodHours": s.retention_hours,
                    "OpenShardCount": sum(1 for x in s.shards.values() if x.closed_at is None),
                    "ConsumerCount": len(s.consumers),
                    "StreamCreationTimestamp": datetime.fromtimestamp(s.created, timezone.utc),
                }
            }

    async def list_shards(
        self,
        stream: str | None = None,
        *,
        next_token: str | None = None,
        exclusive_start_shard_id: str | None = None,
        max_results: int | None = None,
    ) -> ShardPage:
        with self._lock:
            self._injected("ListShards")
            if (stream is None) == (next_token is None):
                raise client_error(
                    "ListShards",
                    "InvalidArgumentException",
                    "ListShards takes either StreamName or NextToken",
                )
            start = 0
            if next_token is not None:
                stream, start = self._read_token(next_token)
            assert stream is not None
            s = self._retained("ListShards", stream)
            limit = max_results or 1000
            if not 1 <= limit <= 10_000:
                raise client_error(
                    "ListShards", "InvalidArgumentException", "MaxResults is 1 to 10000"
                )
            shards = list(s.shards.values())
            if exclusive_start_shard_id is not None:
                shards = [x for x in shards if x.shard_id > exclusive_start_shard_id]
            chosen = shards[start : start + limit]
            page: ShardPage = {"Shards": [shard_description(x) for x in chosen]}
            if start + limit < len(shards):
                page["NextToken"] = self._token(stream, start + limit)
            return page

    async def get_shard_iterator(
        self,
        stream: str,
        shard_id: str,
        iterator_type: IteratorType,
        *,
        sequence_number: str | None = None,
        timestamp: datetime | None = None,
    ) -> IteratorAnswer:
        with self._lock:
            self._injected("GetShardIterator")
            return self._open_iterator(stream, shard_id, iterator_type, sequence_number, timestamp)

    async def get_records(self, iterator: str, limit: int) -> RecordsAnswer[RawRecord]:
        stored, next_iterator, behind, children = self._get_records(iterator, limit)
        return RecordsAnswer[RawRecord](
            Records=[
                RawRecord(
                    str(r.sequence),
                    r.partition_key,
                    r.data,
                    r.arrival,
                )
                for r in stored
            ],
            MillisBehindLatest=behind,
            NextShardIterator=next_iterator,
            ChildShards=children,
        )

    async def get_epoch_records(self, iterator: str, limit: int) -> RecordsAnswer[EpochRawRecord]:
        stored, next_iterator, behind, children = self._get_records(iterator, limit)
        return RecordsAnswer[EpochRawRecord](
            Records=[
                EpochRawRecord(str(r.sequence), r.partition_key, r.data, r.arrival_ms / 1000)
                for r in stored
            ],
            MillisBehindLatest=behind,
            NextShardIterator=next_iterator,
            ChildShards=children,
        )

    async def put_records(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer:
        answer = self.put_entries(stream, entries)
        self._wake()
        return answer

    async def put_record(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer:
        answer = self.put(stream, data, partition_key, explicit_hash_key=explicit_hash_key)
        self._wake()
        return answer

    def put(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> PutRecordAnswer:
        """PutRecord, from synchronous code (a test's setup, a sync dead-letter writer)."""
        with self._lock:
            self._injected("PutRecord")
            s = self._stream_to_put("PutRecord", stream)
            shard_id, sequence = self._append(s, data, partition_key, explicit_hash_key)
        self._wake()
        return {"ShardId": shard_id, "SequenceNumber": str(sequence)}

    def put_entries(self, stream: str, entries: Sequence[PutEntry]) -> PutRecordsAnswer:
        """PutRecords, from synchronous code."""
        op = "PutRecords"
        with self._lock:
            self._injected(op)
            if not 1 <= len(entries) <= MAX_PUT_ENTRIES:
                raise client_error(
                    op, "ValidationException", f"PutRecords takes 1 to {MAX_PUT_ENTRIES} entries"
                )
            s = self._stream_to_put(op, stream)
            results: list[PutResultEntry] = []
            failed = 0
            for entry in entries:
                refusal = self._entry_refusal()
                if refusal is not None:
                    failed += 1
                    results.append({"ErrorCode": refusal.code, "ErrorMessage": refusal.message})
                    continue
                shard_id, sequence = self._append(
                    s, entry.Data, entry.PartitionKey, entry.ExplicitHashKey
                )
                results.append({"ShardId": shard_id, "SequenceNumber": str(sequence)})
        self._wake()
        return {"FailedRecordCount": failed, "Records": results}

    async def register_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        op = "RegisterStreamConsumer"
        with self._lock:
            self._injected(op)
            s = self._stream_by_arn(op, stream_arn)
            if name in s.consumers:
                raise client_error(op, "ResourceInUseException", f"Consumer {name} exists")
            now = self.clock()
            consumer = ConsumerState(name, f"{s.arn}/consumer/{name}:{int(now)}", now)
            s.consumers[name] = consumer
            return consumer_description(s, consumer)

    async def describe_stream_consumer(self, stream_arn: str, name: str) -> ConsumerDescription:
        op = "DescribeStreamConsumer"
        with self._lock:
            self._injected(op)
            s = self._stream_by_arn(op, stream_arn)
            consumer = s.consumers.get(name)
            if consumer is None:
                raise client_error(op, "ResourceNotFoundException", f"Consumer {name} not found")
            return consumer_description(s, consumer)

    async def list_stream_consumers(
        self, stream_arn: str, *, next_token: str | None = None
    ) -> ConsumerPage:
        with self._lock:
            self._injected("ListStreamConsumers")
            s = self._stream_by_arn("ListStreamConsumers", stream_arn)
            return {"Consumers": [consumer_description(s, c) for c in s.consumers.values()]}

    async def deregister_stream_consumer(self, stream_arn: str, name: str) -> None:
        op = "DeregisterStreamConsumer"
        with self._lock:
            self._injected(op)
            s = self._stream_by_arn(op, stream_arn)
            if s.consumers.pop(name, None) is None:
                raise client_error(op, "ResourceNotFoundException", f"Consumer {name} not found")
        self._wake()  # its open subscriptions end, as AWS ends them

    async def subscribe_to_shard(
        self, consumer_arn: str, shard_id: str, position: StartingPosition
    ) -> AsyncIterator[SubscribeEvent]:
        """Events as Kinesis sends them: one at once with what the shard holds after
        ``position``, then one whenever records arrive (woken by the put, never by polling),
        the last with no continuation sequence number at a closed shard's end (with its
        ChildShards). Ends with :class:`~kinesumer.kinesis.transport.SubscriptionEnded` when
        five minutes of its clock have passed (checked as each event is made), and with
        ResourceNotFoundException once its consumer was deregistered."""
        op = "SubscribeToShard"
        with self._lock:
            self._injected(op)
            stream = self._stream_of_consumer(op, consumer_arn)
            iterator = self._open_iterator(
                stream,
                shard_id,
                position["Type"],
                position.get("SequenceNumber"),
                position.get("Timestamp"),
            ).iterator
            started = self.clock()
        sent = False
        while True:
            wake = self._waiter()
            try:
                with self._lock:
                    self._stream_of_consumer(op, consumer_arn)  # deregistered: the stream ends
                try:
                    taken, next_iterator, behind, children = self._get_records(
                        iterator, MAX_LIMIT, inject=False
                    )
                except ClientError as exc:
                    if exc.response["Error"]["Code"] == "ExpiredIteratorException":
                        raise SubscriptionEnded(f"{shard_id}: subscription expired") from exc
                    raise
                if next_iterator is None:
                    yield SubscribeEvent(event_records(taken), None, behind, children)
                    return
                continuation = str(decode_cursor(next_iterator).after)
                if taken or not sent:
                    sent = True
                    yield SubscribeEvent(event_records(taken), continuation, behind, None)
                if self.clock() - started >= SUBSCRIPTION_LIFETIME:
                    raise SubscriptionEnded(
                        f"{shard_id}: subscription ended (continue after {continuation})"
                    )
                iterator = next_iterator
                if not taken:
                    await wake.wait()
            finally:
                self._forget(wake)

    # ---- inside ---------------------------------------------------------------------------

    def _open_iterator(
        self,
        stream: str,
        shard_id: str,
        iterator_type: IteratorType,
        sequence_number: str | None,
        timestamp: datetime | None,
    ) -> IteratorAnswer:
        op = "GetShardIterator"
        now = self.clock()
        s = self._retained(op, stream)
        shard = self._shard(op, s, shard_id)
        since_us: int | None = None
        # A shard's starting sequence number is its own (no record has it): "after" it is
        # the shard's first record.
        if iterator_type == "TRIM_HORIZON":
            after = shard.starting_sequence
        elif iterator_type == "LATEST":
            after = (
                self._sequence_for(shard.shard_id, self._count)
                if shard.ending_sequence is None
                else shard.ending_sequence
            )
        elif iterator_type in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            number = self._sequence_in(op, shard, sequence_number)
            after = number - 1 if iterator_type == "AT_SEQUENCE_NUMBER" else number
        elif iterator_type == "AT_TIMESTAMP":
            if timestamp is None:
                raise client_error(op, "InvalidArgumentException", "AT_TIMESTAMP needs a Timestamp")
            # Whole seconds, as the AWS transport sends it (botocore's JSON serializer drops
            # the fraction): the reader skips what arrived before its exact instant.
            since_us = (timestamp - EPOCH) // timedelta(seconds=1) * 1_000_000
            after = shard.starting_sequence
        else:
            raise client_error(
                op, "ValidationException", f"unknown ShardIteratorType {iterator_type!r}"
            )
        cursor = Cursor(stream, shard_id, after, since_us, now)
        return IteratorAnswer(encode_cursor(cursor), datetime.fromtimestamp(now, timezone.utc))

    def _get_records(
        self, iterator: str, limit: int, *, inject: bool = True
    ) -> tuple[list[StoredRecord], str | None, int, list[dict[str, Any]] | None]:
        op = "GetRecords"
        with self._lock:
            if inject:
                self._injected(op)
            if not 1 <= limit <= MAX_LIMIT:
                raise client_error(op, "InvalidArgumentException", f"Limit is 1 to {MAX_LIMIT}")
            cursor = decode_cursor(iterator)
            now = self.clock()
            if now - cursor.issued > ITERATOR_LIFETIME:
                raise client_error(
                    op,
                    "ExpiredIteratorException",
                    "Iterator expired: issued over 5 minutes ago",
                )
            s = self._retained(op, cursor.stream)
            shard = self._shard(op, s, cursor.shard_id)
            taken: list[StoredRecord] = []
            size = 0
            rest = [r for r in shard.records if r.sequence > cursor.after]
            for r in rest:
                if cursor.since_us is not None and r.arrival_ms * 1000 < cursor.since_us:
                    continue
                size += len(r.data) + len(r.partition_key)
                if taken and (len(taken) >= limit or size > MAX_ANSWER_BYTES):
                    break
                taken.append(r)
                if len(taken) >= limit:
                    break
            last = taken[-1].sequence if taken else cursor.after
            remaining = [r for r in rest if r.sequence > last]
            # Some lag while records remain, even on a clock that stands still: 0 says "at the
            # tip", which readers act on.
            behind = max(1, int(now * 1000) - remaining[0].arrival_ms) if remaining else 0
            if shard.closed_at is not None and not remaining:
                children = [child_shard(s, child) for child in shard.children if child in s.shards]
                return taken, None, 0, children
            following = Cursor(s.name, shard.shard_id, last, cursor.since_us, now)
            return taken, encode_cursor(following), behind, None

    def _append(
        self, s: StreamState, data: bytes, partition_key: str, explicit_hash_key: str | None
    ) -> tuple[str, int]:
        key = hash_key_of(partition_key, explicit_hash_key)
        if not 0 <= key <= MAX_HASH_KEY:
            raise client_error("PutRecord", "InvalidArgumentException", "hash key out of range")
        shard = next(x for x in s.shards.values() if x.closed_at is None and x.holds(key))
        sequence = self._next_sequence(shard.shard_id)
        shard.records.append(
            StoredRecord(sequence, partition_key, bytes(data), int(self.clock() * 1000))
        )
        return shard.shard_id, sequence

    def _next_sequence(self, shard_id: str) -> int:
        self._count += 1
        return self._sequence_for(shard_id, self._count)

    def _sequence_for(self, shard_id: str, count: int) -> int:
        return SEQUENCE_BASE + count * SHARD_SLOTS + shard_index(shard_id)

    def _new_shard(
        self,
        s: StreamState,
        start: int,
        end: int,
        *,
        parent: str | None = None,
        adjacent: str | None = None,
    ) -> ShardState:
        shard_id = f"shardId-{len(s.shards):012d}"
        shard = ShardState(
            shard_id,
            start,
            end,
            self._next_sequence(shard_id),
            parent=parent,
            adjacent_parent=adjacent,
        )
        s.shards[shard.shard_id] = shard
        return shard

    def _close(self, shard: ShardState) -> None:
        shard.ending_sequence = self._next_sequence(shard.shard_id)
        shard.closed_at = self.clock()

    def _stream(self, operation: str, name: str) -> StreamState:
        s = self._streams.get(name)
        if s is None:
            raise client_error(
                operation,
                "ResourceNotFoundException",
                f"Stream {name} under account {self.account} not found.",
            )
        return s

    def _retained(self, operation: str, name: str) -> StreamState:
        """The stream, without the records and closed shards its retention let go."""
        s = self._stream(operation, name)
        horizon = self.clock() - s.retention_hours * 3600.0
        for shard_id in list(s.shards):
            shard = s.shards[shard_id]
            if shard.records and shard.records[0].arrival_ms < horizon * 1000:
                shard.records = [r for r in shard.records if r.arrival_ms >= horizon * 1000]
            if shard.closed_at is not None and shard.closed_at < horizon:
                del s.shards[shard_id]
        return s

    def _stream_to_put(self, operation: str, name: str) -> StreamState:
        if name not in self._streams and self._create_on_put:
            self.create_stream(name)
        return self._retained(operation, name)

    def _stream_by_arn(self, operation: str, arn: str) -> StreamState:
        for s in self._streams.values():
            if s.arn == arn:
                return s
        raise client_error(operation, "ResourceNotFoundException", f"Stream {arn} not found")

    def _stream_of_consumer(self, operation: str, consumer_arn: str) -> str:
        for s in self._streams.values():
            for consumer in s.consumers.values():
                if consumer.arn == consumer_arn:
                    return s.name
        raise client_error(
            operation, "ResourceNotFoundException", f"Consumer {consumer_arn} not found"
        )

    def _shard(self, operation: str, s: StreamState, shard_id: str) -> ShardState:
        shard = s.shards.get(shard_id)
        if shard is None:
            raise client_error(
                operation,
                "ResourceNotFoundException",
                f"Shard {shard_id} in stream {s.name} under account {self.account} does not exist",
            )
        return shard

    def _open_shard(self, operation: str, s: StreamState, shard_id: str) -> ShardState:
        shard = self._shard(operation, s, shard_id)
        if shard.closed_at is not None:
            raise client_error(operation, "ResourceInUseException", f"Shard {shard_id} is closed")
        return shard

    def _sequence_in(self, operation: str, shard: ShardState, number: str | None) -> int:
        try:
            value = int(number or "")
        except ValueError:
            value = -1
        end = shard.ending_sequence
        if end is None:
            end = self._sequence_for(shard.shard_id, self._count)
        ours = (value - SEQUENCE_BASE) % SHARD_SLOTS == shard_index(shard.shard_id)
        if not (ours and shard.starting_sequence <= value <= end):
            raise client_error(
                operation,
                "InvalidArgumentException",
                f"StartingSequenceNumber {number} used in GetShardIterator on shard "
                f"{shard.shard_id} is invalid because it did not come from this shard.",
            )
        return value

    def _injected(self, operation: str) -> None:
        queue = self._failures.get(operation)
        if not queue:
            return
        failure = queue[0]
        failure.times -= 1
        if failure.times <= 0:
            queue.pop(0)
        raise client_error(operation, failure.code, failure.message, failure.status)

    def _entry_refusal(self) -> Failure | None:
        if not self._entry_failures:
            return None
        failure = self._entry_failures[0]
        failure.times -= 1
        if failure.times <= 0:
            self._entry_failures.pop(0)
        return failure

    def _token(self, stream: str, index: int) -> str:
        raw = json.dumps({"s": stream, "i": index}).encode()
        return base64.urlsafe_b64encode(raw).decode()

    def _read_token(self, token: str) -> tuple[str, int]:
        try:
            value = json.loads(base64.urlsafe_b64decode(token.encode()))
            return str(value["s"]), int(value["i"])
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise client_error("ListShards", "InvalidArgumentException", "bad NextToken") from exc

    def _waiter(self) -> asyncio.Event:
        event = asyncio.Event()
        with self._lock:
            self._waiters.append((asyncio.get_running_loop(), event))
        return event

    def _forget(self, event: asyncio.Event) -> None:
        with self._lock:
            self._waiters = [(loop, e) for loop, e in self._waiters if e is not event]

    def _wake(self) -> None:
        """Wake every subscription waiting for records (from any thread or loop)."""
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)
