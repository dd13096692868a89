"""The Producer vs a plain boto3 ``put_records`` loop of 500-record calls (the loop most users
write: resend the entries that came back with an ``ErrorCode``), side by side on the same
kinesalite, 100-byte records over 100 keys: records/s, client CPU per record, and how many
records each key's reader meets out of put order; ``ordering="key"`` vs ``"none"``, aggregated vs
not; with no faults and with 20% of each call's entries refused (the fault proxy's
``refuse_entries``). The Producer paces each shard at its write limits (1,000 records/s) by
default, as against AWS; kinesalite has no limits, so the unpaced rows show the ceiling.

Used by ``benchmarks/run.py``; runnable alone::

    .venv/bin/python benchmarks/bench_producer.py [--records 20000] [--shards 4] [--keys 100]
        [--refused 0,0.2] [--rtt 0.02] [--rtt-rows 0.02]

With ``ordering="key"`` a key has one entry in flight at a time (see
``kinesumer/producer/batching.py``): a call carries at most one record per key, so few keys cap
the records per round trip; ``--keys 1000`` shows the rate with enough keys to fill calls. A
first, untimed boto3 loop warms kinesalite up, so that no row pays for its start. ``--rtt``
delays each PutRecords call by that many seconds (rows without refused entries; the fault proxy
applies one fault per call) as the round trip to AWS would: kinesalite answers in about a
millisecond from the same host, where a loop with one call in flight waits out every trip. The
round-trip row set (``--rtt-rows``, default 20 ms; 0 skips it) runs the loop and the unpaced
Producer rows through the same delaying proxy, side by side: the realistic comparison.

The fault proxy, when a row needs one, runs in a child process: in this process its forwarding
threads would count in the client's CPU and take the GIL from the Producer's loop thread. Rows
without faults talk to kinesalite directly. ``boto3 loops xN`` runs N plain loops in N processes
on disjoint shares of the records (CPU: theirs, summed): what kinesalite itself takes from
several writers, the ceiling of any unaggregated writer here.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

import boto3  # noqa: E402
from support.faultproxy import Fault, FaultProxy  # noqa: E402
from support.produced import by_key, read_all  # noqa: E402
from support.standins import start_kinesalite  # noqa: E402

from kinesumer import Config, Producer  # noqa: E402

KEYS = 100
SIZE = 100

#: ``--metrics``: the Producers record Prometheus metrics (``Config.metrics``; no endpoint).
METRICS = {"on": False}

#: Plain loops run side by side (processes) in the ceiling row.
PARALLEL_LOOPS = 4

#: (label, Producer keywords); None: the plain boto3 loop; an int: that many loops in parallel.
CASES: list[tuple[str, dict[str, Any] | int | None]] = [
    ("boto3 loop", None),
    (f"boto3 loops x{PARALLEL_LOOPS} (processes)", PARALLEL_LOOPS),
    ('Producer ordering="key"', {}),
    ('Producer ordering="none"', {"ordering": "none"}),
    ("Producer aggregate=True", {"aggregate": True}),
    ('Producer ordering="key", unpaced', {"shard_records_per_second": None}),
    ('Producer ordering="none", unpaced', {"ordering": "none", "shard_records_per_second": None}),
    ("Producer aggregate=True, unpaced", {"aggregate": True, "shard_records_per_second": None}),
]


#: The round-trip row set: every PutRecords held this long by the (out-of-process) fault proxy,
#: about what an in-region PutRecords takes on AWS (20-40 ms), against kinesalite's ~1 ms.
RTT = 0.02

#: Its contenders, all through the same delaying proxy. Unpaced: kinesalite has no shard
#: limits, so these stand for a stream with shards enough for either rate.
RTT_CASES: list[tuple[str, dict[str, Any] | None]] = [
    ("boto3 loop", None),
    ('Producer ordering="key", unpaced', {"shard_records_per_second": None}),
    ('Producer ordering="none", unpaced', {"ordering": "none", "shard_records_per_second": None}),
    ("Producer aggregate=True, unpaced", {"aggregate": True, "shard_records_per_second": None}),
]


def payload(i: int) -> bytes:
    return (b"%d:" % i).ljust(SIZE, b"x")


def plain_loop(
    url: str, stream: str, records: int, keys: int, part: int = 0, parts: int = 1
) -> None:
    """500-record PutRecords calls, resending the refused entries; ``part`` of ``parts``: the
    records of the keys ``k`` with ``k % parts == part`` (each key's records from one writer, in
    order)."""
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    mine = [i for i in range(records) if (i % keys) % parts == part]
    for start in range(0, len(mine), 500):
        entries = [
            {"Data": payload(i), "PartitionKey": f"k{i % keys}"} for i in mine[start : start + 500]
        ]
        while entries:
            results = client.put_records(StreamName=stream, Records=entries)["Records"]
            entries = [e for e, r in zip(entries, results, strict=True) if "ErrorCode" in r]


def _loop_part(args: tuple[str, str, int, int, int, int]) -> float:
    cpu = time.process_time()
    plain_loop(*args)
    return time.process_time() - cpu


def _warm(url: str) -> None:
    boto3.client("kinesis", endpoint_url=url, region_name="us-east-1").list_streams()


def parallel_loops(
    url: str, stream: str, records: int, keys: int, parts: int
) -> tuple[float, float]:
    """``parts`` plain loops in as many (started, warm) processes: wall seconds, and their CPU
    seconds summed."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(parts) as pool:
        pool.map(_warm, [url] * parts)
        wall = time.perf_counter()
        cpus = pool.map(_loop_part, [(url, stream, records, keys, n, parts) for n in range(parts)])
        wall = time.perf_counter() - wall
    return wall, sum(cpus)


def _serve_proxy(kurl: str, refused: float, rtt: float, conn: Any) -> None:
    with FaultProxy(kurl) as proxy:
        if refused:
            proxy.add_rule(
                Fault.refuse_entries(refused), service="kinesis", operation="PutRecords", seed=1
            )
        elif rtt:
            proxy.add_rule(Fault.delay(rtt), service="kinesis", operation="PutRecords")
        conn.send(proxy.url)
        conn.recv()  # until told to stop


@contextlib.contextmanager
def endpoint(kurl: str, refused: float, rtt: float) -> Iterator[str]:
    """kinesalite's URL, or a fault proxy's in front of it (in a child process)."""
    if not refused and not rtt:
        yield kurl
        return
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve_proxy, args=(kurl, refused, rtt, theirs), daemon=True
    )
    process.start()
    try:
        yield ours.recv()
    finally:
        ours.send("stop")
        process.join(10)


def producer_run(url: str, stream: str, records: int, keys: int, options: dict[str, Any]) -> None:
    config = None
    if METRICS["on"]:
        config = Config(
            app="bench", dynamodb_table="unused", region="us-east-1", kinesis_endpoint=url,
            metrics=True,
        )  # fmt: skip
    with Producer(kinesis_endpoint=url, region="us-east-1", config=config, **options) as producer:
        for i in range(records):
            producer.put(stream, payload(i), partition_key=f"k{i % keys}")


def out_of_order(url: str, stream: str, records: int) -> int:
    read = read_all(url, stream)
    assert len({r.data for r in read}) == records, "lost records"
    broken = 0
    for datas in by_key(read).values():
        numbers = [int(d.split(b":")[0]) for d in datas]
        broken += sum(1 for a, b in itertools.pairwise(numbers) if b < a)
    return broken


def one(
    kurl: str,
    shards: int,
    records: int,
    keys: int,
    refused: float,
    case: dict[str, Any] | int | None,
    rtt: float = 0.0,
) -> Any:
    client = boto3.client("kinesis", endpoint_url=kurl, region_name="us-east-1")
    stream = f"bench-produce-{os.getpid()}-{time.monotonic_ns()}"
    client.create_stream(StreamName=stream, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    with endpoint(kurl, refused, rtt) as url:
        if isinstance(case, int):
            wall, cpu = parallel_loops(url, stream, records, keys, case)
        else:
            cpu, wall = time.process_time(), time.perf_counter()
            if case is None:
                plain_loop(url, stream, records, keys)
            else:
                producer_run(url, stream, records, keys, case)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "records_per_s": records / wall,
        "cpu_us_per_record": cpu / records * 1e6,
        "out_of_order": out_of_order(kurl, stream, records),
    }


def run(
    kurl: str,
    records: int,
    shards: int = 4,
    keys: int = KEYS,
    refused_shares: tuple[float, ...] = (0.0, 0.2),
    rtt: float = 0.0,
    rtt_rows: float = RTT,
) -> dict[str, Any]:
    """``rtt``: a delay on every row without refused entries; ``rtt_rows``: the delay of the
    round-trip row set (0: none)."""
    one(kurl, shards, min(records, 5000), keys, 0.0, None)  # warm-up, not reported
    rows = []
    for refused in refused_shares:
        for label, case in CASES:
            result = one(kurl, shards, records, keys, refused, case, rtt)
            rows.append({"case": label, "refused": refused, **result})
            print(f"  produce {label}, {refused:.0%} refused: {result}", flush=True)
    rtt_results = []
    for label, rtt_case in RTT_CASES if rtt_rows else []:
        result = one(kurl, shards, records, keys, 0.0, rtt_case, rtt_rows)
        rtt_results.append({"case": label, "refused": 0.0, **result})
        print(f"  produce {label}, round trip {rtt_rows * 1000:.0f} ms: {result}", flush=True)
    return {
        "records": records,
        "shards": shards,
        "size": SIZE,
        "keys": keys,
        "rtt": rtt,
        "rows": rows,
        "rtt_rows": rtt_rows,
        "rtt_results": rtt_results,
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        "",
        f"**Producing**: {r['records']:,} records of {r['size']} B over {r['keys']:,} keys to "
        f"{r['shards']} shards on kinesalite"
        + (f", PutRecords delayed {r['rtt'] * 1000:.0f} ms" if r.get("rtt") else "")
        + "; the Producer vs a boto3 loop of 500-record "
        "PutRecords calls that resends refused entries. CPU: client process CPU per record "
        "(the Producer's loop thread included). Out of order: records a reader meets after a "
        "later record of their key.",
        "",
        "| case | refused | records/s | vs loop | CPU us/record | out of order |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines.extend(_table_rows(r["rows"]))
    if r.get("rtt_results"):
        lines += [
            "",
            f"**Producing with a round trip as on AWS**: the same records, every PutRecords "
            f"held {r['rtt_rows'] * 1000:.0f} ms by the fault proxy (in its own process) for "
            "both contenders, as an in-region call to Kinesis takes 20-40 ms where kinesalite "
            "answers in about 1 ms. A loop with one call in flight waits out each trip; the "
            "Producer keeps up to 8 calls in flight per stream. The fair comparison for a real "
            "stream; unpaced, as on a stream with shards enough for either rate.",
            "",
            "| case | refused | records/s | vs loop | CPU us/record | out of order |",
            "|---|---:|---:|---:|---:|---:|",
            *_table_rows(r["rtt_results"]),
        ]
    return "\n".join(lines)


def _table_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown rows, each against the boto3 loop of its share of refused entries."""
    base = {row["refused"]: row["records_per_s"] for row in rows if row["case"] == "boto3 loop"}
    return [
        f"| {row['case']} | {row['refused']:.0%} | {row['records_per_s']:,.0f} | "
        f"{row['records_per_s'] / base[row['refused']]:.2f}x | "
        f"{row['cpu_us_per_record']:.1f} | {row['out_of_order']:,} |"
        for row in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--keys", type=int, default=KEYS)
    parser.add_argument("--refused", default="0,0.2", help="shares of entries refused, e.g. 0")
    parser.add_argument("--rtt", type=float, default=0.0, help="seconds added to PutRecords")
    parser.add_argument(
        "--rtt-rows",
        type=float,
        default=RTT,
        help=f"the round-trip row set's delay per PutRecords, seconds (default {RTT}; 0: skip)",
    )
    parser.add_argument(
        "--metrics", action="store_true", help="Producers record Prometheus metrics (no endpoint)"
    )
    args = parser.parse_args()
    METRICS["on"] = args.metrics
    shares = tuple(float(share) for share in args.refused.split(","))
    kinesalite = start_kinesalite()
    try:
        result = run(
            kinesalite.url, args.records, args.shards, args.keys, shares, args.rtt, args.rtt_rows
        )
        print(report(result))
    finally:
        kinesalite.stop()


if __name__ == "__main__":
    main()
