"""What the source reports of a batch once read (kinesumer.spark.source.driver.progress): the real
end of each shard's read, its records and its lag, in ``reportLatestOffset`` (the progress's
``latestOffset``) and at INFO. Planner, executor reads and ledger on kinesalite + dynalite, with the
stand-in member of :mod:`support.spark_fakes`."""

from __future__ import annotations

from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember

from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_partition
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions

pytest.importorskip("pyarrow")


def test_the_batch_read_last_is_reported_with_its_ends_and_lag(
    kinesalite: Any, dynalite: Any, unique_name: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 30, key=lambda i: f"k{i % 5}")
    planner = Planner(SourceOptions(config=config, streams=(stream,)), SoloMember)  # type: ignore[arg-type]
    planner.initial_offset()
    try:
        first = planner.latest_offset(SourceOffset(planner.query or "", 0).to_json(), None)
        ends: dict[str, str] = {}
        for partition in planner.partitions(first):
            for batch in read_partition(partition):
                rows = batch.to_pylist()
                if rows:
                    ends[f"{stream}/{partition.shard_id}"] = rows[-1]["sequence_number"]
        put(kinesalite.url, stream, 30, 5)
        with caplog.at_level("INFO", logger="kinesumer.spark.source"):
            second = planner.latest_offset(first, None)
        report = planner.report_latest()
    finally:
        planner.close()
    assert report is not None and report["batch"] == second["batch"] == 2
    read = report["read"]
    assert read["batch"] == 1 and read["records"] == 30
    assert {name: s["end"] for name, s in read["shards"].items() if s["end"]} == ends
    assert all(s["millis_behind"] is not None for s in read["shards"].values())
    assert read["max_millis_behind"] == max(s["millis_behind"] for s in read["shards"].values())
    lags = [s["millis_behind"] for s in read["shards"].values()]
    assert read["maxMsBehindLatest"] == max(lags) and read["minMsBehindLatest"] == min(lags)
    assert read["avgMsBehindLatest"] == round(sum(lags) / len(lags), 1)
    assert "batch 1 read: 30 records" in caplog.text
