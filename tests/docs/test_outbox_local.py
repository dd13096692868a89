"""The outbox page's block that starts a throwaway PostgreSQL, run as written (bash, the
machine's Debian server binaries; as root it runs the server as ``postgres``), then a record
published through the table it created. The server is stopped by its own process id."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.standins import find_free_port, repo_root
from support.wait import wait_until

from kinesumer.outbox import PostgresOutbox

BLOCK = re.compile(r"<!-- local-postgres -->\n```bash\n(.*?)```", re.S)


def page_block() -> str:
    (block,) = BLOCK.findall((repo_root() / "docs" / "producing" / "outbox.md").read_text())
    return str(block)


@pytest.fixture
def started() -> Iterator[dict[str, str]]:
    """What the block leaves: its variables (PG_DIR, the conninfo); the server stopped after."""
    env = {**os.environ, "PG_PORT": str(find_free_port())}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = page_block() + '\necho "PG_DIR=$PG_DIR"\necho "CONNINFO=$KINESUMER_OUTBOX_CONNINFO"\n'
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    shown = dict(
        line.split("=", 1)
        for line in done.stdout.splitlines()
        if line.startswith(("PG_DIR=", "CONNINFO="))
    )
    pid_file = Path(shown["PG_DIR"]) / "data" / "postmaster.pid" if "PG_DIR" in shown else None
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield shown
    finally:
        if pid_file is not None and pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            wait_until(lambda: not pid_file.exists(), 60, "the local PostgreSQL to stop")


def test_the_pages_block_starts_a_postgresql_the_outbox_works_on(started: dict[str, str]) -> None:
    conninfo = started["CONNINFO"]
    assert "host=127.0.0.1" in conninfo
    outbox = PostgresOutbox(conninfo)  # the block's `kinesumer outbox create-table` made it
    with psycopg.connect(conninfo) as conn, conn.transaction():
        outbox.publish(conn, "orders", b"first", partition_key="k")
    assert outbox.stats().pending == 1
