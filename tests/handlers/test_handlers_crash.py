"""``run()`` across members: a kill -9 mid-flight then a restart, and a graceful handoff with
records in flight (kinesalite + dynalite).

The crash must lose nothing and deliver again only what was not checkpointed: everything at or
below a shard's checkpoint (read right after the kill) was done by the killed member, and the
restarted member handles exactly the records after it. The handoff must deliver nothing twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import Running
from support.group import create_stream, make_config, put, setup_table
from support.handlers import Run, checkpoints
from support.scenario import HANDLER_MEMBER_SCRIPT
from support.wait import wait_until

from kinesumer import Config, Kinesumer, Record

MEMBER = HANDLER_MEMBER_SCRIPT
LINE = re.compile(r"^(k\d+) data=b'(\d+)'$")


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    return {"config": config, "stream": unique_name("s"), "url": kinesalite.url}


class MemberProcess:
    def __init__(self, config: Config, stream: str, client_id: str, workdir: Path) -> None:
        self.out = workdir / f"{client_id}.jsonl"
        self.log = (workdir / f"{client_id}.log").open("w")
        command = [
            sys.executable,
            str(MEMBER),
            "--app",
            config.app,
            "--table",
            config.dynamodb_table,
            "--kinesis",
            str(config.kinesis_endpoint),
            "--dynamodb",
            str(config.dynamodb_endpoint),
            "--client-id",
            client_id,
            "--out",
            str(self.out),
            "--delay",
            "0.01",
            stream,
        ]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def lines(self, event: str) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        rows = []
        for text in self.out.read_text().splitlines():
            try:
                row = json.loads(text)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if row["ev"] == event:
                rows.append(row)
        return rows

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.close()


def test_kill_9_mid_flight_loses_nothing(group: dict[str, Any], tmp_path: Path) -> None:
    config, stream, url = group["config"], group["stream"], group["url"]
    create_stream(url, stream, 2)
    total = 1500
    put(url, stream, 0, total, key=lambda i: f"k{i % 40}")
    first = MemberProcess(config, stream, "first", tmp_path)
    second: MemberProcess | None = None
    try:
        wait_until(lambda: len(first.lines("done")) >= 300, 30, "the first member handling")
        first.process.kill()  # SIGKILL: no handoff, no final checkpoint
        first.process.wait(10)
        marks = checkpoints(config, stream)  # what the next owner starts after
        done_first = {int(r["data"]) for r in first.lines("done")}
        started_first = {int(r["data"]) for r in first.lines("start")}
        assert started_first - done_first, "nothing was in flight at the kill"
        second = MemberProcess(config, stream, "second", tmp_path)

        def finished() -> bool:
            return done_first | {int(r["data"]) for r in second.lines("done")} >= set(range(total))

        wait_until(finished, 60, "every record handled by one of the two members")
    finally:
        first.stop()
        if second is not None:
            second.stop()
    handled_second = second.lines("done")

    def checkpointed(row: dict[str, Any]) -> bool:
        mark = marks.get(row["shard_id"])
        return mark is not None and int(row["sequence_number"]) <= mark

    # Nothing lost (finished() above), and the restart handled only records after the
    # checkpoint: so every record at or below it was done by the killed member (the checkpoint
    # never passed an unfinished record), and the ones handled twice are exactly those the
    # killed member finished after its last checkpoint.
    below = [row for row in handled_second if checkpointed(row)]
    assert not below, f"delivered again at or below the checkpoint: {below[:3]}"
    in_flight = started_first - done_first
    assert in_flight <= {int(row["data"]) for row in handled_second}
    numbers = [int(row["data"]) for row in handled_second]
    assert len(numbers) == len(set(numbers)), "the restarted member handled a record twice"
    again = done_first & set(numbers)
    done_after_mark = {int(r["data"]) for r in first.lines("done") if not checkpointed(r)}
    assert again == done_after_mark


def test_graceful_handoff_with_records_in_flight(group: dict[str, Any]) -> None:
    """A second member joins while a producer keeps writing and the first member has records
    in flight: the shards that move wait for them, and no record is handled twice."""
    config, stream, url = group["config"], group["stream"], group["url"]
    create_stream(url, stream, 4)
    lock = threading.Lock()
    handled: list[tuple[str, Record]] = []
    produced = [0]
    producing = threading.Event()
    producing.set()

    def produce() -> None:
        while producing.is_set():
            put(url, stream, produced[0], 50, key=lambda i: f"k{i % 97}")
            produced[0] += 50
            time.sleep(0.05)

    def handler(name: str) -> Callable[[Record], None]:
        def handle(record: Record) -> None:
            time.sleep(0.005)
            with lock:
                handled.append((name, record))

        return handle

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        first = Run(Kinesumer(config), [stream], handler("first"), concurrency=16, ordering="key")
        wait_until(lambda: len(handled) >= 200, 30, "the first member handling")
        second_consumer = Kinesumer(config)
        second = Run(second_consumer, [stream], handler("second"), concurrency=16, ordering="key")
        wait_until(
            lambda: sum(1 for _ in filter(lambda h: h[0] == "second", list(handled))) >= 100,
            30,
            "the second member handling its shards",
        )
    finally:
        producing.clear()
        producer.join(10)
    total = produced[0]
    wait_until(lambda: len(handled) >= total, 60, "every record handled")
    first.stop()
    second.stop()
    numbers = [int(record.data) for _, record in handled]
    twice = sorted(n for n, times in Counter(numbers).items() if times > 1)
    assert not twice, f"handled twice: {twice[:10]}"
    assert sorted(numbers) == list(range(total))


def test_example_handler_concurrency(group: dict[str, Any]) -> None:
    """examples/handler_concurrency.py: every record, each key in order, a clean stop whose
    checkpoints make the next run start after the last record."""
    config, stream, url = group["config"], group["stream"], group["url"]
    create_stream(url, stream, 2)
    put(url, stream, 0, 200, key=lambda i: f"k{i % 10}")
    environ = {
        **os.environ,
        "AWS_ENDPOINT_URL_KINESIS": url,
        "AWS_ENDPOINT_URL_DYNAMODB": str(config.dynamodb_endpoint),
        "KINESUMER_APP": config.app,
        "KINESUMER_TABLE": config.dynamodb_table,
        "KINESUMER_STREAMS": stream,
        "KINESUMER_INITIAL_POSITION": "TRIM_HORIZON",
    }
    example = Path(__file__).resolve().parents[2] / "examples" / "handler_concurrency.py"

    def run_it(*args: str, until: int | None = None) -> list[tuple[str, int]]:
        """Run the example to its end; with ``until``, SIGTERM it once it printed that many
        records (the graceful stop a service gets)."""
        proc = Running([sys.executable, str(example), *args], env=environ)
        try:
            if until is not None:
                wait_until(lambda: len(matches(proc.lines)) >= until, 30, "records printed")
                proc.proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            message = f"did not stop:\n{proc.output[-2000:]}\n{proc.errors[-3000:]}"
            raise AssertionError(message) from None
        finally:
            proc.stop()
        assert code == 0, f"exited with {code}:\n{proc.output}\n{proc.errors}"
        assert "stopped cleanly" in proc.output
        return matches(proc.lines)

    first = run_it("200")
    assert sorted(n for _, n in first) == list(range(200))
    for key in {k for k, _ in first}:
        of_key = [n for k, n in first if k == key]
        assert of_key == sorted(of_key), f"{key} out of order"
    put(url, stream, 200, 10, key=lambda i: f"k{i % 10}")
    assert sorted(n for _, n in run_it(until=10)) == list(range(200, 210))


def matches(lines: list[str]) -> list[tuple[str, int]]:
    """(key, number) of the example's record lines."""
    found = [LINE.match(line) for line in list(lines)]
    return [(m.group(1), int(m.group(2))) for m in found if m]
