"""The Spark sink's checks on the driver, when Spark makes the writer (at ``save()`` /
``start()``), without a Spark session: pyspark's types and writer classes are plain Python.
kinesalite for the stream check."""

from __future__ import annotations

from typing import Any

import pytest
from support.group import create_stream

from kinesumer import StreamNotFoundError

pytest.importorskip("pyspark.sql.datasource", reason="needs pyspark 4.0+")


def schema(*names: str) -> Any:
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    return StructType(
        [StructField("data", BinaryType())]
        + [StructField(name, StringType()) for name in ("partition_key", *names)]
    )


def test_a_missing_stream_named_by_the_option_fails_when_the_writer_is_made(
    kinesalite: Any, unique_name: Any
) -> None:
    """It failed only in the tasks, each after the producer's retries: a named error at
    save() is what the issue asks for. A streaming query's writer is made again at every
    commit, so it is not checked there (its first batch's tasks name the missing stream)."""
    from kinesumer.spark.sink.writer import sink_writer

    options = {"region": "us-east-1", "kinesis_endpoint": kinesalite.url}
    missing = unique_name("missing")
    with pytest.raises(StreamNotFoundError, match=missing):
        sink_writer({**options, "stream": missing}, schema(), False, False)
    assert sink_writer({**options, "stream": missing}, schema(), False, True) is not None
    there = unique_name("there")
    create_stream(kinesalite.url, there, 1)
    assert sink_writer({**options, "stream": there}, schema(), False, False) is not None
    # Routed row by row: the streams are known only as rows come, in the tasks.
    assert sink_writer(options, schema("stream"), False, True) is not None
