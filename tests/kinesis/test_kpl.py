"""KPL aggregated records are unpacked with sub-sequence numbers; anything else passes as is."""

from __future__ import annotations

import gc
import hashlib
from datetime import datetime, timezone
from typing import Any

import aws_kinesis_agg
import pytest
from support.kpl import aggregate

from kinesumer.kinesis import kpl
from kinesumer.kinesis.kpl import records_of, to_records
from kinesumer.kinesis.lean import RawRecord
from kinesumer.models import Position

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def raw(seq: str, data: bytes, key: str = "k") -> dict[str, Any]:
    return {
        "SequenceNumber": seq,
        "PartitionKey": key,
        "Data": data,
        "ApproximateArrivalTimestamp": NOW,
    }


def test_aggregate_unpacked_with_sub_sequence_numbers() -> None:
    blob = aggregate([("a", b"one"), ("b", b"two"), ("a", b"three")])
    records = to_records("s", "shard-0", [raw("10", b"plain"), raw("11", blob)], None)
    assert [
        (r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in records
    ] == [
        ("10", 0, "k", b"plain"),
        ("11", 0, "a", b"one"),
        ("11", 1, "b", b"two"),
        ("11", 2, "a", b"three"),
    ]
    assert all(r.stream == "s" and r.shard_id == "shard-0" for r in records)


def test_skip_through_resumes_inside_an_aggregate() -> None:
    blob = aggregate([("a", b"1"), ("a", b"2"), ("a", b"3")])
    records = to_records("s", "x", [raw("11", blob), raw("12", b"next")], Position("11", 1))
    assert [(r.sequence_number, r.sub_sequence_number) for r in records] == [("11", 2), ("12", 0)]


def test_skip_through_plain_record_drops_only_it() -> None:
    records = to_records("s", "x", [raw("5", b"a"), raw("6", b"b")], Position("5", 0))
    assert [r.sequence_number for r in records] == ["6"]
    # A resume point no longer in the shard (trimmed) drops nothing.
    records = to_records("s", "x", [raw("7", b"c")], Position("5", 0))
    assert [r.sequence_number for r in records] == ["7"]


def test_magic_with_bad_digest_is_an_ordinary_record() -> None:
    fake = aws_kinesis_agg.MAGIC + b"not protobuf" + b"\x00" * 16
    (record,) = to_records("s", "x", [raw("1", fake)], None)
    assert record.data == fake and record.sub_sequence_number == 0


def test_valid_digest_but_unparseable_body_is_delivered_not_dropped() -> None:
    body = b"\xff\xff\xff\xff"
    fake = aws_kinesis_agg.MAGIC + body + hashlib.md5(body).digest()
    (record,) = to_records("s", "x", [raw("1", fake)], None)
    assert record.data == fake


def test_empty_and_binary_data() -> None:
    records = to_records("s", "x", [raw("1", b""), raw("2", bytes(range(256)))], None)
    assert [r.data for r in records] == [b"", bytes(range(256))]


def test_the_lean_path_builds_records_with_the_collector_off_and_leaves_it_as_it_was() -> None:
    """``records_of`` turns the cyclic collector off while it builds an answer's records (a
    tuple per record: collections every 700 of them cost a third of the path's CPU). It must
    come back on, after a failure too, and stay off where the application had turned it off."""
    seen: list[bool] = []

    class Counting:
        def unaggregated(self, stream: str, shard_id: str) -> None:
            seen.append(gc.isenabled())

    bad_kpl = RawRecord("1", "k", aws_kinesis_agg.MAGIC + b"not protobuf", None)
    plain = RawRecord("2", "k", b"x", None)

    class Failing:
        def unaggregated(self, stream: str, shard_id: str) -> None:
            raise RuntimeError("a metrics backend failed")

    assert gc.isenabled()
    got = records_of("s", "shardId-0", [bad_kpl, plain], None, Counting())
    assert [r.sequence_number for r in got] == ["1", "2"]
    assert seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError):
        records_of("s", "shardId-0", [bad_kpl], None, Failing())
    assert gc.isenabled()
    gc.disable()
    try:
        records_of("s", "shardId-0", [bad_kpl, plain], None, Counting())
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_an_interrupt_as_the_collector_goes_off_does_not_leave_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal handler runs as a call returns: on a loop in the main thread (a notebook, an
    ``asyncio.run`` application), KeyboardInterrupt can be raised the moment ``gc.disable()``
    returns. The collector must come back on: the application may go on after the interrupt."""

    class InterruptedGc:
        isenabled = staticmethod(gc.isenabled)
        enable = staticmethod(gc.enable)

        @staticmethod
        def disable() -> None:
            gc.disable()
            raise KeyboardInterrupt

    monkeypatch.setattr(kpl, "gc", InterruptedGc)
    assert gc.isenabled()
    try:
        with pytest.raises(KeyboardInterrupt):
            records_of("s", "shardId-0", [RawRecord("1", "k", b"x", None)], None)
        assert gc.isenabled()
    finally:
        gc.enable()
