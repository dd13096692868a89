"""The lean PutRecords and GetRecords answers (``kinesumer.kinesis.lean``) beside botocore's, on
each stand-in's real answers and on canned ones the stand-ins do not give.

kinesis-local (and LocalStack, which serves Kinesis with it) writes ``"ErrorCode": null,
"ErrorMessage": null`` on every written PutRecords entry and ``"ChildShards": null`` on every
GetRecords answer; moto writes small sequence numbers and a newline in its iterators; kinesalite
writes 56-digit sequence numbers. Whatever the stand-in, the lean path must give botocore's
result, and an answer it does not accept must be counted and logged (it still gives botocore's
result, only slower).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from support.group import create_stream
from support.produced import kinesis

from kinesumer.aws import RequestStats, botocore_session
from kinesumer.kinesis import lean
from kinesumer.kinesis.columns import EpochColumns
from kinesumer.kinesis.kpl_aggregate import Aggregate
from kinesumer.kinesis.reader import BOTOCORE_GET_RECORDS_ENV, KinesisReader, ShardBatch
from kinesumer.models import EpochRecord, Record
from kinesumer.spark.source.executor.shard_read import epoch_micros

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def micros(record: Record | EpochRecord) -> int | None:
    """A record's arrival in epoch microseconds, whichever form it has."""
    arrival = record.approximate_arrival_timestamp
    if arrival is None:
        return None
    if isinstance(arrival, datetime):
        return (arrival - EPOCH) // timedelta(microseconds=1)
    return epoch_micros(arrival)


class Canned(BaseHTTPRequestHandler):
    """Answers every call with the class's ``body`` (HTTP 200)."""

    body = b"{}"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def canned_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def run_with_client(url: str, work: Callable[[Any], Any]) -> Any:
    """``work(client)`` on a fresh aiobotocore Kinesis client (lean handlers installed) against
    ``url``, on a fresh event loop."""

    async def main() -> Any:
        config = AioConfig(retries={"total_max_attempts": 1, "mode": "standard"})
        async with botocore_session().create_client(
            "kinesis",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=config,
        ) as client:
            assert lean.install(client)
            return await work(client)

    return asyncio.run(main())


def entries(stream: str) -> tuple[dict[str, object], bytes]:
    aggregate = Aggregate()
    aggregate.add(b"u1", "a")
    aggregate.add(b"u2", "b")
    datas = [(b"plain-%d" % i, f"k{i}") for i in range(5)] + [(aggregate.encode(), "agg")]
    body = lean.put_records_body(stream, [lean.PutEntry(d, k) for d, k in datas])
    return {"Data": datas[0][0], "PartitionKey": datas[0][1]}, body


async def put_both_ways(client: Any, stream: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Six entries put leanly (an aggregate last), six plain ones the ordinary way (the same
    client: the ordinary call
    is untouched by the lean handlers)."""
    first, body = entries(stream)
    lean_answer = await lean.put_records(client, stream, first, body)
    records = json.loads(body)["Records"]
    plain_answer = await client.put_records(
        StreamName=stream,
        Records=[{"Data": first["Data"], "PartitionKey": r["PartitionKey"]} for r in records],
    )
    return lean_answer, plain_answer


def shapes(answer: dict[str, Any]) -> tuple[object, ...]:
    """A PutRecords answer without what differs between two calls (sequence numbers)."""
    return (
        {k: v for k, v in answer.items() if k not in ("Records", "ResponseMetadata")},
        [sorted(entry) for entry in answer["Records"]],
        [entry.get("ErrorCode") for entry in answer["Records"]],
    )


def test_put_answer_members_as_botocore_gives_them(canned_url: str) -> None:
    """kinesis-local's and LocalStack's nulls, and an answer without EncryptionType: the lean
    answer has the members botocore's has, no more."""
    Canned.body = json.dumps(
        {
            "EncryptionType": None,
            "FailedRecordCount": 1,
            "Records": [
                {"ErrorCode": None, "ErrorMessage": None, "SequenceNumber": "1", "ShardId": "s"},
                {
                    "ErrorCode": "ProvisionedThroughputExceededException",
                    "ErrorMessage": "slow down",
                    "SequenceNumber": None,
                    "ShardId": None,
                },
            ],
        }
    ).encode()
    lean_answer, plain_answer = run_with_client(canned_url, lambda c: put_both_ways(c, "s"))
    assert shapes(lean_answer) == shapes(plain_answer)
    assert lean_answer["Records"] == plain_answer["Records"]
    assert lean_answer["Records"][1] == {
        "ErrorCode": "ProvisionedThroughputExceededException",
        "ErrorMessage": "slow down",
    }


def test_refused_answers_are_counted_and_logged(
    canned_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An answer the lean decoder does not accept still gives botocore's result, and is counted
    and logged with the reason (a steady count means the answers changed shape)."""
    Canned.body = json.dumps(
        {
            "Records": [{"SequenceNumber": "7", "PartitionKey": "k", "Data": "YW Jj\n"}],
            "MillisBehindLatest": 0,
        }
    ).encode()
    before = lean.refused_answers().get("GetRecords", 0)

    async def read(client: Any) -> lean.RecordsAnswer[lean.RawRecord]:
        return await lean.get_records(client, "it", 10)

    with caplog.at_level(logging.WARNING, logger="kinesumer.kinesis"):
        answer = run_with_client(canned_url, read)
    assert answer.Records == [lean.RawRecord("7", "k", b"abc")]  # botocore skips the blanks
    assert lean.refused_answers()["GetRecords"] == before + 1
    if before == 0:  # the first refusal in this process is logged
        assert any("GetRecords answer" in r.getMessage() for r in caplog.records)


def test_a_refused_answer_gives_epoch_seconds_from_botocores_datetimes(canned_url: str) -> None:
    """The Spark executors' form: an answer whose arrival time is not epoch seconds (a date
    string, which botocore parses) is refused by the epoch decoder, counted, and still gives
    the instant botocore read, as epoch seconds."""
    Canned.body = json.dumps(
        {
            "Records": [
                {
                    "SequenceNumber": "7",
                    "PartitionKey": "k",
                    "Data": "YWJj",
                    "ApproximateArrivalTimestamp": "2026-11-28T04:30:01.123Z",
                }
            ],
            "MillisBehindLatest": 5,
        }
    ).encode()
    before = lean.refused_answers().get("GetRecords", 0)

    async def read(client: Any) -> lean.RecordsAnswer[lean.EpochRawRecord]:
        return await lean.get_epoch_records(client, "it", 10)

    answer = run_with_client(canned_url, read)
    instant = datetime(2026, 11, 28, 4, 30, 1, 123000, tzinfo=timezone.utc)
    assert answer.Records == [lean.EpochRawRecord("7", "k", b"abc", instant.timestamp())]
    assert answer.MillisBehindLatest == 5
    assert lean.refused_answers()["GetRecords"] == before + 1


@pytest.mark.parametrize("standin", ["kinesalite", "moto_server", "kinesis_local"])
def test_standins_answer_lean_like_botocore(
    standin: str, request: pytest.FixtureRequest, unique_name: Callable[[str], str]
) -> None:
    """End to end on each stand-in: PutRecords answers of the same shape both ways; the records
    (aggregates unpacked) read back the same both ways, and so does a split parent's end
    (ChildShards); no answer was refused by the lean decoder."""
    server = request.getfixturevalue(standin)
    if standin == "moto_server":
        server.reset()
    url: str = server.url
    stream = unique_name("lean-answers")
    create_stream(url, stream, 1)
    refused_before = lean.refused_answers()

    async def work(client: Any) -> tuple[Any, ...]:
        lean_put, plain_put = await put_both_ways(client, stream)
        readers = [
            KinesisReader(client, RequestStats(), "us-east-1", lean_get_records=flag)
            for flag in (True, False)
        ]
        shard = "shardId-000000000000"
        first: list[ShardBatch[list[Record]]] = []
        epoch: list[ShardBatch[EpochColumns]] = []
        for reader in readers:
            iterator = await reader.shard_iterator(stream, shard, None, "TRIM_HORIZON")
            first.append(await reader.get_records(stream, shard, iterator, 10_000, None))
            iterator = await reader.shard_iterator(stream, shard, None, "TRIM_HORIZON")
            epoch.append(await reader.get_epoch_columns(stream, shard, iterator, 10_000, None))
        return lean_put, plain_put, first, epoch

    lean_put, plain_put, first, epoch = run_with_client(url, work)
    assert shapes(lean_put) == shapes(plain_put)
    assert first[0].records == first[1].records and len(first[0].records) == 13
    assert first[0].millis_behind == first[1].millis_behind
    # The Spark executors' form (arrival as epoch seconds), both ways: the same records, each
    # arrival the same microsecond as the datetime botocore gives.
    for batch in epoch:
        records = list(batch.records.records())
        assert [r[:6] for r in records] == [r[:6] for r in first[1].records]
        assert [micros(r) for r in records] == [micros(r) for r in first[1].records]
        assert batch.millis_behind == first[1].millis_behind

    # A split closes the parent: its drained end (ChildShards where the stand-in gives them).
    control = kinesis(url)
    control.split_shard(
        StreamName=stream, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127)
    )
    control.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
    )

    async def ends(client: Any) -> list[tuple[object, ...]]:
        """Each answer on the way to the parent's end, decoded both ways from one iterator."""
        reader = KinesisReader(client, RequestStats(), "us-east-1")
        shard = "shardId-000000000000"
        iterator: str | None = await reader.shard_iterator(stream, shard, None, "TRIM_HORIZON")
        out: list[tuple[object, ...]] = []
        for _ in range(3):  # moto never ends a closed shard
            if iterator is None:
                break
            lean_answer = await lean.get_records(client, iterator, 10_000)
            plain = lean.from_botocore(
                await client.get_records(ShardIterator=iterator, Limit=10_000)
            )
            out.append(
                (
                    lean_answer.Records == plain.Records,
                    lean_answer.ChildShards == plain.ChildShards,
                    (lean_answer.NextShardIterator is None) == (plain.NextShardIterator is None),
                    len(lean_answer.Records),
                    lean_answer.ChildShards is not None,
                )
            )
            iterator = lean_answer.NextShardIterator
        return out

    steps = run_with_client(url, ends)
    assert all(step[:3] == (True, True, True) for step in steps), steps
    assert sum(step[3] for step in steps) == 12
    if standin == "kinesis_local":  # the only one giving ChildShards at a closed shard's end
        assert steps[-1][4]
    assert lean.refused_answers() == refused_before


class Echo(BaseHTTPRequestHandler):
    """Answers each GetRecords with one record whose key and data name the iterator asked for:
    an answer handed to the wrong call shows."""

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["ShardIterator"]
        record = {"SequenceNumber": "1", "PartitionKey": asked, "Data": "YWJj"}
        answer = {"Records": [record], "NextShardIterator": asked + "+", "MillisBehindLatest": 0}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


def test_concurrent_calls_get_their_own_answers() -> None:
    """Many GetRecords at once on one client (the engine's fetchers, a Spark worker's partitions
    on its one loop), in two threads with loops and clients of their own (Spark task threads),
    and the same client's ordinary calls between them: each gets its own answer."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    failures: list[str] = []
    answered: list[str] = []

    async def many(client: Any, name: str) -> None:
        async def one(i: int) -> None:
            asked = f"{name}-{i}"
            if i % 5 == 0:  # an ordinary call on the same client: botocore's parse, untouched
                plain = await client.get_records(ShardIterator=asked, Limit=10)
                got = (plain["Records"][0]["PartitionKey"], plain["NextShardIterator"])
            else:
                answer = await lean.get_records(client, asked, 10)
                got = (answer.Records[0].PartitionKey, answer.NextShardIterator)
            if got != (asked, asked + "+"):
                failures.append(f"{asked}: {got}")
            answered.append(asked)

        await asyncio.gather(*(one(i) for i in range(40)))

    try:
        threads = [
            threading.Thread(target=run_with_client, args=(url, partial(many, name=name)))
            for name in ("a", "b")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        server.shutdown()
    assert not failures
    assert len(answered) == 80  # every call answered (a thread's error would leave some out)


def test_kill_switch_reads_through_botocore(
    canned_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KINESUMER_BOTOCORE_GET_RECORDS=1``: a reader made then parses with botocore alone (the
    lean decoder never sees an answer), with the same result."""
    Canned.body = json.dumps(
        {
            "Records": [
                {"SequenceNumber": "1", "PartitionKey": "k", "Data": "YWJj"},
            ],
            "NextShardIterator": "n",
            "MillisBehindLatest": 0,
        }
    ).encode()
    decoded: list[bytes] = []
    original = lean.decode_records_answer

    def counting(body: bytes) -> lean.RecordsAnswer[lean.RawRecord] | None:
        decoded.append(body)
        return original(body)

    monkeypatch.setattr(lean, "decode_records_answer", counting)

    async def read(client: Any) -> ShardBatch[list[Record]]:
        reader = KinesisReader(client, RequestStats(), "us-east-1")
        return await reader.get_records("s", "shardId-0", "it", 10, None)

    monkeypatch.setenv(BOTOCORE_GET_RECORDS_ENV, "1")
    switched = run_with_client(canned_url, read)
    assert decoded == []
    monkeypatch.delenv(BOTOCORE_GET_RECORDS_ENV)
    assert run_with_client(canned_url, read) == switched
    assert len(decoded) == 1
