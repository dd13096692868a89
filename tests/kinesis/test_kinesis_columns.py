"""The Spark executors' columns (``EpochColumns``) hold exactly the records the tuple path
(``kpl.epoch_records_of``) gives for the same answer: plain records taken straight from the
decoder, KPL aggregates unpacked, invalid aggregates delivered as they are, the resume point
skipped; and what the read path does with them (cut at the limit, extend, last position,
latest arrival) agrees with the same on a list of records."""

from __future__ import annotations

import hashlib

import aws_kinesis_agg
import pytest
from support.kpl import aggregate

from kinesumer.kinesis.columns import EpochColumns, epoch_columns_of
from kinesumer.kinesis.kpl import epoch_records_of
from kinesumer.kinesis.lean import EpochRawRecord
from kinesumer.models import EpochRecord, Position

STREAM, SHARD = "s", "shardId-000000000000"


def plain(count: int, first: int = 100) -> list[EpochRawRecord]:
    return [
        EpochRawRecord(str(first + i), f"k{i}", b"d%d" % i, 1_764_304_000.001 * (i + 1))
        for i in range(count)
    ]


BAD_BODY = b"not protobuf"
WITH_AGGREGATES = [
    *plain(2),
    EpochRawRecord("102", "a", aggregate([("a", b"1"), ("b", b"2"), ("c", b"3")]), 5.5),
    # KPL magic, a valid digest, no aggregate inside: delivered as the record it is
    EpochRawRecord(
        "103", "k", aws_kinesis_agg.MAGIC + BAD_BODY + hashlib.md5(BAD_BODY).digest(), None
    ),
    *plain(2, first=104),
]

SKIPS = [
    None,
    Position("100", 0),
    Position("100", 3),
    Position("100", -1),  # not one the library writes; the rule holds anyway
    Position("101", 0),
    Position("102", 1),
]


REPEATED = [*plain(1), *plain(2)]  # sequence numbers 100, 100, 101: not Kinesis's, same rule


@pytest.mark.parametrize("skip", SKIPS)
@pytest.mark.parametrize("answer", [plain(0), plain(5), WITH_AGGREGATES, REPEATED], ids=len)
def test_columns_hold_the_records_the_tuple_path_gives(
    answer: list[EpochRawRecord], skip: Position | None
) -> None:
    expected = epoch_records_of(STREAM, SHARD, answer, skip)
    columns = epoch_columns_of(STREAM, SHARD, answer, skip)
    assert list(columns.records()) == expected
    assert len(columns) == len(expected)


def test_a_plain_answer_shares_the_decoders_objects() -> None:
    """No copy of a record's data or key is made on the way to Arrow."""
    answer = plain(3)
    columns = epoch_columns_of(STREAM, SHARD, answer, None)
    assert all(a is b for a, b in zip(columns.datas, (r.Data for r in answer), strict=True))
    assert columns.sub_sequence_numbers == [0, 0, 0]


def test_what_the_read_path_does_agrees_with_a_list() -> None:
    first = epoch_columns_of(STREAM, SHARD, WITH_AGGREGATES, None)
    second = epoch_columns_of(STREAM, SHARD, plain(3, first=106), None)
    records: list[EpochRecord] = [*first.records(), *second.records()]
    first.extend(second)
    assert list(first.records()) == records
    first.truncate(6)
    assert list(first.records()) == records[:6]
    assert first.position(-1) == Position(records[5].sequence_number, records[5][3])
    assert list(first.head(2).records()) == records[:2]
    arrivals = [r.approximate_arrival_timestamp for r in records[:6]]
    assert first.latest_arrival() == max(a for a in arrivals if a is not None)
    assert EpochColumns(STREAM, SHARD).latest_arrival() is None
    assert list(EpochColumns.from_records(STREAM, SHARD, records).records()) == records
