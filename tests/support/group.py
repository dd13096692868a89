"""Helpers for consumer group tests: configs, producers, members running as asyncio tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import boto3

from kinesumer import AsyncKinesumer, Config, Record, create_state_table
from kinesumer.aws import AwsClients, RequestStats
from kinesumer.consumer.base import engine_of
from kinesumer.statestore import DynamoDBStateStore
from support.wait import eventually

# Short timings keep the suite fast; every one is still far above the stand-ins' latency.
FAST = {
    "heartbeat_interval": 0.25,
    "client_timeout": 2.0,
    "commit_interval": 0.5,
    "shard_sync_interval": 2.0,
    "handoff_timeout": 2.0,
    "scan_interval": 0.2,
}


def make_config(
    kinesis_url: str | None, dynamodb_url: str | None, app: str, table: str, **overrides: Any
) -> Config:
    """A group member's config with the :data:`FAST` timings, reading from ``TRIM_HORIZON``;
    None for an endpoint: the member is given its Kinesis or state table in memory instead."""
    values: dict[str, Any] = {
        "app": app,
        "dynamodb_table": table,
        "region": "us-east-1",
        "kinesis_endpoint": kinesis_url,
        "dynamodb_endpoint": dynamodb_url,
        "initial_position": "TRIM_HORIZON",
        **FAST,
    }
    values.update(overrides)
    return Config(**values)


def kinesis(url: str) -> Any:
    return boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")


def kinesis_in_account_of(url: str, role_arn: str) -> Any:
    """A Kinesis client acting in ``role_arn``'s account: moto keeps accounts apart by the
    credentials, so streams it creates live there, not in the caller's account."""
    sts = boto3.client("sts", endpoint_url=url, region_name="us-east-1")
    creds = sts.assume_role(RoleArn=role_arn, RoleSessionName="setup")["Credentials"]
    return boto3.client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )


def create_stream(url: str, name: str, shards: int) -> None:
    client = kinesis(url)
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )


def numbered(start: int, count: int, key: Callable[[int], str] = str) -> list[tuple[bytes, str]]:
    """The records numbered start..start+count-1 a test puts: (data b"<n>", partition key)."""
    return [(str(i).encode(), key(i)) for i in range(start, start + count)]


def put(
    url: str, stream: str, start: int, count: int, key: Callable[[int], str] = str
) -> list[bytes]:
    """Put records numbered start..start+count-1 (data b"<n>"), in batches; returns the data."""
    client = kinesis(url)
    records = numbered(start, count, key)
    for offset in range(0, count, 500):
        response = client.put_records(
            StreamName=stream,
            Records=[{"Data": d, "PartitionKey": k} for d, k in records[offset : offset + 500]],
        )
        assert response.get("FailedRecordCount", 0) == 0
    return [data for data, _ in records]


def split_in_two(url: str, stream: str) -> str:
    """Split the stream's only shard at the middle of its hash range and wait until the stream
    is active again; the parent's id."""
    client = kinesis(url)
    (parent,) = client.list_shards(StreamName=stream)["Shards"]
    low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    return str(parent["ShardId"])


def setup_table(config: Config) -> None:
    create_state_table(config)


def recorded_starts(config: Config, stream: str) -> dict[str, int | None]:
    """Shard id -> where a ``LATEST`` read of it began (epoch ms, the checkpoint item's
    ``started_at``; None: none recorded), for every checkpoint item of ``stream`` (boto3,
    strongly consistent)."""
    client = boto3.client(
        "dynamodb", endpoint_url=config.dynamodb_endpoint, region_name=config.region
    )
    items = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
        ConsistentRead=True,
    )["Items"]
    return {
        item["sk"]["S"]: int(item["started_at"]["N"]) if "started_at" in item else None
        for item in items
    }


@contextlib.asynccontextmanager
async def state_store(config: Config) -> AsyncIterator[DynamoDBStateStore]:
    """The group's state table as another process sees it (its own clients, built from the
    config as a member builds them): to read what members wrote, or to write as an intruder."""
    aws = AwsClients(config, RequestStats())
    await aws.open()
    try:
        yield DynamoDBStateStore(aws.dynamodb, config.dynamodb_table, config.app, RequestStats())
    finally:
        await aws.close()


#: Members started and not yet closed or crashed: ``tests/group/conftest.py`` closes those a
#: failing test left (their heartbeat threads would beat on for the rest of the worker's session,
#: into a stand-in long stopped).
RUNNING: set[Member] = set()


class Member:
    """One group member consuming in its own asyncio task, recording every delivery.
    ``consumer``: the member's consumer, if not one of ``config``'s AWS (a member given its
    Kinesis and state table in memory)."""

    def __init__(
        self,
        config: Config,
        streams: Iterable[str],
        sink: list[tuple[str, Record]],
        consumer: AsyncKinesumer | None = None,
    ):
        self.consumer = consumer if consumer is not None else AsyncKinesumer(config)
        self.streams = list(streams)
        self.sink = sink
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    @property
    def client_id(self) -> str:
        return self.consumer.client_id

    def start(self) -> Member:
        self.task = asyncio.create_task(self._run())
        RUNNING.add(self)
        return self

    async def _run(self) -> None:
        try:
            async for record in self.consumer.consume(self.streams):
                self.sink.append((self.client_id, record))
        except Exception as exc:  # surfaced to the test through .error
            self.error = exc
            raise

    def owned(self) -> set[tuple[str, str]]:
        return {
            (s.stream, s.shard_id) for s in self.consumer.stats().shards if s.status == "active"
        }

    def reading(self) -> set[tuple[str, str]]:
        """The shards it holds whose reading has begun (a GetRecords answered): from
        ``LATEST``, their iterator is open, so every record put from now on is read. What a
        test at ``LATEST`` waits for before it puts records."""
        return {
            (s.stream, s.shard_id)
            for s in self.consumer.stats().shards
            if s.status == "active" and s.millis_behind is not None
        }

    def flushed(self) -> bool:
        """Every shard it holds is checkpointed at the last record it delivered from it: what a
        test waits for before a crash or an outage whose duplicates it counts (a fixed sleep of a
        commit interval or two is not enough on a loaded machine)."""
        last = {
            (r.stream, r.shard_id): r.sequence_number for c, r in self.sink if c == self.client_id
        }
        active = [s for s in self.consumer.stats().shards if s.status == "active"]
        return all(s.checkpoint == last.get((s.stream, s.shard_id)) for s in active)

    async def close(self) -> None:
        RUNNING.discard(self)
        await self.consumer.aclose()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)

    async def crash(self) -> None:
        """Die like a SIGKILLed process: no handoff, no final checkpoint, no deregistration."""
        RUNNING.discard(self)
        if self.task is not None:
            self.task.cancel()
        await engine_of(self.consumer).abort()
        await asyncio.gather(*([self.task] if self.task else []), return_exceptions=True)


#: The initial positions the group's own tests run at: the default first.
POSITIONS = ("LATEST", "TRIM_HORIZON")


async def wait_reading(members: Iterable[Member], shards: int, timeout: float = 30) -> None:
    """Until ``members`` read ``shards`` shards between them, each read begun (see
    :meth:`Member.reading`): at ``LATEST``, a test puts records only after this."""
    group = list(members)
    await eventually(
        lambda: sum(len(m.reading()) for m in group) == shards,
        timeout,
        f"{shards} shards read by {[m.client_id for m in group]}",
    )


def datas(sink: list[tuple[str, Record]]) -> list[bytes]:
    return [r.data for _, r in sink]


def duplicates(sink: list[tuple[str, Record]]) -> dict[tuple[str, str, str, int], int]:
    counts = Counter(
        (r.stream, r.shard_id, r.sequence_number, r.sub_sequence_number) for _, r in sink
    )
    return {k: n for k, n in counts.items() if n > 1}
