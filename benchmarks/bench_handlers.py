"""The handler layer (``Kinesumer.run``) side by side with today's iterator (``consume()``).

    .venv/bin/python benchmarks/bench_handlers.py [--quick] [--rounds 3]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid), one pre-filled
4-shard stream of ~100 B records, each record with its own partition key, read from
TRIM_HORIZON by a fresh group for every contender:

1. A handler that waits 10 ms per record (an I/O call): records/s of the iterator calling it
   for each record, of ``run(ordering="key", concurrency=64)`` and of
   ``run(ordering="none", concurrency=64)``; the ratios to the iterator.
2. A handler that does nothing: CPU seconds per record (``time.process_time`` of the whole
   process, all threads, from the first record to the last) of the iterator and of
   ``run()`` with its defaults (concurrency 1, shard ordering: the handler runs inline).

Throughput and CPU are measured in steady state, from the first record to the last; each figure
is the median of ``--rounds`` rounds, contenders alternating.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_core import Clock, bench_config, fill  # noqa: E402
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

from kinesumer import Kinesumer, Record, create_state_table  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

#: What the slow handler waits per record: an I/O call.
IO_SECONDS = 0.01


def iterate(config: Any, stream: str, total: int, clock: Clock, work: Callable[[], None]) -> None:
    """Today's way: ``for record in consume()``, calling the handler on each."""
    count = 0
    with Kinesumer(config) as consumer:
        for record in consumer.consume([stream]):
            clock.tick()
            _ = record.data
            work()
            count += 1
            if count >= total:
                clock.stop()
                break


def run_handler(
    config: Any, stream: str, total: int, clock: Clock, work: Callable[[], None], **options: Any
) -> None:
    """``consumer.run(...)`` until ``total`` records were handled, then close() from another
    thread (the documented way to stop it)."""
    count = [0]
    lock = threading.Lock()
    enough = threading.Event()

    def handle(record: Record) -> None:
        clock.tick()
        _ = record.data
        work()
        with lock:
            count[0] += 1
            if count[0] == total:
                clock.stop()
                enough.set()

    with Kinesumer(config) as consumer:
        closer = threading.Thread(target=lambda: (enough.wait(), consumer.close()), daemon=True)
        closer.start()
        consumer.run([stream], handle, **options)
        closer.join()


def measure(fn: Callable[[Clock], None], total: int) -> tuple[float, float]:
    """(records/s, CPU seconds per record), steady state: first record to the last."""
    clock = Clock()
    fn(clock)
    assert clock.first is not None and clock.end is not None
    seconds = clock.end[0] - clock.first[0]
    cpu = clock.end[1] - clock.first[1]
    return (total - 1) / seconds, cpu / (total - 1)


def sleep_io() -> None:
    time.sleep(IO_SECONDS)


def nothing() -> None:
    pass


def run(kurl: str, durl: str, quick: bool, rounds: int = 3) -> dict[str, Any]:
    """Both comparisons; medians of ``rounds`` rounds (1 with ``quick``)."""
    rounds = 1 if quick else rounds
    slow_iterator, slow_run = (150, 4_000) if quick else (300, 10_000)
    cpu_records = 20_000 if quick else 60_000
    stream = f"bench-handlers-{os.getpid()}"
    fill(kurl, stream, 4, max(slow_run, cpu_records))
    apps = iter(range(1_000_000))

    def config() -> Any:
        return bench_config(kurl, durl, f"bh-{os.getpid()}-{next(apps)}")

    contenders: dict[str, Callable[[Clock], None]] = {
        "iterator_io": lambda c: iterate(config(), stream, slow_iterator, c, sleep_io),
        "key64_io": lambda c: run_handler(
            config(), stream, slow_run, c, sleep_io, concurrency=64, ordering="key"
        ),
        "none64_io": lambda c: run_handler(
            config(), stream, slow_run, c, sleep_io, concurrency=64, ordering="none"
        ),
        "iterator_noop": lambda c: iterate(config(), stream, cpu_records, c, nothing),
        "run_noop": lambda c: run_handler(config(), stream, cpu_records, c, nothing),
    }
    totals = {
        "iterator_io": slow_iterator,
        "key64_io": slow_run,
        "none64_io": slow_run,
        "iterator_noop": cpu_records,
        "run_noop": cpu_records,
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for number in range(rounds):
        for name, fn in contenders.items():
            results[name].append(measure(fn, totals[name]))
            rate, cpu = results[name][-1]
            print(
                f"  round {number + 1} {name}: {rate:,.0f} records/s, "
                f"{cpu * 1e6:.1f} us CPU/record",
                flush=True,
            )
    rate = {name: statistics.median(r for r, _ in got) for name, got in results.items()}
    cpu = {name: statistics.median(c for _, c in got) for name, got in results.items()}
    return {
        "rounds": rounds,
        "io_seconds": IO_SECONDS,
        "records_per_s": {
            "iterator": rate["iterator_io"],
            "run_key_64": rate["key64_io"],
            "run_none_64": rate["none64_io"],
        },
        "speedup_key_64": rate["key64_io"] / rate["iterator_io"],
        "speedup_none_64": rate["none64_io"] / rate["iterator_io"],
        "cpu_us_per_record": {
            "iterator": cpu["iterator_noop"] * 1e6,
            "run_inline": cpu["run_noop"] * 1e6,
        },
        "cpu_ratio": cpu["run_noop"] / cpu["iterator_noop"],
        "noop_records_per_s": {"iterator": rate["iterator_noop"], "run_inline": rate["run_noop"]},
    }


def report(result: dict[str, Any]) -> str:
    rps, cpu = result["records_per_s"], result["cpu_us_per_record"]
    lines = [
        f"handler waiting {result['io_seconds'] * 1000:.0f} ms per record, 4 shards "
        f"(median of {result['rounds']}):",
        f"  {'iterator (consume())':<34}{rps['iterator']:>10,.0f} records/s   1.0x",
        f"  {'run(ordering=key, concurrency=64)':<34}{rps['run_key_64']:>10,.0f} records/s "
        f"{result['speedup_key_64']:>5.1f}x",
        f"  {'run(ordering=none, concurrency=64)':<34}{rps['run_none_64']:>10,.0f} records/s "
        f"{result['speedup_none_64']:>5.1f}x",
        "no-op handler, CPU per record (whole process):",
        f"  {'iterator (consume())':<34}{cpu['iterator']:>10.1f} us",
        f"  {'run() (concurrency=1, inline)':<34}{cpu['run_inline']:>10.1f} us "
        f"{result['cpu_ratio']:>5.2f}x",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(None, dynalite.url, "bench"))
        result = run(kinesalite.url, dynalite.url, args.quick, args.rounds)
    finally:
        kinesalite.stop()
        dynalite.stop()
    print(report(result))


if __name__ == "__main__":
    main()
