"""A GetRecords answer into Spark's Arrow table, as the executors build it, and the ways before.

    .venv/bin/python benchmarks/bench_arrow_build.py [--records 10000] [--rounds 25]

No stand-ins, no Spark: one answer body shaped like kinesalite's (``--records`` records of
100 B, 56-digit sequence numbers, millisecond epoch arrival times) is decoded and turned into
the table of :func:`kinesumer.spark.arrow.arrow_schema`, over and over, by

- ``records, by column`` (the executors until 2026-11-28, the baseline): decoded into
  ``Record`` (arrival as a datetime), then one Arrow array per column of ``zip(*records)``;
- ``records, struct``: the same records through ``records_to_arrow`` (one struct array: what
  ``foreach_batch`` does now);
- ``epoch records``: decoded into ``EpochRecord`` tuples (arrival as the answer's epoch
  seconds), one struct array, the timestamp column computed (the executors for a few hours on
  2026-11-28);
- ``columns`` (the executors now): ``EpochColumns``, one list per field straight from the
  decoder's records, and ``epoch_columns_to_arrow``: one Arrow array per list.

Each round times every contender once, in turn, on the same body; CPU seconds per 100k records
(decoding included), medians of ``--rounds``, and the ratio to the baseline. Every contender's
table is checked equal to the baseline's first.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyarrow

from kinesumer.kinesis.columns import epoch_columns_of
from kinesumer.kinesis.kpl import epoch_records_of, records_of
from kinesumer.kinesis.lean import decode_epoch_answer, decode_records_answer
from kinesumer.models import EpochRecord, Record
from kinesumer.spark.arrow import (
    arrow_schema,
    epoch_columns_to_arrow,
    epoch_to_timestamp,
    records_to_arrow,
)

STREAM, SHARD = "bench", "shardId-000000000001"


def answer_body(records: int) -> bytes:
    """A GetRecords answer as kinesalite writes one (100 B records, arrival in milliseconds)."""
    base = 49_680_412_823_098_765_506_474_831_640_804_325_254_116_639_976_898_691_090
    return json.dumps(
        {
            "Records": [
                {
                    "SequenceNumber": str(base + 7919 * i),
                    "ApproximateArrivalTimestamp": 1_764_304_000.123 + i / 1000,
                    "Data": base64.b64encode(b"%08d" % i + b"x" * 92).decode(),
                    "PartitionKey": f"k{i}",
                }
                for i in range(records)
            ],
            "NextShardIterator": "i" * 200,
            "MillisBehindLatest": 0,
        }
    ).encode()


def by_column(records: list[Record]) -> pyarrow.Table:
    """The table built as the executors built it before: one array per column of the records."""
    schema = arrow_schema()
    columns = zip(*records, strict=True)
    arrays = [pyarrow.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
    return pyarrow.Table.from_arrays(arrays, schema=schema)


def by_struct(records: list[EpochRecord]) -> pyarrow.Table:
    """The table built from ``EpochRecord`` tuples as one struct array."""
    schema = arrow_schema()
    fields = [*schema][:-1]
    arrival = schema.field(len(fields)).with_type(pyarrow.float64())
    rows = pyarrow.array(records, type=pyarrow.struct([*fields, arrival]))
    *columns, seconds = rows.flatten()
    return pyarrow.Table.from_arrays([*columns, epoch_to_timestamp(seconds)], schema=schema)


def contenders(body: bytes) -> dict[str, Callable[[], pyarrow.Table]]:
    def records() -> list[Record]:
        answer = decode_records_answer(body)
        assert answer is not None
        return records_of(STREAM, SHARD, answer.Records, None)

    def epoch() -> pyarrow.Table:
        answer = decode_epoch_answer(body)
        assert answer is not None
        return by_struct(epoch_records_of(STREAM, SHARD, answer.Records, None))

    def columns() -> pyarrow.Table:
        answer = decode_epoch_answer(body)
        assert answer is not None
        return epoch_columns_to_arrow(epoch_columns_of(STREAM, SHARD, answer.Records, None))

    return {
        "records, by column": lambda: by_column(records()),
        "records, struct": lambda: records_to_arrow(records()),
        "epoch records": epoch,
        "columns": columns,
    }


def run(records: int, rounds: int) -> dict[str, dict[str, float]]:
    """CPU seconds per 100k records by contender (median of ``rounds``) and ratio to the
    baseline (the first contender)."""
    ways = contenders(answer_body(records))
    baseline = next(iter(ways.values()))()
    for name, build in ways.items():
        if not build().equals(baseline):
            raise AssertionError(f"{name}: not the baseline's table")
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, build in ways.items():
            started = time.process_time()
            build()
            seconds[name].append(time.process_time() - started)
    first = statistics.median(next(iter(seconds.values())))
    return {
        name: {
            "cpu_per_100k": statistics.median(spent) / records * 100_000,
            "ratio": statistics.median(spent) / first,
        }
        for name, spent in seconds.items()
    }


def report(table: dict[str, dict[str, float]], records: int, rounds: int) -> str:
    lines = [
        f"One GetRecords answer of {records} records x 100 B into Spark's Arrow table, decoding "
        f"included; CPU seconds per 100k records, median of {rounds} (pyarrow "
        f"{pyarrow.__version__}).",
        "",
        "| way | CPU s/100k | x baseline |",
        "|---|---:|---:|",
    ]
    for name, figures in table.items():
        lines.append(f"| {name} | {figures['cpu_per_100k']:.4f} | {figures['ratio']:.2f}x |")
    return "\n".join(lines)


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args(argv)
    print(report(run(args.records, args.rounds), args.records, args.rounds))


if __name__ == "__main__":
    main()
