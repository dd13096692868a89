"""A record anyone can write to the stream never stops a shard (issue 18).

A KPL aggregate that is not valid (a partition key that is not UTF-8 under a correct MD5, an
index outside its table, no user records, too many, nesting) is delivered as the plain record it
is, its own partition key and all its bytes, and counted. Fuzzed at the parser, then through
every face: the generator, the async iterator, run() with DeadLetter, ``kinesumer consume`` and
the Arrow conversion of the Spark paths; and the buffer's byte bound feels an aggregate of many
empty user records.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.kpl import OUTER, aggregate, bad_utf8_aggregate, body_of, framed
from support.wait import wait_until

from kinesumer import AsyncKinesumer, Kinesumer, cli
from kinesumer.aws import RequestStats
from kinesumer.kinesis.kpl import (
    MAX_AGGREGATED_RECORDS,
    RECORD_OVERHEAD,
    to_records,
)
from kinesumer.models import Checkpoint, Record
from kinesumer.read.buffer import RecordBuffer
from kinesumer.read.progress import shard_lease

HOSTILE = {
    "bad utf-8 key": bad_utf8_aggregate(),
    "key index outside the table": framed(body_of(["k"], [(0, b"a"), (3, b"b")])),
    "no user records": framed(body_of(["k"], [])),
    "not protobuf": framed(b"\xff\xff\xff\xff"),
    "nested groups": framed(b"\x7b" * 200_000),  # field 15, start-group, 200,000 deep
}


def raw(data: bytes, seq: str = "49590338271490256608559692538361571095921575989136588898") -> Any:
    return {"SequenceNumber": seq, "PartitionKey": OUTER, "Data": data}


# -- the parser ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_an_invalid_aggregate_is_delivered_as_the_plain_record_and_counted(name: str) -> None:
    stats = RequestStats()
    data = HOSTILE[name]
    [record] = to_records("s", "shard-0", [raw(data)], None, stats)
    assert (record.partition_key, record.data, record.sub_sequence_number) == (OUTER, data, 0)
    assert stats.counts()["unaggregated_records"] == 1


def test_over_the_cap_the_aggregate_is_one_plain_record() -> None:
    """A 1 MiB record of empty user records unpacked to ~174,700 records counted as 0 bytes."""
    users = [(0, b"")] * (MAX_AGGREGATED_RECORDS + 1)
    data = framed(body_of(["k"], users))
    stats = RequestStats()
    [record] = to_records("s", "x", [raw(data)], None, stats)
    assert record.data == data and stats.unaggregated_records == 1
    at_cap = framed(body_of(["k"], users[1:]))
    assert len(to_records("s", "x", [raw(at_cap)], None, stats)) == MAX_AGGREGATED_RECORDS


pairs = st.lists(st.tuples(st.text(min_size=1, max_size=8), st.binary(max_size=40)), max_size=20)


@settings(max_examples=150, deadline=None)
@given(pairs.filter(bool))
def test_valid_aggregates_round_trip(users: list[tuple[str, bytes]]) -> None:
    records = to_records("s", "x", [raw(aggregate(users))], None)
    assert [(r.partition_key, r.data) for r in records] == users
    assert [r.sub_sequence_number for r in records] == list(range(len(users)))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid aggregate's body with bytes flipped, cut, inserted or spliced, framed again with
    a correct digest (only a valid MD5 reaches the parser)."""
    body = body_of(
        draw(st.lists(st.text(max_size=6), min_size=1, max_size=4)),
        draw(st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=12)), max_size=6)),
    )
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(body)))
        op = draw(st.sampled_from(["flip", "cut", "insert", "invalid utf-8"]))
        if op == "flip" and at < len(body):
            body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1 :]
        elif op == "cut":
            body = body[:at]
        elif op == "insert":
            body = body[:at] + draw(st.binary(min_size=1, max_size=8)) + body[at:]
        else:
            body = body[:at] + b"\xc3\x28\xff" + body[at:]
    return framed(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(), st.binary(max_size=200).map(framed)))
def test_arbitrary_bytes_never_raise_nor_yield_a_key_that_is_not_text(data: bytes) -> None:
    stats = RequestStats()
    records = to_records("s", "x", [raw(data)], None, stats)
    assert records and all(type(r.partition_key) is str for r in records)
    assert all(type(r.data) is bytes for r in records)
    if stats.unaggregated_records:  # not a valid aggregate: the plain record, whole
        assert [(r.partition_key, r.data) for r in records] == [(OUTER, data)]


PROBE = """
import json, sys
from google.protobuf.internal import api_implementation
from kinesumer.aws import RequestStats
from kinesumer.kinesis.kpl import to_records
datas = [bytes.fromhex(h) for h in json.loads(sys.stdin.read())]
stats = RequestStats()
out = [to_records("s", "x", [{"SequenceNumber": "1", "PartitionKey": "o", "Data": d}], None, stats)
       for d in datas]
print(json.dumps([api_implementation.Type(), stats.unaggregated_records,
                  [[r.partition_key for r in rs] for rs in out]]))
"""


@pytest.mark.parametrize("backend", ["upb", "python"])
def test_both_protobuf_backends_deliver_the_hostile_records_plain(backend: str) -> None:
    """The pure-Python backend raised UnicodeDecodeError out of kpl.py; upb gave a bytes key."""
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": backend}
    hexes = json.dumps([d.hex() for d in HOSTILE.values()])
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=hexes,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    used, counted, keys = json.loads(done.stdout)
    assert used == backend
    assert counted == len(HOSTILE) and keys == [["o"]] * len(HOSTILE)


# -- the buffer's byte bound -----------------------------------------------------------------
async def test_many_empty_user_records_fill_the_byte_bound() -> None:
    users = [(0, b"")] * MAX_AGGREGATED_RECORDS
    records = to_records("s", "x", [raw(framed(body_of(["k"], users)))], None)
    buffer = RecordBuffer(max_records=10 * MAX_AGGREGATED_RECORDS, max_bytes=1 << 20)
    buffer.fetchers = 1
    lease = shard_lease(Checkpoint("s", "x", owner="me", lease=1))
    await buffer.put(lease, records, await buffer.reserve(1))
    assert buffer.size[1] >= MAX_AGGREGATED_RECORDS * RECORD_OVERHEAD > 1 << 20
    waiting = asyncio.ensure_future(buffer.reserve(1))  # the next GetRecords must wait
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    await buffer.get()
    assert await waiting == 1 and buffer.size == (0, 0)


# -- the faces -------------------------------------------------------------------------------
@pytest.fixture
def hostile_stream(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> dict[str, Any]:
    """A stream holding: record 0, the bad UTF-8 aggregate, record 1 (one shard: in order)."""
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 1)
    kinesis(kinesalite.url).put_record(
        StreamName=stream, Data=bad_utf8_aggregate(), PartitionKey=OUTER
    )
    put(kinesalite.url, stream, 1, 1)
    return {"config": config, "stream": stream, "url": kinesalite.url}


def check_delivered(records: list[Record]) -> None:
    assert [(r.partition_key, r.data) for r in records] == [
        ("0", b"0"),
        (OUTER, bad_utf8_aggregate()),
        ("1", b"1"),
    ]


def test_the_generator_hands_out_the_plain_record(hostile_stream: dict[str, Any]) -> None:
    got: list[Record] = []
    with Kinesumer(hostile_stream["config"]) as consumer:
        for record in consumer.consume([hostile_stream["stream"]]):
            got.append(record)
            if len(got) == 3:
                break
        check_delivered(got)
        assert consumer.stats().unaggregated_records == 1


def test_the_async_iterator_hands_out_the_plain_record(hostile_stream: dict[str, Any]) -> None:
    async def main() -> tuple[list[Record], int]:
        got: list[Record] = []
        async with AsyncKinesumer(hostile_stream["config"]) as consumer:
            async for record in consumer.consume([hostile_stream["stream"]]):
                got.append(record)
                if len(got) == 3:
                    break
            return got, consumer.stats().unaggregated_records

    got, counted = asyncio.run(main())
    check_delivered(got)
    assert counted == 1


def test_poll_hands_out_the_plain_record(hostile_stream: dict[str, Any]) -> None:
    got: list[Record] = []
    with Kinesumer(hostile_stream["config"]) as consumer:
        consumer.subscribe([hostile_stream["stream"]])

        def three_polled() -> bool:
            got.extend(consumer.poll(10, 0.2))
            return len(got) >= 3

        wait_until(three_polled, 30, "three records polled")
        check_delivered(got)


def test_run_dead_letters_it_and_handles_the_next(
    hostile_stream: dict[str, Any], unique_name: Callable[[str], str]
) -> None:
    """It stopped with AttributeError building the envelope; the next record never ran."""
    from support.handlers import Run, read_stream

    from kinesumer.handlers.deadletter import read_envelope
    from kinesumer.handlers.policies import DeadLetter, Retry

    url, dlq = hostile_stream["url"], unique_name("dlq")
    create_stream(url, dlq, 1)
    handled: list[bytes] = []
    lock = threading.Lock()

    def handle(record: Record) -> None:
        if record.partition_key == OUTER:
            raise ValueError("not an order")
        with lock:
            handled.append(record.data)

    consumer = Kinesumer(hostile_stream["config"])
    policy = DeadLetter(dlq, retry=Retry(attempts=1))
    run = Run(consumer, [hostile_stream["stream"]], handle, on_failure=policy, name="h")
    wait_until(
        lambda: len(handled) == 2 and len(read_stream(url, dlq)) == 1, 30, "two handled, one dead"
    )
    run.stop()
    [dead] = read_stream(url, dlq)
    envelope = read_envelope(dead.data)
    assert (envelope.partition_key, envelope.data) == (OUTER, bad_utf8_aggregate())
    assert handled == [b"0", b"1"]


def test_kinesumer_consume_prints_it_as_json(
    hostile_stream: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """It exited 1: bytes is not JSON serializable."""
    config = hostile_stream["config"]
    argv = ["consume", "--app", config.app, "--table", config.dynamodb_table]
    argv += ["--region", "us-east-1", "--dynamodb-endpoint", config.dynamodb_endpoint]
    argv += ["--kinesis-endpoint", config.kinesis_endpoint, "--initial-position", "TRIM_HORIZON"]
    code = cli.main([*argv, "--count", "3", hostile_stream["stream"]])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["partition_key"] for line in lines] == ["0", OUTER, "1"]


def test_the_arrow_conversion_takes_it() -> None:
    """Both Spark paths convert with kinesumer/spark/arrow.py; a bytes key failed there."""
    pytest.importorskip("pyarrow")
    from kinesumer.spark.arrow import records_to_arrow, records_to_batches

    records = to_records("s", "x", [raw(d, str(i)) for i, d in enumerate(HOSTILE.values())], None)
    table = records_to_arrow(records)
    assert table.column("partition_key").to_pylist() == [OUTER] * len(HOSTILE)
    assert table.column("data").to_pylist() == list(HOSTILE.values())
    assert sum(b.num_rows for b in records_to_batches(records)) == len(HOSTILE)


# -- record content in errors ----------------------------------------------------------------
def test_a_pydantic_decode_error_carries_no_payload() -> None:
    """pydantic quotes the payload (input_value) in its message: it reached WARNING logs and
    the dead-letter envelope's error_message, and the traceback through the chained cause."""
    import traceback

    import pydantic

    from kinesumer.errors import DecodeError
    from kinesumer.handlers.deadletter import make_envelope
    from kinesumer.handlers.decode import make_decoder

    class Order(pydantic.BaseModel):
        id: int
        card: str

    decoder = make_decoder(Order)
    assert decoder is not None
    for payload in (b'{"id": "4111-1111-SECRET", "card": 7}', b'{"id": "SECRET'):
        record = Record("s", "x", "1", 0, "k", payload, None)
        with pytest.raises(DecodeError) as caught:
            decoder(record)
        error = caught.value
        shown = "".join(traceback.format_exception(error))
        assert "SECRET" not in shown and "input_value" not in shown
        assert "Order" in str(error) and "[type=" in str(error)
        envelope = make_envelope(
            record,
            error,
            kind="dead_letter",
            handler="h",
            attempts=1,
            round_number=0,
            failed_at_ms=0,
            app="a",
            client_id="c",
        )
        assert "SECRET" not in envelope.error_message
    with pytest.raises(DecodeError, match="int_parsing") as caught:
        decoder(Record("s", "x", "1", 0, "k", b'{"id": "SECRET", "card": "c"}', None))
    assert "id: Input should be a valid integer" in str(caught.value)


def test_the_prometheus_counters() -> None:
    prometheus = pytest.importorskip("prometheus_client")
    from kinesumer.observability.metrics import PrometheusMetrics

    registry = prometheus.CollectorRegistry()
    stats = RequestStats(PrometheusMetrics("app", "c1", registry))
    to_records("orders", "x", [raw(bad_utf8_aggregate())], None, stats)
    stats.corrupt_item("client")
    labels = {"app": "app", "client_id": "c1"}
    unaggregated = "kinesumer_unaggregated_records_total"
    assert registry.get_sample_value(unaggregated, {**labels, "stream": "orders"}) == 1
    corrupt = "kinesumer_corrupt_state_items_total"
    assert registry.get_sample_value(corrupt, {**labels, "kind": "client"}) == 1
