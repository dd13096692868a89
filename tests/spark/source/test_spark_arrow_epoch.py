"""The Spark executors' records (arrival times as epoch seconds, ``EpochRecord``) give the same
Arrow table as the records the rest of the library delivers (arrival times as datetimes, which
its GetRecords decoder, msgspec, makes from the same epoch seconds): the same microsecond for
every arrival, whichever path a batch took (read, replayed, or taken from a read-ahead's
table)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import msgspec
import pyarrow
from hypothesis import example, given
from hypothesis import strategies as st

from kinesumer.kinesis.columns import EpochColumns
from kinesumer.kinesis.kpl import epoch_records
from kinesumer.models import EpochRecord, Record
from kinesumer.spark.arrow import epoch_columns_to_arrow, epoch_to_timestamp, records_to_arrow
from kinesumer.spark.source.executor.shard_read import epoch_micros

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Arrival times as Kinesis writes them (milliseconds), and as moto writes them (time.time()).
SECONDS = st.one_of(
    st.integers(1_500_000_000_000, 2_500_000_000_000).map(lambda ms: ms / 1000),
    st.floats(1.5e9, 2.5e9, allow_nan=False, allow_infinity=False),
)
DECODE_DATETIME = msgspec.json.Decoder(datetime, strict=False).decode


def micros_of(arrival: datetime) -> int:
    return (arrival - EPOCH) // timedelta(microseconds=1)


def decoded(seconds: float) -> datetime:
    """The arrival a Record gets for ``seconds`` in a GetRecords answer."""
    return DECODE_DATETIME(json.dumps(seconds).encode())


@given(st.lists(SECONDS, min_size=1, max_size=50))
@example([1709551331.0078125, 1700000000.99999975])  # exact half microseconds: up
@example([1764304000.123, 1764304000.0, 1764304000.9999995])
def test_epoch_seconds_become_the_microseconds_the_decoder_gives(seconds: list[float]) -> None:
    """msgspec's decoder (the Record path) rounds a float's fraction to the microsecond, an
    exact half up; the Arrow column and the ledger's arrival round it the same. (botocore's
    parser, ``datetime.fromtimestamp``, rounds an exact half to even: no millisecond value,
    what Kinesis sends, is one.)"""
    expected = [micros_of(decoded(s)) for s in seconds]
    column = epoch_to_timestamp(pyarrow.array(seconds, pyarrow.float64()))
    assert column.cast(pyarrow.int64()).to_pylist() == expected
    assert [epoch_micros(s) for s in seconds] == expected


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), SECONDS),
            st.integers(0, 3),
            st.text(min_size=1, max_size=8),
            st.binary(max_size=16),
        ),
        max_size=30,
    )
)
def test_epoch_records_give_the_table_records_give(
    rows: list[tuple[float | None, int, str, bytes]],
) -> None:
    """The same records, one with datetimes and one with epoch seconds, give equal tables
    (schema included); a missing arrival stays missing."""
    epoch = [
        EpochRecord("s", "shardId-0", str(10**20 + i), sub, key, data, seconds)
        for i, (seconds, sub, key, data) in enumerate(rows)
    ]
    records = [Record(*r[:6], None if r[6] is None else decoded(r[6])) for r in epoch]
    table = epoch_columns_to_arrow(EpochColumns.from_records("s", "shardId-0", epoch))
    assert table.equals(records_to_arrow(records))
    assert table.schema.equals(records_to_arrow([]).schema)


def test_records_of_any_zone_become_epoch_records_of_the_same_instant() -> None:
    """botocore's datetimes (in the local zone) turned into epoch seconds (the executors' rare
    botocore path) name the same instant."""
    instant = datetime(2026, 11, 28, 4, 30, 1, 123000, tzinfo=timezone.utc)
    zoned = instant.astimezone(timezone(timedelta(hours=-7)))
    records = [Record("s", "shardId-0", "1", 0, "k", b"x", zoned)]
    (converted,) = epoch_records(records)
    assert converted.approximate_arrival_timestamp is not None
    assert epoch_micros(converted.approximate_arrival_timestamp) == micros_of(instant)
    assert epoch_columns_to_arrow(EpochColumns.from_records("s", "shardId-0", [converted])).equals(
        records_to_arrow(records)
    )
