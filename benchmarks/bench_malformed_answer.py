"""What one GetRecords answer that is not Kinesis's costs a reader: time to the good batch,
requests made, retries counted.

    .venv/bin/python benchmarks/bench_malformed_answer.py [--runs 5]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid), through the
tests' fault proxy: a 1-shard stream of 10 records read from TRIM_HORIZON by one
:class:`KinesisReader` GetRecords call, whose first answer the proxy replaces with a gateway's
page (``html``), ``{}``, or a well-formed "end" of the open shard (``open-end``); ``none``
replaces nothing. Lean path and botocore-only path; the median, min and max over ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.faultproxy import Fault, FaultProxy  # noqa: E402
from support.group import create_stream, make_config, put  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Config  # noqa: E402
from kinesumer.aws import AwsClients, RequestStats  # noqa: E402
from kinesumer.kinesis.reader import KinesisReader  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

STREAM, SHARD = "malformed", "shardId-000000000000"
PAGES: dict[str, Fault | None] = {
    "html": Fault.answer(b"<html>gateway</html>"),
    "{}": Fault.answer(b"{}", "application/x-amz-json-1.1"),
    "open-end": Fault.answer(
        b'{"Records": [], "MillisBehindLatest": 0}', "application/x-amz-json-1.1"
    ),
    "none": None,
}


async def one(
    proxy: FaultProxy, config: Config, page: Fault | None, lean: bool
) -> tuple[float, dict[str, int], dict[Any, int]]:
    """One GetRecords through the proxy, ``page`` answering its first attempt: the seconds it
    took, the requests it made, the retries it counted."""
    stats = RequestStats()
    clients = AwsClients(config, stats)
    await clients.open()
    try:
        reader = KinesisReader(clients.kinesis, stats, "us-east-1", lean_get_records=lean)
        iterator = await reader.shard_iterator(STREAM, SHARD, None, "TRIM_HORIZON")
        before = dict(stats.requests)
        if page is not None:
            proxy.add_rule(page, service="kinesis", operation="GetRecords", count=1)
        started = time.monotonic()
        batch = await reader.get_records(STREAM, SHARD, iterator, 10_000, None)
        took = time.monotonic() - started
        assert len(batch.records) == 10 and batch.next_iterator
        made = {k: n - before.get(k, 0) for k, n in stats.requests.items() if n > before.get(k, 0)}
        return took, made, dict(stats.retries)
    finally:
        await clients.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    proxy = FaultProxy(kinesalite.url)
    try:
        config = make_config(proxy.url, dynalite.url, "bench", "bench")
        create_stream(kinesalite.url, STREAM, 1)
        put(kinesalite.url, STREAM, 0, 10)
        for lean in (True, False):
            for name, page in PAGES.items():
                results = [asyncio.run(one(proxy, config, page, lean)) for _ in range(runs)]
                times = [r[0] for r in results]
                print(
                    f"{'lean' if lean else 'botocore'} {name:8s}: "
                    f"median {statistics.median(times):.2f} s (min {min(times):.2f}, max "
                    f"{max(times):.2f}); requests {results[-1][1]}; retries {results[-1][2]}",
                    flush=True,
                )
    finally:
        proxy.stop()
        kinesalite.stop()
        dynalite.stop()


if __name__ == "__main__":
    main()
