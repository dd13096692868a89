"""The demo's member processes: each one is ``kinesumer consume`` itself, in its own session, its
JSON lines read back over a pipe and tallied by record number."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .constants import APP, REGION, STREAM, TABLE


@dataclass
class Member:
    """One member process, and what became of it."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    reader: threading.Thread | None = None
    state: str = "running"  # running, killed, stopped, or "exited <code>"


@dataclass
class Deliveries:
    """What the members printed, by record number; filled by one reader thread per member."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_number: dict[int, list[str]] = field(default_factory=dict)
    by_member: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def add(self, member: str, number: int) -> None:
        with self.lock:
            self.by_number.setdefault(number, []).append(member)
            self.by_member[member] = self.by_member.get(member, 0) + 1
            self.total += 1

    def read(self, member: str, stream: IO[bytes]) -> None:
        for line in stream:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.add(member, int(json.loads(line)["data"]))


def start_member(name: str, url: str, logdir: Path, deliveries: Deliveries) -> Member:
    """Start member ``name`` (stderr to its log file) and a thread tallying what it prints."""
    command = [
        sys.executable, "-m", "kinesumer.cli", "consume", STREAM,
        "--app", APP, "--table", TABLE, "--region", REGION,
        "--kinesis-endpoint", url, "--dynamodb-endpoint", url,
        "--initial-position", "TRIM_HORIZON", "--client-id", name, "--stop-on-stdin-eof",
    ]  # fmt: skip
    log = logdir / f"{name}.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    member = Member(name, proc, log, time.monotonic())
    assert proc.stdout is not None
    member.reader = threading.Thread(target=deliveries.read, args=(name, proc.stdout), daemon=True)
    member.reader.start()
    return member


def log_tail(member: Member) -> str:
    """The last line a member wrote to its log (why it failed)."""
    with contextlib.suppress(OSError):
        lines = member.log.read_text(errors="replace").strip().splitlines()
        if lines:
            return lines[-1][-300:]
    return f"no output (log {member.log})"
