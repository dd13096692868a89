"""A real PostgreSQL server for the tests: Debian's binaries, a throwaway cluster, loopback only.

:func:`postgres_server` (a context manager: fixtures and benchmarks) runs ``initdb`` into a
fresh directory under the system's temporary directory (the server user must reach it), starts
``postgres`` on a free 127.0.0.1 port (its Unix socket in the same directory, never the
system's), waits until it accepts connections, and yields a :class:`PostgresServer`; on exit
:meth:`~PostgresServer.stop` ends it by its own process id (SIGINT: PostgreSQL's fast shutdown;
SIGKILL if it lingers). PostgreSQL refuses to run as root: as root, the server runs as the
``postgres`` system user.

Missing binaries are an error saying what to install, not a skip: CI runs these tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from support.standins import LOOPBACK, find_free_port

#: Where Debian's postgresql-NN package puts the server binaries (newest first).
_DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"
_STARTUP_TIMEOUT = 30.0
_STOP_GRACE = 10.0
USER = "kinesumer"


class PostgresError(RuntimeError):
    """PostgreSQL could not be found or started; the message says what to do."""


def find_binaries() -> Path:
    """The directory holding ``initdb`` and ``postgres``: ``$KINESUMER_PG_BIN``, then ``PATH``,
    then Debian's versioned directories."""
    candidates = [os.environ.get("KINESUMER_PG_BIN", "")]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    candidates += sorted(glob.glob(_DEBIAN_BINARIES), reverse=True)
    for candidate in filter(None, candidates):
        folder = Path(candidate)
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    raise PostgresError(
        "PostgreSQL server binaries (initdb, postgres) not found: install them "
        "(`apt-get install postgresql`) or point KINESUMER_PG_BIN at their directory"
    )


class PostgresServer:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path

    @property
    def conninfo(self) -> str:
        return f"host={LOOPBACK} port={self.port} user={USER} dbname=postgres connect_timeout=5"

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo, autocommit=True)

    def stop(self) -> None:
        """Fast shutdown by pid, then SIGKILL if it did not end in time; reaped either way."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=_STOP_GRACE)


def _as_server_user() -> dict[str, Any]:
    """Popen arguments that drop root for the ``postgres`` system user (initdb refuses root)."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise PostgresError(
            "running as root, and there is no 'postgres' user to run the server as"
        ) from exc
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def start_postgres(base: Path) -> PostgresServer:
    binaries = find_binaries()
    run_as = _as_server_user()
    data, sockets = base / "data", base / "sock"
    sockets.mkdir(parents=True)
    if run_as:
        for path in (base, sockets):
            os.chown(path, run_as["user"], run_as["group"])
    init = subprocess.run(
        [
            *(str(binaries / "initdb"), "-D", str(data), "-U", USER, "--auth=trust"),
            *("-E", "UTF8", "--no-sync", "--no-instructions"),
        ],
        capture_output=True,
        check=False,
        **run_as,
    )
    if init.returncode != 0:
        raise PostgresError(f"initdb failed: {init.stderr.decode(errors='replace')}")
    port = find_free_port()
    log_path = base / "postgres.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                *(str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets)),
                *("-c", f"listen_addresses={LOOPBACK}", "-c", "fsync=off"),
                *("-c", "synchronous_commit=off", "-c", "full_page_writes=off"),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            **run_as,
        )
    server = PostgresServer(process, port, log_path)
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while True:
        try:
            server.connect().close()
            return server
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise PostgresError(
                    f"postgres did not start: {log_path.read_text(errors='replace')}"
                ) from None
            time.sleep(0.05)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A fresh cluster, started; stopped and deleted on exit."""
    base = Path(tempfile.mkdtemp(prefix="kinesumer-pg-"))
    try:
        server = start_postgres(base)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
