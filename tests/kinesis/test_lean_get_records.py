"""The lean GetRecords (``kinesumer.kinesis.lean``) against botocore's parser, the reference.

A local HTTP endpoint answers each GetRecords with the same canned answer for two readers on two
real aiobotocore clients, one lean and one parsing with botocore only; the records (KPL
aggregates unpacked, skipping applied), next iterator, lag and child shards must be identical,
and errors (throttles, expired iterators, missing streams) must raise the same ``ClientError``.
Hypothesis draws the answers; fixed cases cover what it may not reach. Then the same on
kinesalite, end to end.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.group import create_stream
from support.produced import kinesis
from support.standins import NodeStandIn

from kinesumer.aws import RequestStats, botocore_session
from kinesumer.aws.retry import MalformedAnswer
from kinesumer.kinesis import lean
from kinesumer.kinesis.kpl_aggregate import Aggregate
from kinesumer.kinesis.reader import KinesisReader, ShardBatch
from kinesumer.models import Position, Record


class _Canned:
    """What the endpoint answers next, and what it was asked."""

    status = 200
    body = b"{}"
    calls = 0


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Canned.calls += 1
        # An answer without a next iterator is confirmed by the listing: no shard listed open.
        listing = self.headers.get("X-Amz-Target", "").endswith(".ListShards")
        body = b'{"Shards": []}' if listing else _Canned.body
        self.send_response(200 if listing else _Canned.status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class _Pair:
    """Two readers, lean and botocore-only, on one event loop, against ``url``."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.url = url
        self.lean, self.plain = self.loop.run_until_complete(self._open())

    async def _open(self) -> tuple[KinesisReader, KinesisReader]:
        session = botocore_session()
        self.contexts: list[Any] = []
        self.clients: list[Any] = []
        readers = []
        for lean_get_records in (True, False):
            context = session.create_client(
                "kinesis",
                endpoint_url=self.url,
                region_name="us-east-1",
                aws_access_key_id="test",
                aws_secret_access_key="test",
                config=AioConfig(retries={"total_max_attempts": 1, "mode": "standard"}),
            )
            self.contexts.append(context)
            client = await context.__aenter__()
            self.clients.append(client)
            readers.append(
                KinesisReader(
                    client, RequestStats(), "us-east-1", lean_get_records=lean_get_records
                )
            )
        return readers[0], readers[1]

    def both(
        self, skip: Position | None = None
    ) -> tuple[ShardBatch[list[Record]], ShardBatch[list[Record]]]:
        async def read(reader: KinesisReader) -> ShardBatch[list[Record]]:
            return await reader.get_records("s", "shardId-000000000000", "it", 10_000, skip)

        return self.loop.run_until_complete(read(self.lean)), self.loop.run_until_complete(
            read(self.plain)
        )

    def raw_errors(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ClientError each client's GetRecords raised (the lean one through the lean call)."""
        errors = []
        for call in (
            lambda: lean.get_records(self.clients[0], "it", 10),
            lambda: self.clients[1].get_records(ShardIterator="it", Limit=10),
        ):
            with pytest.raises(ClientError) as caught:
                self.loop.run_until_complete(call())
            errors.append(caught.value.response)
        return errors[0], errors[1]

    def close(self) -> None:
        for context in self.contexts:
            self.loop.run_until_complete(context.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def pair() -> Iterator[_Pair]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    pair = _Pair(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield pair
    finally:
        pair.close()
        server.shutdown()


def _answer(
    records: list[dict[str, Any]],
    next_iterator: str | None = "next-it",
    millis: int | None = 0,
    children: list[dict[str, Any]] | None = None,
) -> bytes:
    body: dict[str, Any] = {"Records": records}
    if next_iterator is not None:
        body["NextShardIterator"] = next_iterator
    if millis is not None:
        body["MillisBehindLatest"] = millis
    if children is not None:
        body["ChildShards"] = children
    return json.dumps(body).encode()


def _wire(seq: int, key: str, data: bytes, arrival: float | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "SequenceNumber": f"4963{seq:052d}",
        "PartitionKey": key,
        "Data": base64.b64encode(data).decode(),
    }
    if arrival is not None:
        record["ApproximateArrivalTimestamp"] = arrival
    return record


def _aggregate(users: list[tuple[str, bytes]]) -> bytes:
    aggregate = Aggregate()
    for key, data in users:
        aggregate.add(data, key)
    return aggregate.encode()


def _same(pair: _Pair, skip: Position | None = None) -> ShardBatch[list[Record]]:
    lean_batch, plain_batch = pair.both(skip)
    assert lean_batch == plain_batch
    return lean_batch


keys = st.text(min_size=1, max_size=20)
payloads = st.binary(max_size=300)
arrivals = st.one_of(
    st.none(),
    st.integers(1_300_000_000_000, 2_000_000_000_000).map(lambda ms: ms / 1000),
    st.integers(1_300_000_000, 2_000_000_000),
)
plain = st.tuples(keys, payloads)
aggregated = st.lists(st.tuples(keys, payloads), min_size=1, max_size=5).map(_aggregate)
records = st.lists(st.tuples(keys, st.one_of(payloads, aggregated), arrivals), max_size=12).map(
    lambda rs: [_wire(i, k, d, a) for i, (k, d, a) in enumerate(rs)]
)
children = st.one_of(
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {
                "ShardId": st.sampled_from(["shardId-000000000001", "shardId-000000000002"]),
                "ParentShards": st.just(["shardId-000000000000"]),
                "HashKeyRange": st.just({"StartingHashKey": "0", "EndingHashKey": "9"}),
            }
        ),
        max_size=2,
    ),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    raw=records,
    next_iterator=st.one_of(st.none(), st.just("AAAA/next+it==")),
    millis=st.integers(0, 86_400_000),  # in every Kinesis answer (without: test_malformed_*)
    child_shards=children,
    skip_index=st.integers(0, 3),
)
def test_lean_answers_match_botocore(
    pair: _Pair,
    raw: list[dict[str, Any]],
    next_iterator: str | None,
    millis: int | None,
    child_shards: list[dict[str, Any]] | None,
    skip_index: int,
) -> None:
    _Canned.status, _Canned.body = 200, _answer(raw, next_iterator, millis, child_shards)
    skip = None
    if skip_index and raw:
        skip = Position(raw[min(skip_index, len(raw)) - 1]["SequenceNumber"], skip_index - 1)
    batch = _same(pair, skip)
    assert batch.raw_count == len(raw)
    assert batch.next_iterator == next_iterator and batch.millis_behind == millis


def test_fixed_answers_match_botocore(pair: _Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bool] = []
    original = lean.decode_records_answer

    def counting(body: bytes) -> lean.RecordsAnswer[lean.RawRecord] | None:
        answer = original(body)
        decoded.append(answer is not None)
        return answer

    monkeypatch.setattr(lean, "decode_records_answer", counting)
    users = [(f"k-{i}", f"user-{i}".encode()) for i in range(40)]
    agg = _aggregate(users)
    cases = [
        _answer([], "it-2", 0),  # empty
        _answer([], None, 0, [{"ShardId": "shardId-1", "ParentShards": ["shardId-0"]}]),  # end
        _answer([_wire(1, "a", agg, 1_700_000_000.123), _wire(2, "b", b"x", 1_700_000_001.5)]),
        _answer([_wire(1, "clé ✓", bytes(range(256)), 1_700_000_000)]),
        # An aggregate whose digest is wrong: delivered as the plain record it is, both ways.
        _answer([_wire(1, "a", agg[:-1] + bytes([agg[-1] ^ 1]), None)]),
        # Base64 with a line break: botocore's decoder skips it, msgspec's refuses: the lean
        # path hands the answer to botocore.
        json.dumps(
            {
                "Records": [{"SequenceNumber": "1", "PartitionKey": "k", "Data": "YWJj\nZGVm"}],
                "MillisBehindLatest": 0,
            }
        ).encode(),
        # Fields Kinesis may add: ignored both ways.
        json.dumps(
            {
                "Records": [
                    {
                        "SequenceNumber": "1",
                        "PartitionKey": "k",
                        "Data": "YWJj",
                        "EncryptionType": "KMS",
                        "Future": {"x": 1},
                    }
                ],
                "NextShardIterator": "n",
                "MillisBehindLatest": 5,
                "Other": [1, 2],
            }
        ).encode(),
    ]
    for body in cases:
        _Canned.status, _Canned.body = 200, body
        _same(pair)
    # Each answer reached the lean decoder once (the botocore-only reader's never do); all but
    # the one with a line break in its base64 were decoded by it.
    assert decoded == [True] * 5 + [False, True]
    _Canned.body = cases[2]
    batch = _same(pair, Position("4963" + "1".zfill(52), 10))
    assert [r.sub_sequence_number for r in batch.records][:2] == [11, 12]
    assert batch.records[0].approximate_arrival_timestamp is not None


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "ProvisionedThroughputExceededException"),
        (400, "ExpiredIteratorException"),
        (400, "ResourceNotFoundException"),
        (400, "AccessDeniedException"),
        (500, "InternalFailure"),
    ],
)
def test_errors_are_botocores(pair: _Pair, status: int, code: str) -> None:
    _Canned.status = status
    _Canned.body = json.dumps({"__type": code, "message": f"{code} here"}).encode()
    lean_error, plain_error = pair.raw_errors()
    assert lean_error["Error"] == plain_error["Error"]
    assert lean_error["Error"]["Code"] == code


def test_lean_reads_kinesalite_like_botocore(
    kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """End to end: plain and aggregated records put on kinesalite read back the same both ways,
    and the lean reader's answers were decoded by the lean path (not handed to botocore)."""
    stream = unique_name("lean-read")
    create_stream(kinesalite.url, stream, 1)
    client = kinesis(kinesalite.url)
    client.put_records(
        StreamName=stream,
        Records=[{"Data": b"plain-%d" % i, "PartitionKey": f"k{i}"} for i in range(50)]
        + [{"Data": _aggregate([("a", b"1"), ("b", b"2")]), "PartitionKey": "agg"}],
    )
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    pair = _Pair(kinesalite.url)
    decoded: list[int] = []
    original = lean.decode_records_answer

    def counting(body: bytes) -> lean.RecordsAnswer[lean.RawRecord] | None:
        answer = original(body)
        decoded.append(0 if answer is None else len(answer.Records))
        return answer

    try:
        lean.decode_records_answer = counting

        async def read(reader: KinesisReader) -> ShardBatch[list[Record]]:
            it = await reader.shard_iterator(stream, shard, None, "TRIM_HORIZON")
            return await reader.get_records(stream, shard, it, 10_000, None)

        lean_batch = pair.loop.run_until_complete(read(pair.lean))
        plain_batch = pair.loop.run_until_complete(read(pair.plain))
    finally:
        lean.decode_records_answer = original
        pair.close()
    assert lean_batch.records == plain_batch.records
    assert len(lean_batch.records) == 52 and lean_batch.raw_count == 51
    assert decoded == [51]


@pytest.mark.parametrize(
    "body",
    [
        b"<html>gateway</html>",
        b"{}",
        b'{"MillisBehindLatest": 0}',
    ],
)
def test_an_answer_without_records_is_malformed_both_ways(pair: _Pair, body: bytes) -> None:
    """A 200 whose body is not a Kinesis answer (a gateway's page; JSON without ``Records``, the
    one member Kinesis's API model requires) is a MalformedAnswer on the lean client and on the
    botocore-only one, never an answer without a next iterator."""
    _Canned.status, _Canned.body = 200, body
    for client in pair.clients:
        for call in (lean.get_records, lean.get_epoch_records):
            with pytest.raises(MalformedAnswer):
                pair.loop.run_until_complete(call(client, "it", 10))


@pytest.mark.parametrize(
    "body",
    [b'{"Records": [], "NextShardIterator": "n"}', b'{"Records": [], "MillisBehindLatest": null}'],
)
def test_an_answer_without_its_lag_is_taken_with_the_lag_unknown(pair: _Pair, body: bytes) -> None:
    """``MillisBehindLatest`` is optional in Kinesis's API model: an answer without it is a
    Kinesis answer (refusing it would stop the shard for good), its lag unknown."""
    _Canned.status, _Canned.body = 200, body
    for client in pair.clients:
        for call in (lean.get_records, lean.get_epoch_records):
            answer = pair.loop.run_until_complete(call(client, "it", 10))
            assert answer.Records == [] and answer.MillisBehindLatest is None
