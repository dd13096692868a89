"""A stopped query leaves its group: ``query.stop()``, and ``spark.stop()`` with the query
running, release the query's shards at once and deregister its member (local Spark,
kinesalite + dynalite), so a plain ``Kinesumer`` of the same app owns them all well before
``client_timeout``, which is when it would get them from a member that crashed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support.group import create_stream, make_config, setup_table
from support.spark_source import Collector, checkpoints, local_spark, members, start_query
from support.wait import wait_until

from kinesumer import Kinesumer

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

WAIT = 180.0
#: Long, so a leave (shards free at once) and a crash (free after ``client_timeout``) stay apart
#: on a busy machine: the takeover is allowed half of it, 10 s, for the plain member to notice
#: the released shards and claim them (under a second unloaded; once over 5 s in a full run).
CLIENT_TIMEOUT = 20.0


def owners(config: Any, stream: str) -> dict[str, str]:
    """Each unfinished shard's owner, by shard id."""
    items = checkpoints(config, stream)
    return {
        shard: i["owner"]["S"]
        for shard, i in items.items()
        if "owner" in i and not i.get("finished", {}).get("BOOL")
    }


@pytest.mark.parametrize("how", ["query.stop()", "spark.stop()"])
def test_a_stopped_query_hands_its_shards_over_at_once(
    how: str, kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Any
) -> None:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        handoff_timeout=30.0,
        client_timeout=CLIENT_TIMEOUT,
        heartbeat_interval=0.5,
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 4)
    stop = threading.Event()
    consumer = Kinesumer(config)

    def consume() -> None:
        consumer.subscribe([stream])
        while not stop.is_set():
            consumer.poll(100, 0.2)
        consumer.close()

    thread = threading.Thread(target=consume, name="plain-kinesumer", daemon=True)
    thread.start()
    try:
        with local_spark() as spark:
            query = start_query(
                spark, config, [stream], Collector(), str(tmp_path / "ck"), shared_group=True
            )
            wait_until(
                lambda: len(set(owners(config, stream).values())) == 2 and query.lastProgress,
                WAIT,
                "the query and Kinesumer owning shards",
                lambda: f"{owners(config, stream)} {query.exception()}",
            )
            if how == "query.stop()":
                query.stop()
            else:
                spark.stop()
            stopped = time.monotonic()
            # A crashed member's shards are free after client_timeout; a leave frees them at
            # once, and the plain member notices at its next scan.
            wait_until(
                lambda: (
                    len(owners(config, stream)) == 4
                    and set(owners(config, stream).values()) == {consumer.client_id}
                ),
                CLIENT_TIMEOUT / 2,
                "the plain member owning every shard",
                lambda: (
                    f"{owners(config, stream)} after {time.monotonic() - stopped:.1f} s; "
                    f"members {members(config)}"
                ),
            )
            print(f"{how}: takeover {time.monotonic() - stopped:.2f} s after it returned")
            assert members(config) == [consumer.client_id]  # the query's member is gone
            query.stop()
    finally:
        stop.set()
        thread.join(60)


#: The source worker's end when Spark closes its socket first (the runner's ``finally`` calls
#: ``reader.stop()``) and sends SIGTERM while the member is leaving.
SIGTERM_DURING_THE_LEAVE = """
import os, signal, sys, threading, time
from kinesumer import Config
from kinesumer.spark.source.datasource import KinesumerStreamReader
from kinesumer.spark.source.options import SourceOptions
from kinesumer.spark.source.driver.planner import Planner

closes = []

def slow_leave(self):
    if closes:
        return  # as the member's close: once its loop stopped, a second close does nothing
    closes.append(1)
    print("leaving", flush=True)
    time.sleep(2.0)
    print("left", flush=True)

Planner.close = slow_leave
Planner.initial_offset = lambda self: {}
reader = KinesumerStreamReader(
    SourceOptions(config=Config(app="a", dynamodb_table="tab"), streams=("s",))
)
reader.initialOffset()  # the source worker's exit hooks are set on its first offset call
pid = os.getpid()
threading.Thread(target=lambda: (time.sleep(0.5), os.kill(pid, signal.SIGTERM))).start()
reader.stop()  # the runner's finally, after the socket closed
print("stopped", flush=True)
"""


def test_a_sigterm_during_the_leave_does_not_abort_it(tmp_path: Any) -> None:
    """What made ``spark.stop()`` sometimes leave no graceful leave: its SIGTERM landed in a
    leave that had already begun (the socket closed first) and cut it short."""
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(SIGTERM_DURING_THE_LEAVE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["leaving", "left", "stopped"], done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
