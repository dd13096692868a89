"""Kinesis calls: stream checks, shard listing with lineage, iterators and GetRecords."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from ..aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ..config import InitialPosition
from ..errors import CorruptStateError, KinesisError, StreamNotFoundError
from ..models import Position, Record, Shard
from .kpl import to_records

log = logging.getLogger("kinesumer.kinesis")
T = TypeVar("T")


class IteratorExpired(Exception):
    """The shard iterator is older than five minutes: get a new one from the last record read."""


@dataclass(frozen=True)
class ShardBatch:
    """One GetRecords answer: records (aggregates unpacked), where to read next (None at
    SHARD_END), how far behind the tip the shard is, and how many Kinesis records came."""

    records: list[Record]
    next_iterator: str | None
    millis_behind: int | None
    raw_count: int


class KinesisReader:
    """Kinesis calls for one engine, with retries and errors named for the application."""

    def __init__(self, client: Any, stats: RequestStats, region: str | None) -> None:
        self._kinesis = client
        self._stats = stats
        self._region = region or "the configured region"

    async def _call(
        self, operation: str, stream: str, fn: Callable[[], Awaitable[T]], attempts: int = 6
    ) -> T:
        try:
            return await call_with_retry(
                f"kinesis.{operation}", fn, self._stats, attempts=attempts, initial=0.2, maximum=5
            )
        except ClientError as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException":
                raise StreamNotFoundError(
                    f"Kinesis stream {stream!r} does not exist in {self._region} (or was "
                    f"deleted): check the stream name, kinesis_region and role_arn"
                ) from exc
            if code == "ExpiredIteratorException":
                raise IteratorExpired(str(exc)) from exc
            if is_denied(exc):
                raise denied(exc, f"kinesis:{operation}", f"stream {stream!r}") from exc
            raise KinesisError(f"kinesis:{operation} on {stream!r} failed: {exc}") from exc

    async def check_stream(self, stream: str) -> None:
        """Raise StreamNotFoundError / AccessDeniedError now rather than from a background task."""
        await self._call(
            "DescribeStreamSummary",
            stream,
            lambda: self._kinesis.describe_stream_summary(StreamName=stream),
        )

    async def list_shards(self, stream: str) -> list[Shard]:
        """Every shard of the stream (all ListShards pages), with parents and closed flags."""
        shards: list[Shard] = []
        kwargs: dict[str, Any] = {"StreamName": stream}
        while True:
            response = await self._call(
                "ListShards", stream, partial(self._kinesis.list_shards, **kwargs)
            )
            for s in response.get("Shards", []):
                shards.append(
                    Shard(
                        shard_id=s["ShardId"],
                        parent_shard_id=s.get("ParentShardId"),
                        adjacent_parent_shard_id=s.get("AdjacentParentShardId"),
                        closed="EndingSequenceNumber" in s.get("SequenceNumberRange", {}),
                    )
                )
            token = response.get("NextToken")
            if not token:
                break
            # With NextToken, ListShards refuses StreamName: the token carries the stream.
            kwargs = {"NextToken": token}
        return sorted(set(shards))

    async def shard_iterator(
        self,
        stream: str,
        shard_id: str,
        after: Position | None,
        initial: InitialPosition,
    ) -> str:
        """An iterator at ``after`` (AT its sequence number: the caller skips what it already
        had, which also works inside a KPL aggregate), or at ``initial`` when there is none."""
        kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id}
        if after is not None:
            kwargs["ShardIteratorType"] = "AT_SEQUENCE_NUMBER"
            kwargs["StartingSequenceNumber"] = after.sequence_number
        elif isinstance(initial, datetime):
            kwargs["ShardIteratorType"] = "AT_TIMESTAMP"
            kwargs["Timestamp"] = initial
        else:
            kwargs["ShardIteratorType"] = initial
        try:
            response = await self._call(
                "GetShardIterator", stream, lambda: self._kinesis.get_shard_iterator(**kwargs)
            )
        except KinesisError as exc:
            cause = exc.__cause__
            if after is not None and error_code(cause or exc) == "InvalidArgumentException":
                raise CorruptStateError(
                    f"{stream}/{shard_id}: checkpoint sequence number {after.sequence_number} is "
                    f"not in this shard ({cause}); was the stream re-created? Reset the "
                    f"checkpoint with `kinesumer checkpoints reset`"
                ) from exc
            raise
        iterator: str = response["ShardIterator"]
        return iterator

    async def get_records(
        self,
        stream: str,
        shard_id: str,
        iterator: str,
        limit: int,
        skip_through: Position | None,
    ) -> ShardBatch:
        # Throttling on GetRecords is normal under load: retry patiently (up to ~1 minute of
        # backoff) before the fetcher reports it and starts over.
        response = await self._call(
            "GetRecords",
            stream,
            lambda: self._kinesis.get_records(ShardIterator=iterator, Limit=limit),
            attempts=15,
        )
        raw = response.get("Records", [])
        return ShardBatch(
            records=to_records(stream, shard_id, raw, skip_through, self._stats),
            next_iterator=response.get("NextShardIterator"),
            millis_behind=response.get("MillisBehindLatest"),
            raw_count=len(raw),
        )
