"""The programs in examples/ run as a user runs them (``python examples/NAME.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

from support.cli import Running

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, environ: dict[str, str], *args: str, timeout: float = 60) -> Running:
    """Run ``examples/<name>`` to its end; fails the test on a non-zero exit."""
    proc = Running([sys.executable, str(EXAMPLES / name), *args], env=environ)
    try:
        code = proc.wait(timeout)
    finally:
        proc.stop()
    assert code == 0, f"{name} exited with {code}:\n{proc.output}\n{proc.errors}"
    return proc
