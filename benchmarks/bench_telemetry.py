"""What OpenTelemetry costs per record: a ``run()`` handler call with the ``otel`` extra absent,
installed with no SDK (the global provider records nothing), and with an SDK recording every
span (a batch processor and an exporter that drops what it is given).

Each mode runs in a process of its own (the absent one blocks ``import opentelemetry``, as if
the extra were not installed), interleaved over several rounds in the same run; each process
times :meth:`kinesumer.handlers.invoke.Invocation.call_sync` on one record at a time (the plain
path: no decode, no sink, no batch), the handler doing nothing, so the figure is the library's
own cost per record. Pure: no stand-ins, no network. Runnable alone::

    .venv/bin/python benchmarks/bench_telemetry.py [--records 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("absent", "noop", "sdk")


def _provider(mode: str) -> Any:
    if mode != "sdk":
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping(), max_queue_size=65536))
    return provider


def measure(mode: str, records: int) -> dict[str, Any]:
    """Seconds per record of one handler call in this process (best of 5 passes)."""
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    from kinesumer import Config
    from kinesumer.aws.clients import ClientFactory
    from kinesumer.handlers.counters import HandlerCounters
    from kinesumer.handlers.invoke import Invocation
    from kinesumer.handlers.options import run_options
    from kinesumer.models import Checkpoint, Record
    from kinesumer.observability import telemetry
    from kinesumer.read.progress import shard_lease

    def handle(record: Record) -> None:
        pass

    config = Config(app="bench", dynamodb_table="state", tracer_provider=_provider(mode))
    options = run_options(
        handle,
        concurrency=1,
        ordering="key",
        max_in_flight=None,
        batch=None,
        on_failure=None,
        decode=None,
        sink=None,
        name="bench",
        is_async=False,
    )
    invocation = Invocation(handle, options, ClientFactory(config), HandlerCounters("bench"), False)
    lease = shard_lease(Checkpoint("orders", "shardId-000000000000"))
    stopping = threading.Event()
    batch = [
        [Record("orders", "shardId-000000000000", f"{i:056d}", 0, str(i), b"x", None)]
        for i in range(records)
    ]
    call = invocation.call_sync
    passes = []
    for _ in range(5):
        started = time.perf_counter()
        for one in batch:
            call(one, lease, stopping)
        passes.append((time.perf_counter() - started) / records)
    return {
        "mode": mode,
        "installed": telemetry.INSTALLED,
        "wrapped": invocation.handler is not handle,
        "seconds_per_record": min(passes),
    }


def run(records: int, rounds: int) -> dict[str, Any]:
    """Every mode ``rounds`` times, interleaved; the median per mode, in microseconds."""
    seen: dict[str, list[float]] = {mode: [] for mode in MODES}
    flags: dict[str, dict[str, bool]] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode, "--records", str(records)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            ).stdout
            result = json.loads(out)
            seen[mode].append(result["seconds_per_record"])
            flags[mode] = {"installed": result["installed"], "wrapped": result["wrapped"]}
    medians = {mode: statistics.median(values) * 1e6 for mode, values in seen.items()}
    return {
        "records": records,
        "rounds": rounds,
        "us_per_record": {mode: round(value, 3) for mode, value in medians.items()},
        "extra_us_per_record": {
            mode: round(medians[mode] - medians["absent"], 3) for mode in MODES[1:]
        },
        "modes": flags,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.records)))
        return
    print(json.dumps(run(args.records, args.rounds), indent=2))


if __name__ == "__main__":
    main()
