"""Read-ahead on real local Spark (kinesalite + dynalite): a backlog on several shards, read in
batches of a few records per shard, so that every batch after a shard's first can be taken from
what a Python worker read ahead (kinesumer.spark.source.executor.readahead).

A watcher lists the read-ahead folder while the query runs: it notes the ``.data`` files it sees
and SIGKILLs the Python worker of the first ``.pending`` claim it sees, mid-read-ahead. Every
record must still arrive exactly once, in order on its shard; the files must have been taken
(seen, none left, none dropped as never taken: no ``.cold`` mark)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.group import create_stream, put
from support.spark_source import Collector, local_spark, spark_group, start_query

from kinesumer.spark import KinesumerDataSource

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A session whose Python workers keep their read-ahead under a temporary folder of the
    test's own (their TMPDIR), and that folder's read-ahead root."""
    tmp = tmp_path_factory.mktemp("workers-tmp")
    with local_spark() as session:
        # The workers' environment is the registered source's: register it again with TMPDIR.
        session.sparkContext.environment["TMPDIR"] = str(tmp)
        session.dataSource.register(KinesumerDataSource)
        yield session, tmp / f"kinesumer-read-ahead-{os.getuid()}"


class Watcher(threading.Thread):
    """Lists ``root``'s query folders every few ms: notes ``.data`` names, and kills the worker
    of the first ``.pending`` claim (its pid is inside) once."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.data_seen: set[str] = set()
        self.killed: int | None = None
        self.halt = threading.Event()

    def files(self) -> list[Path]:
        with contextlib.suppress(FileNotFoundError):
            return [f for folder in self.root.iterdir() for f in folder.iterdir()]
        return []

    def run(self) -> None:
        while not self.halt.wait(0.002):
            with contextlib.suppress(FileNotFoundError, ValueError):
                for path in self.files():
                    if path.suffix == ".data":
                        self.data_seen.add(path.name)
                    elif path.suffix == ".pending" and self.killed is None:
                        pid = int(path.read_text())
                        if pid and pid != os.getpid():
                            os.kill(pid, signal.SIGKILL)
                            self.killed = pid


def test_a_backlog_read_ahead_arrives_exactly_once_with_a_worker_killed_mid_read(
    spark: tuple[Any, Path], kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Path
) -> None:
    session, root = spark
    group = spark_group(kinesalite, dynalite, unique_name)
    config, stream, url = group["config"], group["stream"], group["url"]
    create_stream(url, stream, 3)
    produced = put(url, stream, 0, 240, key=lambda i: f"k{i % 17}")
    watcher = Watcher(root)
    watcher.start()
    sink = Collector()
    query = start_query(
        session,
        config,
        [stream],
        sink,
        str(tmp_path / "ck"),
        available_now=True,
        max_records_per_shard=10,
    )
    try:
        query.awaitTermination(300)
    finally:
        if query.isActive:
            query.stop()
        watcher.halt.set()
        watcher.join(10)
    rows = sink.rows()
    assert sorted(bytes(r[5]) for r in rows) == sorted(produced)  # each exactly once
    by_shard: dict[str, list[int]] = {}
    for row in rows:  # in batch order, each batch in its partitions' order
        by_shard.setdefault(row[1], []).append(int(row[2]))
    assert len(by_shard) == 3
    assert all(seqs == sorted(seqs) for seqs in by_shard.values())
    assert watcher.killed is not None, "no read-ahead under way was ever seen"
    left = [f.name for f in watcher.files()]
    assert len(watcher.data_seen) >= 6, left  # read ahead, several batches per shard
    assert not [n for n in left if n.endswith((".data", ".cold"))]  # all taken
