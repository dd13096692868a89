"""The names and states of read-ahead files (:mod:`.readahead`): the start position a file's
name holds, whether a claim's worker still lives, and how old a file is (this host's clock
against this host's files only)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

#: How long a claim whose pid is not written yet counts as alive.
UNWRITTEN_CLAIM_SECONDS = 5.0
#: The age of a file that is not there: older than any bound the read-ahead uses.
NEVER_SECONDS = 10 * 24 * 3600.0


def position_of(name: str, prefix: str) -> tuple[int, int] | None:
    """The start position in a file name ``<prefix>-<sequence>-<sub>.<kind>``, if it is one of
    the shard's."""
    if not name.startswith(prefix + "-"):
        return None
    parts = name[len(prefix) + 1 :].split(".", 1)[0].split("-")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def text_of(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def claim_alive(pending: Path) -> bool:
    """Whether a read-ahead claimed by ``pending`` may still come: its file is there and its
    worker lives (a worker killed while reading ahead leaves the file behind)."""
    try:
        pid = int(pending.read_text() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        # Made but its pid not written yet, or never (a worker killed between the two): alive
        # for a moment only. ``os.kill(0, 0)`` would signal this process's group and succeed.
        return age(pending) < UNWRITTEN_CLAIM_SECONDS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def age(path: Path) -> float:
    """Seconds since ``path`` was last written, on this host's clock (very old if it is gone)."""
    now = time.time()
    return now - mtime(path, now - NEVER_SECONDS)


def mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default
