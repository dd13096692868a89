"""Launchers for the local AWS stand-ins the test suite talks to: kinesalite, dynalite and moto.

Why real servers rather than in-process mocks: the library is async (aioboto3) and multi-process,
and moto's ``mock_aws`` only patches botocore in the current process. kinesalite and dynalite are
the only stand-ins that reproduce some AWS behaviour the library depends on (SHARD_END after a
split, 56-digit sequence numbers); moto in server mode covers the rest (STS, consumers, TTL ...).
See ``/work/shared/STANDINS.md`` for who does what.

Rules every launcher follows, so that a test run never leaks a server or reaches past the machine:

* Every server listens on 127.0.0.1 only, on a port chosen for it at start-up.
* Every node server is a subprocess stopped by *its own* process id (terminate, wait up to 5 s,
  then kill), never by name; an ``atexit`` hook stops whatever a crashed session left behind, and
  the node preload script exits the server if its parent process goes away.
* Start-up waits for readiness by bounded polling; a server that never comes up raises
  :class:`StandInError` with its stderr, instead of hanging the test session.
* A missing ``node_modules`` is an error telling the developer to run ``npm ci``, not a skip: CI
  must run these tests.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any, TypeVar

__all__ = [
    "LOOPBACK",
    "KinesisLocalStandIn",
    "MotoStandIn",
    "NodeStandIn",
    "StandIn",
    "StandInError",
    "find_free_port",
    "repo_root",
    "start_dynalite",
    "start_kinesalite",
    "start_kinesis_local",
    "start_moto",
    "wait_for_port",
]

LOOPBACK = "127.0.0.1"
"""The only address any stand-in may listen on."""

STOP_GRACE_SECONDS = 5.0
"""How long :meth:`NodeStandIn.stop` waits after SIGTERM before it sends SIGKILL."""

DEFAULT_STARTUP_TIMEOUT = 15.0
"""Upper bound for a server to start listening; they normally take about 0.15 s."""

_PORT_ATTEMPTS = 3
"""How often a launcher retries when the free port it picked was taken before the server bound."""

_LOOPBACK_PRELOAD = Path(__file__).resolve().parent / "loopback.js"

_log = logging.getLogger(__name__)


_S = TypeVar("_S", bound="StandIn")


class StandInError(RuntimeError):
    """A stand-in could not be found, started or stopped; the message says what to do."""


def repo_root() -> Path:
    """The repository root, where ``package.json`` and ``node_modules`` live."""
    return Path(__file__).resolve().parents[2]


def find_free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now.

    Why not port 0: the kinesalite and dynalite CLIs treat ``--port 0`` as "unset" and fall back
    to 4567. There is a small window in which another process may take the port; the node
    launchers detect that (the server exits with EADDRINUSE) and retry with a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Poll until ``host:port`` accepts a TCP connection; False if ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if _port_accepts(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


class StandIn(abc.ABC):
    """A running stand-in server: where it listens, which process serves it, how to stop it."""

    def __init__(self, name: str, host: str, port: int) -> None:
        self.name = name
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """Endpoint URL for boto3/aioboto3 clients, e.g. ``http://127.0.0.1:45123``."""
        return f"http://{self.host}:{self.port}"

    @property
    @abc.abstractmethod
    def pid(self) -> int:
        """Id of the process that serves the stand-in."""

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """Whether the server is still up (not stopped, process not exited)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the server; idempotent."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.url} pid={self.pid}>"


class NodeStandIn(StandIn):
    """A node-based stand-in (kinesalite or dynalite) running as a subprocess of this process."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        process: subprocess.Popen[bytes],
        stdout_path: Path,
        stderr_path: Path,
    ) -> None:
        super().__init__(name, host, port)
        self.process = process
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self._stopped = False

    @property
    def pid(self) -> int:
        """Process id of the node server; :meth:`stop` signals exactly this process."""
        return self.process.pid

    @property
    def running(self) -> bool:
        return not self._stopped and self.process.poll() is None

    def stdout_text(self) -> str:
        """What the server wrote to stdout so far (for error messages)."""
        return _read_text(self.stdout_path)

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far (for error messages)."""
        return _read_text(self.stderr_path)

    def stop(self) -> None:
        """Terminate the process by its pid, wait up to 5 s, then kill it; reap it either way."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    _log.warning(
                        "%r ignored SIGTERM for %.0f s; killing it", self, STOP_GRACE_SECONDS
                    )
                    self.process.kill()
                    self.process.wait(timeout=STOP_GRACE_SECONDS)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            for path in (self.stdout_path, self.stderr_path):
                with contextlib.suppress(OSError):
                    path.unlink()


# Node servers still running, so that the atexit hook can stop them if a session dies before its
# fixtures' finalizers run (e.g. an internal pytest error). Guarded by _LIVE_LOCK.
_LIVE: set[NodeStandIn] = set()
_LIVE_LOCK = threading.Lock()


class MotoStandIn(StandIn):
    """moto in server mode, served by a thread of *this* process (``pid`` is ``os.getpid()``).

    moto's server runs in-process (``ThreadedMotoServer``), so there is no child process to kill;
    :meth:`stop` shuts the HTTP server down and closes its listening socket.
    """

    def __init__(self, host: str, port: int, server: Any) -> None:
        # server is a moto.server.ThreadedMotoServer; moto ships no type information.
        super().__init__("moto", host, port)
        self.server = server
        self._stopped = False

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def running(self) -> bool:
        return not self._stopped

    def reset(self) -> None:
        """Drop all state in every moto backend (``POST /moto-api/reset``)."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise StandInError(f"moto reset answered HTTP {response.status}")

    def stop(self) -> None:
        """Shut the server thread down and release its port; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.server.stop()
        # ThreadedMotoServer.stop() leaves the listening socket open (it never calls
        # server_close), so later connections would hang in the backlog instead of failing.
        inner = getattr(self.server, "_server", None)
        if inner is not None:
            inner.server_close()


def _read_text(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:]


def _node_package_cli(root: Path, package: str) -> Path:
    cli = root / "node_modules" / package / "cli.js"
    if not cli.is_file():
        raise StandInError(
            f"{package} is not installed: {cli} is missing. Run `npm ci` in {root} "
            "(package.json pins kinesalite and dynalite) before running the tests."
        )
    return cli


def _node_executable() -> str:
    node = shutil.which("node")
    if node is None:
        raise StandInError(
            "`node` is not on PATH; kinesalite and dynalite need Node.js (20 or later). "
            "Install Node.js, then run `npm ci` in the repository root."
        )
    return node


def _start_node_server(
    name: str,
    package: str,
    args: list[str],
    port: int | None,
    root: Path | None,
    startup_timeout: float,
) -> NodeStandIn:
    """Start ``node -r tests/support/loopback.js node_modules/<package>/cli.js --port P <args>``
    and wait.

    Readiness means: the process is alive, it printed its "listening" line (so it, and not some
    other process, owns the port) and the port accepts connections.
    """
    root = root or repo_root()
    cli = _node_package_cli(root, package)
    node = _node_executable()
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    last_error: StandInError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else find_free_port()
        try:
            return _launch_node(name, node, cli, chosen, args, root, startup_timeout)
        except _PortTaken as exc:
            last_error = StandInError(str(exc))
            continue
    assert last_error is not None
    raise last_error


class _PortTaken(StandInError):
    """The server exited with EADDRINUSE: someone took the port between pick and bind."""


def _launch_node(
    name: str,
    node: str,
    cli: Path,
    port: int,
    args: list[str],
    root: Path,
    startup_timeout: float,
) -> NodeStandIn:
    fd_out, out_name = tempfile.mkstemp(prefix=f"{name}-", suffix=".out")
    fd_err, err_name = tempfile.mkstemp(prefix=f"{name}-", suffix=".err")
    # Files, not pipes: nobody reads the server's output during the session, and a full pipe
    # would block the server.
    out: IO[bytes]
    err: IO[bytes]
    with os.fdopen(fd_out, "wb") as out, os.fdopen(fd_err, "wb") as err:
        command = [node, "-r", str(_LOOPBACK_PRELOAD), str(cli), "--port", str(port), *args]
        process = subprocess.Popen(
            command,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    standin = NodeStandIn(
        name=name,
        host=LOOPBACK,
        port=port,
        process=process,
        stdout_path=Path(out_name),
        stderr_path=Path(err_name),
    )
    with _LIVE_LOCK:
        _LIVE.add(standin)
    try:
        _wait_node_ready(standin, startup_timeout)
    except BaseException:
        standin.stop()
        raise
    return standin


def _wait_node_ready(standin: NodeStandIn, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code = standin.process.poll()
        if code is not None:
            stderr = standin.stderr_text()
            message = (
                f"{standin.name} exited with code {code} before listening on "
                f"{standin.host}:{standin.port}.\n--- stderr ---\n{stderr}"
            )
            if "EADDRINUSE" in stderr:
                raise _PortTaken(message)
            raise StandInError(message)
        said_listening = "listening at" in _read_text(standin.stdout_path).lower()
        if said_listening and _port_accepts(standin.host, standin.port):
            return
        if time.monotonic() >= deadline:
            raise StandInError(
                f"{standin.name} (pid {standin.pid}) did not accept connections on "
                f"{standin.host}:{standin.port} within {timeout:.1f} s.\n"
                f"--- stdout ---\n{_read_text(standin.stdout_path)}\n"
                f"--- stderr ---\n{standin.stderr_text()}"
            )
        time.sleep(0.02)


def start_kinesalite(
    *,
    port: int | None = None,
    root: Path | None = None,
    shard_limit: int = 1000,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
) -> NodeStandIn:
    """Start an in-memory kinesalite on 127.0.0.1 with no CREATING/DELETING/UPDATING delays.

    kinesalite's CLI cannot be told a host, so ``tests/support/loopback.js`` is preloaded to turn
    its wildcard listen into a loopback one. ``shard_limit`` raises kinesalite's default of 10 open
    shards per account (CreateStream fails with LimitExceededException beyond it), which a
    session-scoped server shared by many tests would soon reach; pass a small value to test that
    error."""
    return _start_node_server(
        "kinesalite",
        "kinesalite",
        [
            "--createStreamMs",
            "0",
            "--deleteStreamMs",
            "0",
            "--updateStreamMs",
            "0",
            "--shardLimit",
            str(shard_limit),
        ],
        port,
        root,
        startup_timeout,
    )


def start_dynalite(
    *,
    port: int | None = None,
    root: Path | None = None,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
) -> NodeStandIn:
    """Start an in-memory dynalite on 127.0.0.1 with no CREATING/DELETING/UPDATING delays."""
    return _start_node_server(
        "dynalite",
        "dynalite",
        [
            "--host",
            LOOPBACK,
            "--createTableMs",
            "0",
            "--deleteTableMs",
            "0",
            "--updateTableMs",
            "0",
        ],
        port,
        root,
        startup_timeout,
    )


class KinesisLocalStandIn(NodeStandIn):
    """kinesis-local (kinesis-mock for Node): ``url`` is its plain port, which speaks HTTP/1.1
    and HTTP/2 with prior knowledge (h2c); ``tls_url`` its TLS port (self-signed, ALPN h2)."""

    tls_port: int = 0

    @property
    def tls_url(self) -> str:
        return f"https://{self.host}:{self.tls_port}"

    def stop(self) -> None:
        """Kill it by its pid: it ignores SIGTERM (the grace period would only cost 5 s)."""
        if self.process.poll() is None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_GRACE_SECONDS)
        super().stop()


def start_kinesis_local(
    *, root: Path | None = None, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
) -> KinesisLocalStandIn:
    """Start kinesis-local on two free loopback ports with no CREATING/DELETING delays.

    Its ``main.js`` reads its ports and durations from the environment, binds every interface
    (``tests/support/loopback.js`` rewrites that, as for kinesalite), exits without the
    ``server.json`` certificate in its working folder (its package ships one: run it there), and
    prints nothing unless ``LOG_LEVEL`` is set (INFO prints its "Starting ... Service" lines). Three
    of its duration variables are read swapped: all are set to the same zero."""
    root = root or repo_root()
    package = root / "node_modules" / "kinesis-local"
    if not (package / "main.js").is_file():
        raise StandInError(f"{package / 'main.js'} is missing: run `npm ci` in {root}")
    node = _node_executable()
    zero = "0ms"
    durations = ["CREATE_STREAM", "DELETE_STREAM", "REGISTER_STREAM_CONSUMER"]
    durations += ["DEREGISTER_STREAM_CONSUMER", "START_STREAM_ENCRYPTION"]
    durations += ["STOP_STREAM_ENCRYPTION", "MERGE_SHARDS", "SPLIT_SHARD"]
    durations += ["UPDATE_SHARD_COUNT", "UPDATE_STREAM_MODE"]
    plain, tls = find_free_port(), find_free_port()
    env = {**os.environ, "LOG_LEVEL": "INFO", "AWS_REGION": "us-east-1"}
    env.update({f"{name}_DURATION": zero for name in durations})
    env.update(KINESIS_MOCK_PLAIN_PORT=str(plain), KINESIS_MOCK_TLS_PORT=str(tls))
    # One server serves a whole session, every test with streams of its own, and kinesis-mock
    # refuses CreateStream past 50 open shards (its default account limit): raise it, as an AWS
    # account's is raised, so a test's streams never depend on how many came before it.
    env.update(SHARD_LIMIT="100000")
    fd_out, out_name = tempfile.mkstemp(prefix="kinesis-local-", suffix=".out")
    fd_err, err_name = tempfile.mkstemp(prefix="kinesis-local-", suffix=".err")
    with os.fdopen(fd_out, "wb") as out, os.fdopen(fd_err, "wb") as err:
        process = subprocess.Popen(
            [node, "-r", str(_LOOPBACK_PRELOAD), "main.js"],
            cwd=package,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    standin = KinesisLocalStandIn(
        "kinesis-local", LOOPBACK, plain, process, Path(out_name), Path(err_name)
    )
    standin.tls_port = tls
    with _LIVE_LOCK:
        _LIVE.add(standin)
    try:
        deadline = time.monotonic() + startup_timeout
        while not (_port_accepts(LOOPBACK, plain) and _port_accepts(LOOPBACK, tls)):
            if process.poll() is not None or time.monotonic() >= deadline:
                raise StandInError(
                    f"kinesis-local did not listen on {LOOPBACK}:{plain}/{tls} (exit code "
                    f"{process.poll()}).\n--- stdout ---\n{standin.stdout_text()}\n"
                    f"--- stderr ---\n{standin.stderr_text()}"
                )
            time.sleep(0.05)
    except BaseException:
        standin.stop()
        raise
    return standin


def start_moto(*, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT) -> MotoStandIn:
    """Start moto's server (all services) in a thread of this process, on a free loopback port.

    Port 0 lets the kernel pick the port at bind time, so there is no pick-then-bind race.
    ``ThreadedMotoServer.start()`` waits forever if binding fails, so it is called from a helper
    thread and waited for with a bound.
    """
    from moto.server import ThreadedMotoServer

    from kinesumer.aws.moto_dynamodb import serialize_dynamodb_requests

    # werkzeug logs every request at INFO and ignores verbose=False.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # One DynamoDB request at a time: moto's conditional writes are atomic only so, as
    # DynamoDB's are (concurrent claims of one shard had several winners on a busy machine).
    serialize_dynamodb_requests()
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
    starter = threading.Thread(target=server.start, name="moto-starter", daemon=True)
    starter.start()
    starter.join(timeout=startup_timeout)
    if starter.is_alive():
        raise StandInError(
            f"moto's ThreadedMotoServer did not bind {LOOPBACK} within {startup_timeout:.1f} s "
            "(see the logged exception from its server thread)."
        )
    host, port = server.get_host_and_port()
    standin = MotoStandIn(host, port, server)
    if not wait_for_port(host, port, startup_timeout):
        standin.stop()
        raise StandInError(f"moto server on {host}:{port} never accepted connections")
    return standin


@atexit.register
def _stop_leftovers() -> None:
    """Last resort: stop node servers whose fixtures never got to finalize."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for standin in leftovers:
        with contextlib.suppress(Exception):
            standin.stop()
