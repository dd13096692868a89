"""Duplicates after a kill -9 of a ``run(concurrency=32, ordering="key")`` member, and what the
done runs cost in the checkpoint item.

    .venv/bin/python benchmarks/bench_done_runs.py [--rounds 3] [--records 4000] [--root DIR]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid). Each round: a
fresh 2-shard stream holding ``--records`` records over 200 keys; a member process
(``tests/support/handler_member.py``, concurrency 32, ordering "key", 20 ms of work per record drawn
from 0..40 ms, except ``--slow-share`` of them (default 1%) taking 1 s, as a slow call to a
database does; commit_interval 0.5 s) handles them until 1,500 are done, is killed with SIGKILL,
and a second member handles the rest. Counted:

- ``in flight``: started by the first member, not done at the kill (must be delivered again);
- ``again``: records the first member finished that the second handled again (duplicates);
- the checkpoint items right after the kill: their size and the ``done`` attribute's size, and
  the write units a checkpoint write costs (ceil(size / 1 KB)).

``--root`` runs the members from another checkout (``kinesumer/`` beside it; the member script
is copied there), to measure the code before the change: ``git archive <commit> kinesumer |
tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.group import create_stream, make_config, put, setup_table  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

for _name, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ.setdefault(_name, _value)

import boto3  # noqa: E402

from kinesumer.statestore.schema import item_size  # noqa: E402

KILL_AFTER = 1500
SLOW_SHARE = 0.01


def member(
    root: Path, config: Any, stream: str, client_id: str, workdir: Path, slow_share: float
) -> Any:
    out = workdir / f"{client_id}.jsonl"
    command = [
        sys.executable,
        str(root / "tests" / "support" / "handler_member.py"),
        *("--app", config.app, "--table", config.dynamodb_table),
        *("--kinesis", str(config.kinesis_endpoint), "--dynamodb", str(config.dynamodb_endpoint)),
        *("--client-id", client_id, "--out", str(out)),
        *("--concurrency", "32", "--ordering", "key", "--delay", "0.02", "--jitter"),
        *("--slow-share", str(slow_share), stream),
    ]
    log = (workdir / f"{client_id}.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return process, out


def events(out: Path, event: str) -> set[int]:
    if not out.exists():
        return set()
    found = set()
    for text in out.read_text().splitlines():
        try:
            row = json.loads(text)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if row["ev"] == event:
            found.add(int(row["data"]))
    return found


def wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def one_round(
    kurl: str, durl: str, root: Path, number: int, records: int, slow_share: float
) -> dict[str, Any]:
    tag = f"{number}-{os.getpid()}"
    config = make_config(kurl, durl, f"bench-done-{tag}", f"bench-done-{tag}")
    setup_table(config)
    stream = f"bench-done-{tag}"
    create_stream(kurl, stream, 2)
    put(kurl, stream, 0, records, key=lambda i: f"k{i % 200}")
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        first, first_out = member(root, config, stream, "first", workdir, slow_share)
        try:
            wait(lambda: len(events(first_out, "done")) >= KILL_AFTER, 120, "first handling")
        finally:
            first.kill()
            first.wait(10)
        items = checkpoint_items(config, stream)
        done_first = events(first_out, "done")
        in_flight = events(first_out, "start") - done_first
        second, second_out = member(root, config, stream, "second", workdir, slow_share)
        try:
            wait(
                lambda: done_first | events(second_out, "done") >= set(range(records)),
                180,
                "every record handled",
            )
        finally:
            second.terminate()
            second.wait(20)
        again = done_first & events(second_out, "done")
    sizes = [item_size(item) for item in items]
    done_sizes = [len(item.get("done", {}).get("B", b"")) for item in items]
    return {
        "done_at_kill": len(done_first),
        "in_flight": len(in_flight),
        "again": len(again),
        "item_bytes": max(sizes),
        "done_bytes": max(done_sizes),
        "write_units": max(math.ceil(size / 1024) for size in sizes),
    }


def checkpoint_items(config: Any, stream: str) -> list[dict[str, Any]]:
    client = boto3.client("dynamodb", endpoint_url=config.dynamodb_endpoint)
    response = client.query(
        TableName=config.dynamodb_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"check_point#{config.app}#{stream}"}},
        ConsistentRead=True,
    )
    items: list[dict[str, Any]] = response["Items"]
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--slow-share", type=float, default=SLOW_SHARE)
    args = parser.parse_args()
    root = args.root.resolve()
    if root != ROOT:  # the member script of this checkout, the library of that one
        (root / "tests" / "support").mkdir(parents=True, exist_ok=True)
        member = Path("tests", "support", "handler_member.py")
        shutil.copy(ROOT / member, root / member)
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        rounds = [
            one_round(kinesalite.url, dynalite.url, root, n, args.records, args.slow_share)
            for n in range(args.rounds)
        ]
    finally:
        kinesalite.stop()
        dynalite.stop()
    print(f"code: {root}, slow share {args.slow_share}")
    print("round  done-at-kill  in-flight  handled-again  item-bytes  done-bytes  write-units")
    for n, r in enumerate(rounds):
        print(
            f"{n:>5}  {r['done_at_kill']:>12}  {r['in_flight']:>9}  {r['again']:>13}  "
            f"{r['item_bytes']:>10}  {r['done_bytes']:>10}  {r['write_units']:>11}"
        )
    print(f"median handled again: {statistics.median(r['again'] for r in rounds)}")


if __name__ == "__main__":
    main()
