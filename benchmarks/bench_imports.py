"""CPU of starting kinesumer's common entry points, this tree against a baseline tree.

    .venv/bin/python benchmarks/bench_imports.py --baseline /tmp/base [--runs 7]

where ``/tmp/base`` holds another version's ``kinesumer/`` package (e.g. ``git archive main
kinesumer | tar -x -C /tmp/base``). Each command runs in a fresh interpreter with ``PYTHONPATH``
set to one tree, the two trees alternating, ``--runs`` times; the table shows the median CPU
seconds (user + system, from ``RUSAGE_CHILDREN``) and their ratio. ``python -c pass`` is the
interpreter's own start, for reference. Without ``--baseline`` only this tree is measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What a process of each kind imports first: a user's script, pytest (the pytest11 plugin),
#: a Spark read task, the command line.
COMMANDS = {
    "import kinesumer": ["-c", "import kinesumer"],
    "import kinesumer.testing.plugin": ["-c", "import kinesumer.testing.plugin"],
    "import pytest (reference)": ["-c", "import pytest"],
    "import kinesumer.spark.source.executor": ["-c", "import kinesumer.spark.source.executor"],
    "kinesumer --help": ["-m", "kinesumer.cli", "--help"],
    "python -c pass": ["-c", "pass"],
}


def cpu_seconds(arguments: list[str], tree: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, *arguments],
        env=env,
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a tree holding another kinesumer/")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    if args.baseline:
        trees = {"baseline": args.baseline, **trees}
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {args.runs} runs")
    print(f"{'command':42}" + "".join(f"{name + ' s':>14}" for name in trees) + "   ratio")
    for name, arguments in COMMANDS.items():
        seconds: dict[str, list[float]] = {tree: [] for tree in trees}
        for _ in range(args.runs):
            for tree, path in trees.items():
                seconds[tree].append(cpu_seconds(arguments, path))
        medians = [statistics.median(values) for values in seconds.values()]
        ratio = f"{medians[-1] / medians[0]:8.2f}" if len(medians) == 2 else ""
        print(f"{name:42}" + "".join(f"{m:14.3f}" for m in medians) + ratio)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
