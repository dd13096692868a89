"""An in-memory ``dynamodbstreams`` client (the async calls kinesumer makes, botocore's answer
shapes), for what moto cannot show: a shard closing with a child (DynamoDB rotates shards every
few hours), DescribeStream paging, and errors. Iterators begin with the stream ARN and ``|``,
as AWS's and moto's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/items/stream/2026-01-01T00:00:00.000"


@dataclass
class FakeShard:
    shard_id: str
    parent: str | None = None
    records: list[dict[str, Any]] = field(default_factory=lambda: [])
    closed: bool = False


def stream_record(key: str, n: int, sequence: int, event: str = "INSERT") -> dict[str, Any]:
    """A stream record as botocore parses it (a datetime, binary as bytes)."""
    image = {"pk": {"S": key}, "n": {"N": str(n)}, "b": {"B": bytes([n % 256])}}
    body: dict[str, Any] = {
        "ApproximateCreationDateTime": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "Keys": {"pk": {"S": key}},
        "SequenceNumber": f"{sequence:021d}",
        "SizeBytes": 20,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if event != "REMOVE":
        body["NewImage"] = image
    if event != "INSERT":
        body["OldImage"] = image
    return {
        "eventID": f"e{sequence}",
        "eventName": event,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": body,
    }


class FakeTableStream:
    """One table's stream: shards (with parents) listed ``page_size`` at a time."""

    def __init__(self, shards: list[FakeShard], page_size: int = 100) -> None:
        self.shards = shards
        self.page_size = page_size
        self.errors: list[tuple[str, str]] = []  # (operation, code) raised once each, in order
        self.calls: list[str] = []

    def _fail(self, operation: str) -> None:
        self.calls.append(operation)
        if self.errors and self.errors[0][0] == operation:
            _, code = self.errors.pop(0)
            raise ClientError({"Error": {"Code": code, "Message": code}}, operation)

    def _shard(self, shard_id: str) -> FakeShard:
        return next(s for s in self.shards if s.shard_id == shard_id)

    async def describe_stream(self, **kwargs: Any) -> dict[str, Any]:
        self._fail("DescribeStream")
        ids = [s.shard_id for s in self.shards]
        start = (
            ids.index(kwargs["ExclusiveStartShardId"]) + 1
            if "ExclusiveStartShardId" in kwargs
            else 0
        )
        limit = min(kwargs.get("Limit", 100), self.page_size)
        page = self.shards[start : start + limit]
        described: dict[str, Any] = {
            "StreamArn": kwargs["StreamArn"],
            "StreamStatus": "ENABLED",
            "Shards": [self._describe(s) for s in page],
        }
        if start + limit < len(self.shards):
            described["LastEvaluatedShardId"] = page[-1].shard_id
        return {"StreamDescription": described}

    @staticmethod
    def _describe(shard: FakeShard) -> dict[str, Any]:
        numbers = {"StartingSequenceNumber": "0"}
        if shard.closed:
            numbers["EndingSequenceNumber"] = "9" * 21
        described: dict[str, Any] = {"ShardId": shard.shard_id, "SequenceNumberRange": numbers}
        if shard.parent:
            described["ParentShardId"] = shard.parent
        return described

    async def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        self._fail("GetShardIterator")
        shard = self._shard(kwargs["ShardId"])
        kind = kwargs["ShardIteratorType"]
        if kind == "TRIM_HORIZON":
            at = 0
        elif kind == "LATEST":
            at = len(shard.records)
        else:
            sequence = kwargs["SequenceNumber"]
            at = next(
                i
                for i, r in enumerate(shard.records)
                if r["dynamodb"]["SequenceNumber"] == sequence
            )
            at += kind == "AFTER_SEQUENCE_NUMBER"
        return {"ShardIterator": f"{kwargs['StreamArn']}|1|{shard.shard_id}|{at}"}

    async def get_records(self, **kwargs: Any) -> dict[str, Any]:
        self._fail("GetRecords")
        arn, _, shard_id, at_text = kwargs["ShardIterator"].split("|")
        shard, at = self._shard(shard_id), int(at_text)
        records = shard.records[at : at + kwargs["Limit"]]
        answer: dict[str, Any] = {"Records": records}
        end = at + len(records)
        if not (shard.closed and end == len(shard.records)):
            answer["NextShardIterator"] = f"{arn}|1|{shard_id}|{end}"
        return answer
