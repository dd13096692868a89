"""``kinesumer lag --serve``: the group's lag as a small service, for scalers, Prometheus and
people.

One thread probes the group every ``--interval`` seconds (:class:`ProbeLoop`, default
:data:`DEFAULT_INTERVAL`) and posts each result on a :class:`~.lag_board.LagBoard`; an HTTP
server answers every request from the board, never from Kinesis, so the stream's reads are one
probe per interval however many scrapers, scalers and browsers ask. Each probe reads, per shard
not finished, 1 GetShardIterator and usually 1 GetRecords, out of the 5 GetRecords a second per
shard that every reader of the stream shares: every 10 s that is about 6 GetRecords per shard a
minute, 2% of the allowance, and a figure at most 10 s old is fresh enough to scale on (KEDA
polls every 30 s by default).

Paths (:class:`LagHandler`):

- ``/metrics``: Prometheus text (:mod:`.lag_metrics`, a registry of its own);
- ``/lag.json``: ``kinesumer lag --json``'s document plus ``max_seconds_behind``, ``stale``
  and the probe's time: KEDA's ``metrics-api`` scaler reads ``max_millis_behind`` or
  ``max_seconds_behind`` there (503 before the first good probe);
- ``/status.json``: members, shards and the history the status page draws;
- ``/``: the status page (``lag_page.html``, one file with inline CSS and script, no external
  asset), with a strict Content-Security-Policy whose nonce is new for every response;
- ``/healthz``: 200 while the server runs (a liveness probe: a failing lag probe is not a
  reason to restart the server that reports it).

A failed probe never stops the server: the last good figures stay, marked stale. SIGTERM and
SIGINT stop it cleanly (the server closes, the probe in flight is cancelled); a SIGINT ignored
at start (a background job, ``nohup``) stays ignored, as everywhere in kinesumer
(:mod:`kinesumer.signals`). It binds ``127.0.0.1`` by default: the server has no
authentication, and its pages name the group's streams, shards and hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..admin import live_members, probe_group_lag, read_controls
from ..config import Config
from ..core.controls import controlled_leader
from ..core.lag import GroupLag
from ..kinesis.tool_transport import open_tool_transport
from ..kinesis.transport import KinesisTransport
from ..models import ClientInfo
from ..signals import stop_on_signals
from ..statestore.dynamodb.store import DynamoDBStateStore
from ..statestore.group_view import open_table
from .errors import EXIT_OK, EXIT_USAGE, CliError
from .lag_board import LagBoard, MemberRow, Snapshot
from .lag_cloudwatch import CloudWatchPublisher
from .lag_metrics import CONTENT_TYPE, lag_registry, render_metrics
from .options import group_config
from .streams import Names, check_reachable, lag_as_given, state_names

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_INTERVAL",
    "DEFAULT_PORT",
    "HEALTH_PATH",
    "LAG_PATH",
    "METRICS_PATH",
    "STATUS_PATH",
    "GroupProbe",
    "LagHandler",
    "LagServer",
    "Probe",
    "ProbeLoop",
    "group_members",
    "page_html",
    "serve_command",
]

#: Where it listens by default: this machine only (the server has no authentication).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8460

#: Seconds between two probes: a figure at most this old, for about 6 GetRecords per shard a
#: minute (2% of the 5 a second per shard every reader of the stream shares).
DEFAULT_INTERVAL = 10.0

#: A probe longer than this (seconds, or three intervals if more) is abandoned as failed: a
#: call hanging on the network must not freeze the figures' staleness at "fresh".
PROBE_TIMEOUT = 60.0

#: Seconds a connection may sit without sending (an unfinished request, an idle kept-alive
#: connection) before the server closes it: each connection holds a thread, and without a
#: bound, clients that connect and send nothing would hold them all.
REQUEST_TIMEOUT = 30.0

#: The paths served (the examples and the docs name them; a test checks they agree).
METRICS_PATH = "/metrics"
LAG_PATH = "/lag.json"
STATUS_PATH = "/status.json"
HEALTH_PATH = "/healthz"

log = logging.getLogger("kinesumer.cli.lag_serve")


class Probe(Protocol):
    """What :class:`ProbeLoop` runs: one probe per call, and ``aclose`` when the loop ends."""

    def __call__(self) -> Awaitable[Snapshot]: ...

    async def aclose(self) -> None: ...


def serve_command(args: argparse.Namespace) -> int:
    """``kinesumer lag --serve``: probe every ``--interval`` seconds and serve until SIGTERM or
    Ctrl-C."""
    config = group_config(args)
    # What would fail every probe alike (a stream given twice, an account with no access or a
    # role refused) ends the command now with its message, as `lag` does, not a server
    # posting one failed probe after another.
    asyncio.run(check_reachable(config, args.stream or ()))
    board = LagBoard(config.app, config.dynamodb_table, interval=args.interval)
    registry = lag_registry(board)  # fails here, before binding, without prometheus_client
    listeners: list[Callable[[Snapshot], None]] = []
    namespace = getattr(args, "cloudwatch_namespace", None)
    endpoint = getattr(args, "cloudwatch_endpoint", None)
    if namespace is not None:
        publisher = CloudWatchPublisher(namespace, config, endpoint=endpoint)
        registry.register(publisher)
        listeners.append(publisher)
    elif endpoint is not None:
        raise CliError("--cloudwatch-endpoint only with --cloudwatch-namespace", EXIT_USAGE)
    server = LagServer((args.host, args.port), board, registry)
    loop = ProbeLoop(
        board, GroupProbe(config, args.stream or ()), args.interval, listeners=listeners
    )
    stop = threading.Event()
    host, port = str(server.server_address[0]), int(server.server_address[1])
    where = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    with stop_on_signals(lambda name: stop.set()):
        serving = threading.Thread(target=server.serve_forever, name="lag-http", daemon=True)
        serving.start()
        loop.start()
        print(f"serving the lag of app {config.app} on {where}/ (metrics at /metrics)", flush=True)
        try:
            while not stop.wait(0.5):  # wakes for signals too (they run in this thread)
                pass
        finally:
            server.shutdown()
            server.server_close()
            loop.stop()
    print("stopped", flush=True)
    return EXIT_OK


# -- the probe ---------------------------------------------------------------------------------
class GroupProbe:
    """One probe of the group per call: its lag (:func:`~kinesumer.admin.probe_group_lag`)
    and its members (:func:`group_members`). The state table and a Kinesis client are opened
    at the first probe and kept (a probe every few seconds should not pay for new clients
    each time); a failed probe closes them, and the next one opens them afresh."""

    def __init__(self, config: Config, streams: Sequence[str] = ()) -> None:
        self._config = config
        self._streams = tuple(streams)
        self._stack: contextlib.AsyncExitStack | None = None
        self._open: tuple[DynamoDBStateStore, KinesisTransport] | None = None
        self._names: Names | None = None

    async def __call__(self) -> Snapshot:
        began = time.time()
        try:
            store, kinesis = await self._clients()
            if self._names is None:  # the state keys, shown as given (see .streams)
                self._names = await state_names(self._config, self._streams)
            figure = await probe_group_lag(
                self._config, self._names.keys_list(), kinesis=kinesis, state=store
            )
            figure = lag_as_given(figure, self._names)
            members = await group_members(self._config, store, figure)
        except BaseException:
            await self.aclose()
            raise
        return Snapshot(figure, members, int(began * 1000), time.time() - began)

    async def _clients(self) -> tuple[DynamoDBStateStore, KinesisTransport]:
        if self._open is None:
            stack = contextlib.AsyncExitStack()
            try:
                _, store = await stack.enter_async_context(open_table(self._config))
                kinesis = await open_tool_transport(stack, self._config)
            except BaseException:
                await stack.aclose()
                raise
            self._stack, self._open = stack, (store, kinesis)
        return self._open

    async def aclose(self) -> None:
        stack, self._stack, self._open = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()


async def group_members(
    config: Config, store: DynamoDBStateStore, figure: GroupLag
) -> tuple[MemberRow, ...]:
    """The registered members as the lag probe judges them (:func:`live_members`: live when
    their heartbeat stamp is within the group's published ``client_timeout``, else
    ``config.client_timeout``, of this host's clock and the leader's view did not judge them
    dead with that heartbeat); the leader the lowest live id not stepped down. Each with the
    shards ``figure`` found it owning."""
    clients = await store.list_clients()
    live = await live_members(store, config.client_timeout, clients)
    now_ms = int(time.time() * 1000)
    controls = await asyncio.to_thread(read_controls, config)
    leader = controlled_leader(sorted(live), controls, now_ms)
    owned: dict[str, list[str]] = {}
    for shard in figure.shards:
        if shard.owner is not None:
            owned.setdefault(shard.owner, []).append(f"{shard.stream}/{shard.shard_id}")

    def row(c: ClientInfo) -> MemberRow:
        return MemberRow(
            client_id=c.client_id,
            live=c.client_id in live,
            leader=c.client_id == leader,
            host=c.host,
            pid=c.pid,
            last_update_ms=c.last_update_ms,
            shards=tuple(owned.get(c.client_id, ())),
        )

    ordered = sorted(clients, key=lambda c: (c.client_id not in live, c.client_id))
    return tuple(row(c) for c in ordered)


class ProbeLoop:
    """Runs ``probe`` every ``interval`` seconds (start to start; at once again after a probe
    that took longer) in a thread of its own with its own event loop, and posts each result on
    ``board``. A failure (any exception, or a probe past :data:`PROBE_TIMEOUT`) is posted as
    one line and the loop goes on. :meth:`stop` cancels the probe in flight.

    ``listeners``: called with each good probe's :class:`~.lag_board.Snapshot` after the board
    has it, in a worker thread, one after the other (the hook behind ``--cloudwatch-namespace``,
    :class:`~.lag_cloudwatch.CloudWatchPublisher`). One that raises is logged, never stops the
    loop; a slow one delays the next probe, so keep them bounded."""

    def __init__(
        self,
        board: LagBoard,
        probe: Probe,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
        listeners: Sequence[Callable[[Snapshot], None]] = (),
    ) -> None:
        self.board = board
        self.interval = interval
        self.listeners = tuple(listeners)
        self.timeout = max(PROBE_TIMEOUT, 3 * interval)
        self._probe = probe
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="lag-probe", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the probe in flight, close its clients, and wait for the thread."""
        self._stopping.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._ready.set()
        try:
            while not self._stopping.is_set():
                began = time.monotonic()
                await self.probe_once()
                pause = max(self.interval - (time.monotonic() - began), 0.0)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
        finally:
            await self._probe.aclose()

    async def probe_once(self) -> None:
        """One probe, posted on the board; returns early, posting nothing, when stopped. Runs
        on the probe thread's loop, or on a caller's own (a test's) outside :meth:`start`."""
        if self._wake is None:
            self._wake = asyncio.Event()
        at_ms = int(self._clock() * 1000)
        task = asyncio.ensure_future(asyncio.wait_for(self._probe(), self.timeout))
        woken = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # stopped
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return
        woken.cancel()
        try:
            snapshot = task.result()
        except asyncio.TimeoutError:
            self._failed(f"the probe took more than {self.timeout:g} s", at_ms)
        except Exception as exc:  # every failure is posted; the loop goes on
            self._failed(f"{type(exc).__name__}: {exc}", at_ms)
        else:
            self.board.succeeded(snapshot)
            for listener in self.listeners:
                try:
                    await asyncio.to_thread(listener, snapshot)
                except Exception:  # a listener's failure is its own: the loop goes on
                    log.exception("a lag listener failed on a probe")

    def _failed(self, error: str, at_ms: int) -> None:
        line = " ".join(error.split())[:500]
        log.warning("lag probe failed (serving the last good figures, marked stale): %s", line)
        self.board.failed(line, at_ms)


# -- the HTTP side -----------------------------------------------------------------------------
def page_html() -> str:
    """The status page's template (``lag_page.html`` of this package)."""
    return resources.files(__package__).joinpath("lag_page.html").read_text(encoding="utf-8")


class LagServer(ThreadingHTTPServer):
    """The HTTP server: a thread per request, every answer from ``board`` (and ``registry``
    for ``/metrics``). ``clock``: Unix seconds (staleness, ages)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        board: LagBoard,
        registry: Any,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.board = board
        self.registry = registry
        self.clock = clock
        self.page = page_html()
        self.loopback = _is_loopback(address[0])
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, LagHandler)


class LagHandler(BaseHTTPRequestHandler):
    """The paths the module docstring lists; GET and HEAD only (others: 501, from the
    standard library). Every answer says ``nosniff`` and ``no-store``.

    Bound to a loopback address, it answers only requests whose ``Host`` is a loopback name or
    address: a web page a browser on this machine visits cannot read the figures through a
    DNS name rebound to 127.0.0.1."""

    server: LagServer
    server_version = "kinesumer-lag"
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        if self.server.loopback and not _loopback_host(self.headers.get("Host", "")):
            self._send(421, "text/plain; charset=utf-8", b"misdirected request\n", send_body)
            return
        path = urlsplit(self.path).path
        now_ms = int(self.server.clock() * 1000)
        board = self.server.board
        if path == METRICS_PATH:
            self._send(200, CONTENT_TYPE, render_metrics(self.server.registry), send_body)
        elif path == LAG_PATH:
            document = board.lag_document(now_ms)
            if document is None:  # a scaler must not read "no figure" as "no lag"
                missing = {"error": "no good probe yet", **board.freshness(now_ms)}
                self._json(503, missing, send_body)
            else:
                self._json(200, document, send_body)
        elif path == STATUS_PATH:
            self._json(200, board.status_document(now_ms), send_body)
        elif path in ("/", "/index.html"):
            nonce = secrets.token_urlsafe(18)
            body = self.server.page.replace("{{NONCE}}", nonce).encode()
            policy = (
                "default-src 'none'; "
                f"script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
                "frame-ancestors 'none'"
            )
            extra = {
                "Content-Security-Policy": policy,
                "Referrer-Policy": "no-referrer",
                "X-Frame-Options": "DENY",
            }
            self._send(200, "text/html; charset=utf-8", body, send_body, extra)
        elif path == HEALTH_PATH:
            self._send(200, "text/plain; charset=utf-8", b"ok\n", send_body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n", send_body)

    def _json(self, code: int, document: dict[str, Any], send_body: bool) -> None:
        body = json.dumps(document, separators=(",", ":")).encode()
        self._send(code, "application/json", body, send_body)

    def _send(
        self,
        code: int,
        content_type: str,
        body: bytes,
        send_body: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are logged at DEBUG (``--debug``), not on stderr each scrape."""
        log.debug("%s %s", self.address_string(), format % args)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback_host(header: str) -> bool:
    """A ``Host`` header naming this machine: ``localhost`` or a loopback address, any port."""
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    else:
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return _is_loopback(host)
