"""A fault-injecting HTTP proxy for tests: put it between a boto3/aioboto3 client and a stand-in.

Why: no stand-in ever throttles, fails with a 5xx, drops a connection or hangs (see
``/work/shared/STANDINS.md``), yet the library's retry, back-off and failover paths exist for
exactly those events. botocore's Stubber cannot help with aioboto3 clients or with other
processes, so faults are injected on the wire, where every client (sync, async, child process)
meets them the same way it would meet AWS.

Usage::

    proxy = FaultProxy(kinesalite.url)
    client = boto3.client("kinesis", endpoint_url=proxy.url, ...)
    rule = proxy.add_rule(Fault.throttle(), service="kinesis", operation="GetRecords", count=2)
    ...
    rule.remove()
    proxy.stats()[OpKey("kinesis", "GetRecords")].faults[FaultKind.THROTTLE]
    proxy.stop()

The proxy identifies each request's operation from its ``X-Amz-Target`` header
(``Kinesis_20131202.GetRecords`` -> ``kinesis`` / ``GetRecords``), or for query-protocol calls
such as STS from the ``Action`` parameter and the SigV4 credential scope. Requests are forwarded
byte for byte, ``Host`` header included, so a SigV4 signature stays valid upstream.

Error bodies copy the shapes AWS sends, so botocore parses them into a ``ClientError`` with the
expected ``Error.Code`` (and, for DynamoDB, the modeled exception class): JSON protocol errors are
``{"__type": ..., "message": ...}`` (DynamoDB's ``__type`` carries the ``com.amazonaws...#``
prefix, which botocore strips), query protocol errors are an XML ``ErrorResponse``.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import json
import logging
import random
import select
import socket
import socketserver
import struct
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple, cast
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "Fault",
    "FaultKind",
    "FaultProxy",
    "OpKey",
    "OpStats",
    "Rule",
    "identify_operation",
]

_log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that describe one connection, not the message (RFC 9110 7.6.1); never forwarded."""

_POLL_SECONDS = 0.05
"""How often a held request (blackhole, delay) looks for rule removal, client close or stop."""


class FaultKind(enum.Enum):
    """What the proxy does to a request instead of (or before) forwarding it."""

    THROTTLE = "throttle"
    """400 ``ProvisionedThroughputExceededException`` (Kinesis and DynamoDB)."""
    DYNAMODB_THROTTLING = "dynamodb_throttling"
    """400 ``ThrottlingException``: DynamoDB's control-plane / on-demand throttle."""
    HTTP_500 = "http_500"
    """500 ``InternalFailure`` (Kinesis) / ``InternalServerError`` (DynamoDB)."""
    HTTP_503 = "http_503"
    """503 ``ServiceUnavailable``."""
    RESET = "reset"
    """Close the client connection with a TCP RST and no response."""
    DELAY = "delay"
    """Wait ``Fault.seconds``, then forward as usual."""
    BLACKHOLE = "blackhole"
    """Never answer; close once the client gives up, the rule is removed or the proxy stops."""
    EXPIRED_ITERATOR = "expired_iterator"
    """400 ``ExpiredIteratorException`` (Kinesis GetRecords)."""
    LOST_RESPONSE = "lost_response"
    """Forward the request (it takes effect upstream), then close the client connection with a
    TCP RST instead of relaying the answer: a write that landed but whose answer was lost."""
    REWRITE_ANSWER = "rewrite_answer"
    """Forward, then relay a successful (200) JSON answer as ``Fault.rewrite`` changed it: an
    answer no stand-in gives (e.g. a GetRecords carrying a record larger than it serves)."""
    REFUSE_ENTRIES = "refuse_entries"
    """Kinesis PutRecords: refuse a share (``Fault.share``) of the call's entries with
    ``ProvisionedThroughputExceededException`` (or ``Fault.code``); forward the rest and merge
    the answers (a partial failure, as AWS answers when a shard is over its limit)."""
    LANDED_THEN_REFUSED = "landed_then_refused"
    """Forward the request (it takes effect upstream), then answer with an access-denied error
    instead of the upstream's answer: a write that landed, reported as failed by something on
    the way. The error is not retried, so the caller fails right after its write."""
    ANSWER = "answer"
    """200 with ``Fault.body`` and ``Fault.content_type`` instead of forwarding: what a gateway,
    a captive portal or a broken proxy on the way may send (an HTML page, a garbled body)."""


@dataclass(frozen=True)
class Fault:
    """A fault to inject: its kind plus the kind's parameters (only ``DELAY`` has one).

    Build with the named constructors, e.g. ``Fault.throttle()`` or ``Fault.delay(0.5)``.
    """

    kind: FaultKind
    seconds: float = 0.0
    share: float = 0.0
    code: str = ""
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = field(default=None, compare=False)
    body: bytes = b""
    content_type: str = ""

    def __post_init__(self) -> None:
        if (self.rewrite is None) != (self.kind is not FaultKind.REWRITE_ANSWER):
            raise ValueError(f"{self.kind.value}: rewrite is for rewrite_answer, and only it")
        if self.kind is not FaultKind.ANSWER and (self.body or self.content_type):
            raise ValueError(f"{self.kind.value} takes no body")
        if self.kind is FaultKind.REFUSE_ENTRIES:
            if not 0.0 <= self.share <= 1.0:
                raise ValueError(f"share must be within [0, 1], got {self.share}")
        elif self.share or self.code:
            raise ValueError(f"{self.kind.value} takes no share or code parameter")
        if self.kind is FaultKind.DELAY:
            if self.seconds < 0:
                raise ValueError(f"delay must be >= 0 seconds, got {self.seconds}")
        elif self.seconds:
            raise ValueError(f"{self.kind.value} takes no seconds parameter")

    @classmethod
    def throttle(cls) -> Fault:
        """``ProvisionedThroughputExceededException`` (HTTP 400)."""
        return cls(FaultKind.THROTTLE)

    @classmethod
    def dynamodb_throttling(cls) -> Fault:
        """DynamoDB ``ThrottlingException`` (HTTP 400)."""
        return cls(FaultKind.DYNAMODB_THROTTLING)

    @classmethod
    def http_500(cls) -> Fault:
        """An internal server error (HTTP 500) with the service's error code."""
        return cls(FaultKind.HTTP_500)

    @classmethod
    def http_503(cls) -> Fault:
        """``ServiceUnavailable`` (HTTP 503)."""
        return cls(FaultKind.HTTP_503)

    @classmethod
    def reset(cls) -> Fault:
        """Abort the client connection (TCP RST) without a response."""
        return cls(FaultKind.RESET)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Forward the request after ``seconds``."""
        return cls(FaultKind.DELAY, seconds)

    @classmethod
    def blackhole(cls) -> Fault:
        """Hold the request unanswered until the client times out or the rule is removed."""
        return cls(FaultKind.BLACKHOLE)

    @classmethod
    def lost_response(cls) -> Fault:
        """Forward, then drop the answer (TCP RST): the request took effect upstream."""
        return cls(FaultKind.LOST_RESPONSE)

    @classmethod
    def landed_then_refused(cls) -> Fault:
        """Forward, then answer AccessDeniedException (400): the request took effect upstream
        and the caller fails without retrying it."""
        return cls(FaultKind.LANDED_THEN_REFUSED)

    @classmethod
    def refuse_entries(
        cls, share: float, code: str = "ProvisionedThroughputExceededException"
    ) -> Fault:
        """PutRecords: refuse about ``share`` of each call's entries with the entry error
        ``code`` (default: throughput exceeded; e.g. ``KMSDisabledException``)."""
        return cls(FaultKind.REFUSE_ENTRIES, share=share, code=code)

    @classmethod
    def rewrite_answer(cls, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> Fault:
        """Relay a successful JSON answer as ``rewrite`` returns it (given the parsed answer)."""
        return cls(FaultKind.REWRITE_ANSWER, rewrite=rewrite)

    @classmethod
    def answer(cls, body: bytes, content_type: str = "text/html") -> Fault:
        """A 200 answer of ``body`` (``content_type``), the request not forwarded."""
        return cls(FaultKind.ANSWER, body=body, content_type=content_type)

    @classmethod
    def expired_iterator(cls) -> Fault:
        """Kinesis ``ExpiredIteratorException`` (HTTP 400)."""
        return cls(FaultKind.EXPIRED_ITERATOR)


class OpKey(NamedTuple):
    """Which operation a request calls, e.g. ``OpKey("kinesis", "GetRecords")``."""

    service: str
    operation: str


UNKNOWN_SERVICE = "unknown"
"""Service name for requests the proxy cannot attribute (e.g. ``POST /moto-api/reset``)."""


@dataclass
class OpStats:
    """What the proxy did with the requests for one operation."""

    requests: int = 0
    """Requests received (forwarded or not)."""
    forwarded: int = 0
    """Requests sent upstream and answered (including delayed ones)."""
    upstream_errors: int = 0
    """Requests whose upstream call failed; the client got a 502."""
    faults: Counter[FaultKind] = field(default_factory=Counter)
    """Faults injected, by kind."""

    def copy(self) -> OpStats:
        """A snapshot that later requests do not change."""
        return OpStats(self.requests, self.forwarded, self.upstream_errors, Counter(self.faults))


class Rule:
    """A fault rule added with :meth:`FaultProxy.add_rule`; also the handle to remove it."""

    def __init__(
        self,
        proxy: FaultProxy,
        fault: Fault,
        service: str | None,
        operation: str | None,
        rate: float,
        count: int | None,
        seed: int,
        skip: int = 0,
        when: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.fault = fault
        self.when = when
        self.skip = skip
        self.service = service
        self.operation = operation
        self.rate = rate
        self.count = count
        self.seed = seed
        self._proxy = proxy
        self._rng = random.Random(seed)
        self._fired = 0
        self._skipped = 0
        self._first_fired_at: float | None = None
        self._removed = threading.Event()

    @property
    def fired(self) -> int:
        """How many requests this rule has faulted so far."""
        with self._proxy._lock:
            return self._fired

    @property
    def first_fired_at(self) -> float | None:
        """When (``time.time()``) this rule first faulted a request: the request had arrived,
        so its client sent it no later than this. None: not yet."""
        with self._proxy._lock:
            return self._first_fired_at

    @property
    def removed(self) -> bool:
        """Whether :meth:`remove` (or :meth:`FaultProxy.clear`) has been called."""
        return self._removed.is_set()

    @property
    def exhausted(self) -> bool:
        """Whether the rule has used up its ``count``."""
        with self._proxy._lock:
            return self.count is not None and self._fired >= self.count

    def remove(self) -> None:
        """Stop applying this rule and release requests it is holding (blackhole); idempotent."""
        self._proxy._remove_rule(self)

    def _matches(self, key: OpKey, body: bytes) -> bool:
        # Called with the proxy lock held.
        if self.count is not None and self._fired >= self.count:
            return False
        if self.service is not None and self.service != key.service:
            return False
        if self.operation is not None and self.operation != key.operation:
            return False
        return self.when is None or self.when(body)

    def __repr__(self) -> str:
        return (
            f"Rule({self.fault!r}, service={self.service!r}, operation={self.operation!r}, "
            f"rate={self.rate}, count={self.count}, fired={self._fired})"
        )


# --- identifying operations --------------------------------------------------------------------

_TARGET_PREFIX_SERVICES = {
    "Kinesis": "kinesis",
    "DynamoDB": "dynamodb",
    "DynamoDBStreams": "dynamodbstreams",
}
"""``X-Amz-Target`` prefixes (before ``_<apiVersion>``) whose service name differs in case."""


def _credential_scope_service(authorization: str | None) -> str | None:
    # "AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/sts/aws4_request, SignedHeaders=..."
    if not authorization or "Credential=" not in authorization:
        return None
    credential = authorization.split("Credential=", 1)[1].split(",", 1)[0].strip()
    parts = credential.split("/")
    return parts[3] if len(parts) >= 5 else None


def identify_operation(method: str, path: str, headers: Message, body: bytes) -> OpKey:
    """Work out ``(service, operation)`` for a request the way AWS routes it.

    JSON protocol (Kinesis, DynamoDB): ``X-Amz-Target: <Prefix>_<version>.<Operation>``.
    Query protocol (STS, SQS, ...): ``Action=<Operation>`` in the form body or query string, with
    the service taken from the SigV4 credential scope. Anything else is ``unknown`` /
    ``"<METHOD> <path>"``.
    """
    target = headers.get("X-Amz-Target")
    if target and "." in target:
        prefix, operation = target.rsplit(".", 1)
        base = prefix.split("_", 1)[0]
        service = _TARGET_PREFIX_SERVICES.get(base) or (
            _credential_scope_service(headers.get("Authorization")) or base.lower()
        )
        return OpKey(service, operation)
    split = urlsplit(path)
    params = parse_qs(split.query)
    content_type = headers.get("Content-Type", "")
    if "application/x-www-form-urlencoded" in content_type and body:
        params.update(parse_qs(body.decode("utf-8", errors="replace")))
    service = _credential_scope_service(headers.get("Authorization")) or UNKNOWN_SERVICE
    actions = params.get("Action")
    if actions:
        return OpKey(service, actions[0])
    return OpKey(service, f"{method} {split.path}")


# --- error responses ---------------------------------------------------------------------------

_DDB = "com.amazonaws.dynamodb.v20120810#"
_CORAL = "com.amazon.coral.availability#"

_JSON_ERRORS: dict[str, dict[FaultKind, tuple[int, str, str]]] = {
    # status, __type, message -- as the Kinesis API reference and observed responses spell them.
    "kinesis": {
        FaultKind.THROTTLE: (
            400,
            "ProvisionedThroughputExceededException",
            "Rate exceeded for shard",
        ),
        FaultKind.EXPIRED_ITERATOR: (
            400,
            "ExpiredIteratorException",
            "Iterator expired. The iterator was created at a time further in the past than the "
            "tolerated delay of 300000 milliseconds.",
        ),
        FaultKind.DYNAMODB_THROTTLING: (400, "ThrottlingException", "Rate exceeded"),
        FaultKind.HTTP_500: (500, "InternalFailure", "Internal service failure."),
        FaultKind.HTTP_503: (503, "ServiceUnavailable", "Service unavailable."),
    },
    "dynamodb": {
        FaultKind.THROTTLE: (
            400,
            _DDB + "ProvisionedThroughputExceededException",
            "The level of configured provisioned throughput for the table was exceeded. "
            "Consider increasing your provisioning level with the UpdateTable API.",
        ),
        FaultKind.DYNAMODB_THROTTLING: (
            400,
            _CORAL + "ThrottlingException",
            "Rate of requests exceeds the allowed throughput.",
        ),
        FaultKind.EXPIRED_ITERATOR: (400, _DDB + "ExpiredIteratorException", "Iterator expired"),
        FaultKind.HTTP_500: (500, _DDB + "InternalServerError", "Internal server error"),
        FaultKind.HTTP_503: (503, _DDB + "ServiceUnavailable", "Service unavailable"),
        FaultKind.LANDED_THEN_REFUSED: (
            400,
            _DDB + "AccessDeniedException",
            "User is not authorized to perform this operation (fault proxy)",
        ),
    },
}
_JSON_ERRORS["dynamodbstreams"] = _JSON_ERRORS["dynamodb"]

_GENERIC_ERRORS: dict[FaultKind, tuple[int, str, str]] = {
    # Any other service (JSON or query protocol).
    FaultKind.THROTTLE: (400, "Throttling", "Rate exceeded"),
    FaultKind.DYNAMODB_THROTTLING: (400, "ThrottlingException", "Rate exceeded"),
    FaultKind.EXPIRED_ITERATOR: (400, "ExpiredIteratorException", "Iterator expired"),
    FaultKind.HTTP_500: (500, "InternalFailure", "Internal service failure."),
    FaultKind.HTTP_503: (503, "ServiceUnavailable", "Service unavailable."),
    FaultKind.LANDED_THEN_REFUSED: (400, "AccessDeniedException", "Not authorized (fault proxy)"),
}

_ERROR_KINDS = frozenset(_GENERIC_ERRORS)


def error_response(
    kind: FaultKind, key: OpKey, request_headers: Message
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and body AWS would send for ``kind`` on operation ``key``."""
    request_id = str(uuid.uuid4())
    is_json = bool(request_headers.get("X-Amz-Target")) or "json" in request_headers.get(
        "Content-Type", ""
    )
    table = _JSON_ERRORS.get(key.service, _GENERIC_ERRORS) if is_json else _GENERIC_ERRORS
    status, code, message = table[kind]
    if is_json:
        body = json.dumps({"__type": code, "message": message}).encode()
        content_type = request_headers.get("Content-Type") or "application/x-amz-json-1.0"
        headers = [("x-amzn-RequestId", request_id), ("Content-Type", content_type)]
        if key.service.startswith("dynamodb"):
            # DynamoDB signs every body with a CRC32 header, which botocore verifies if present.
            headers.append(("x-amz-crc32", str(zlib.crc32(body))))
        return status, headers, body
    error_type = "Receiver" if status >= 500 else "Sender"
    xml = (
        '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
        f"<Error><Type>{error_type}</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    )
    return status, [("x-amzn-RequestId", request_id), ("Content-Type", "text/xml")], xml.encode()


# --- the server --------------------------------------------------------------------------------


def _shifted(date: str, seconds: float) -> str:
    """An HTTP ``Date`` value moved by ``seconds`` (unchanged when 0 or unreadable)."""
    if not seconds:
        return date
    try:
        when = parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return date
    return formatdate(when + seconds, usegmt=True)


class _ProxyServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that tracks its connections and threads so stop() can end them all."""

    daemon_threads = True  # never block interpreter exit; stop() joins them itself
    block_on_close = False

    def __init__(self, address: tuple[str, int], proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.connections: set[socket.socket] = set()
        self.threads: set[threading.Thread] = set()
        self.connections_accepted = 0
        self.tracking_lock = threading.Lock()
        super().__init__(address, _ProxyHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves socket.getfqdn(host), a reverse DNS lookup that can
        # stall on machines without network; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        sock = cast(socket.socket, request)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"faultproxy-{self.server_address[1]}-conn",
            daemon=True,
        )
        with self.tracking_lock:
            self.connections.add(sock)
            self.connections_accepted += 1
            self.threads = {t for t in self.threads if t.is_alive()}
            self.threads.add(thread)
        thread.start()

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        with self.tracking_lock:
            self.connections.discard(cast(socket.socket, request))
        super().shutdown_request(request)


class _ProxyHandler(BaseHTTPRequestHandler):
    """Handles one client connection (many requests with keep-alive) on its own thread."""

    protocol_version = "HTTP/1.1"
    server: _ProxyServer
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        # Per-request logging goes to the logging module at DEBUG, not to stderr.
        _log.debug("%s " + format, self.address_string(), *args)

    def finish(self) -> None:
        try:
            with contextlib.suppress(OSError):
                super().finish()
        finally:
            if self._upstream is not None:
                self._upstream.close()
                self._upstream = None

    # Every method goes through the same path.
    def do_GET(self) -> None:
        self._proxy_request()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_GET

    # -- request handling --

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers end with an empty line.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _proxy_request(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        key = identify_operation(self.command, self.path, self.headers, body)
        rule = proxy._choose_rule(key, body)
        if rule is None:
            self._forward(key, body)
            return
        kind = rule.fault.kind
        proxy._count_fault(key, kind)
        if kind is FaultKind.DELAY:
            if proxy._stopping.wait(rule.fault.seconds):
                self._abandon()
                return
            self._forward(key, body)
        elif kind is FaultKind.RESET:
            self._reset()
        elif kind is FaultKind.LOST_RESPONSE:
            self._forward(key, body, lose_answer=True)
        elif kind is FaultKind.LANDED_THEN_REFUSED:
            self._forward(key, body, refuse=True)
        elif kind is FaultKind.REWRITE_ANSWER:
            self._forward(key, body, rewrite=rule.fault.rewrite)
        elif kind is FaultKind.BLACKHOLE:
            self._hold(rule)
            self._abandon()
        elif kind is FaultKind.REFUSE_ENTRIES:
            self._refuse_entries(rule, key, body)
        elif kind is FaultKind.ANSWER:
            headers = [
                ("x-amzn-RequestId", str(uuid.uuid4())),
                ("Content-Type", rule.fault.content_type),
            ]
            self._respond(200, "OK", headers, rule.fault.body)
        else:
            status, headers, payload = error_response(kind, key, self.headers)
            self._respond(status, http.client.responses.get(status, ""), headers, payload)

    def _forward(
        self,
        key: OpKey,
        body: bytes,
        lose_answer: bool = False,
        rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        refuse: bool = False,
    ) -> None:
        proxy = self.server.proxy
        headers = [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in _HOP_BY_HOP and name.lower() not in ("content-length", "expect")
        ]
        if body or self.command in ("POST", "PUT", "PATCH") or "Content-Length" in self.headers:
            headers.append(("Content-Length", str(len(body))))
        try:
            response, data = self._send_upstream(headers, body)
        except (OSError, http.client.HTTPException) as exc:
            proxy._count(key, upstream_errors=1)
            message = f"fault proxy: upstream {proxy.upstream_url} failed: {exc!r}".encode()
            self._respond(502, "Bad Gateway", [("Content-Type", "text/plain")], message)
            return
        proxy._count(key, forwarded=1)
        if lose_answer:
            self._reset()
            return
        if refuse:
            status, error_headers, payload = error_response(
                FaultKind.LANDED_THEN_REFUSED, key, self.headers
            )
            self._respond(status, http.client.responses.get(status, ""), error_headers, payload)
            return
        if rewrite is not None and response.status == 200:
            data = json.dumps(rewrite(json.loads(data))).encode()
        relayed = [
            (name, _shifted(value, proxy.date_offset) if name.lower() == "date" else value)
            for name, value in response.getheaders()
            if name.lower() not in _HOP_BY_HOP
            and name.lower() != "content-length"
            and not (rewrite is not None and name.lower() == "x-amz-crc32")  # of the old body
        ]
        if self.command == "HEAD":
            length = response.getheader("Content-Length")
            if length is not None:
                relayed.append(("Content-Length", length))
            data = b""
        self._respond(
            response.status, response.reason, relayed, data, add_length=self.command != "HEAD"
        )

    def _refuse_entries(self, rule: Rule, key: OpKey, body: bytes) -> None:
        """Forward a PutRecords call without a random share of its entries; answer with the
        upstream's results for the rest and ``ProvisionedThroughputExceededException`` for
        the share, in the call's order."""
        proxy = self.server.proxy
        request = json.loads(body)
        entries = request.get("Records", [])
        with proxy._lock:
            refused = [rule._rng.random() < rule.fault.share for _ in entries]
        kept = [entry for entry, out in zip(entries, refused, strict=True) if not out]
        upstream: list[dict[str, object]] = []
        status, reason = 200, "OK"
        headers = [("Content-Type", "application/x-amz-json-1.1")]
        if kept:
            forward = [
                (name, value)
                for name, value in self.headers.items()
                if name.lower() not in _HOP_BY_HOP
                and name.lower() not in ("content-length", "expect")
            ]
            payload = json.dumps({**request, "Records": kept}).encode()
            forward.append(("Content-Length", str(len(payload))))
            try:
                response, data = self._send_upstream(forward, payload)
            except (OSError, http.client.HTTPException) as exc:
                proxy._count(key, upstream_errors=1)
                message = f"fault proxy: upstream failed: {exc!r}".encode()
                self._respond(502, "Bad Gateway", [("Content-Type", "text/plain")], message)
                return
            proxy._count(key, forwarded=1)
            if response.status != 200:  # a whole-call error: relay it as it is
                self._respond(response.status, response.reason, headers, data)
                return
            upstream = json.loads(data)["Records"]
        results = iter(upstream)
        merged: list[dict[str, object]] = []
        for out in refused:
            if out:
                merged.append(
                    {
                        "ErrorCode": rule.fault.code or "ProvisionedThroughputExceededException",
                        "ErrorMessage": "refused by the fault proxy",
                    }
                )
            else:
                merged.append(next(results))
        failed = sum(1 for result in merged if "ErrorCode" in result)
        answer = json.dumps({"FailedRecordCount": failed, "Records": merged}).encode()
        self._respond(status, reason, headers, answer)

    def _send_upstream(
        self, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """Send the request on this connection's upstream connection, reopening a stale one.

        A reused keep-alive connection the upstream has since closed fails before any response
        byte; that (and only that) is retried once on a fresh connection, as urllib3 does.
        """
        proxy = self.server.proxy
        for attempt in (1, 2):
            reused = self._upstream is not None
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    proxy._upstream_host, proxy._upstream_port, timeout=proxy.upstream_timeout
                )
            connection = self._upstream
            try:
                connection.putrequest(
                    self.command, self.path, skip_host=True, skip_accept_encoding=True
                )
                for name, value in headers:
                    connection.putheader(name, value)
                connection.endheaders(body or None)
                response = connection.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                connection.close()
                self._upstream = None
                if reused and attempt == 1:
                    continue
                raise
            except BaseException:
                connection.close()
                self._upstream = None
                raise
            if response.will_close:
                connection.close()
                self._upstream = None
            return response, data
        raise AssertionError("unreachable")

    def _respond(
        self,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        add_length: bool = True,
    ) -> None:
        # One write for head and body: separate small writes meet Nagle + delayed ACK (40 ms).
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if add_length:
            lines.append(f"Content-Length: {len(body)}")
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(head + body)
        except OSError:
            # The client gave up (e.g. timed out during a delay); nothing left to tell it.
            self.close_connection = True

    # -- faults that do not answer --

    def _reset(self) -> None:
        """Close the connection with SO_LINGER 0, so the kernel sends RST instead of FIN."""
        self.close_connection = True
        sock = self.connection
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # rfile (a socket.makefile) holds a reference that would keep close() from really closing
        # the fd, so close it first. wfile holds none and must stay open for the stdlib's flush.
        with contextlib.suppress(OSError):
            self.rfile.close()
        with contextlib.suppress(OSError):
            sock.close()

    def _hold(self, rule: Rule) -> None:
        """Wait until the rule is removed, the proxy stops, or the client closes its side."""
        proxy = self.server.proxy
        sock = self.connection
        while not (rule.removed or proxy._stopping.is_set()):
            try:
                readable, _, _ = select.select([sock], [], [], _POLL_SECONDS)
                if readable and not sock.recv(1, socket.MSG_PEEK):
                    return  # client closed (timed out)
            except (OSError, ValueError):
                return
            if readable:
                # The client sent more bytes without waiting (pipelining): keep holding, but
                # without spinning on a socket that stays readable.
                rule._removed.wait(_POLL_SECONDS)

    def _abandon(self) -> None:
        """Close the connection without answering (after a blackhole or when stopping)."""
        self.close_connection = True


class FaultProxy:
    """HTTP/1.1 proxy on 127.0.0.1 that forwards to ``upstream_url`` and injects faults by rule.

    Starts serving (on a background thread) as soon as it is constructed. Thread-safe: rules may
    be added and removed while clients are calling through it.
    """

    def __init__(
        self,
        upstream_url: str,
        *,
        port: int = 0,
        upstream_timeout: float = 120.0,
    ) -> None:
        split = urlsplit(upstream_url)
        if split.scheme != "http" or not split.hostname or split.port is None:
            raise ValueError(f"upstream_url must look like http://host:port, got {upstream_url!r}")
        self.upstream_url = upstream_url.rstrip("/")
        self.upstream_timeout = upstream_timeout
        #: Seconds added to the ``Date`` header of every relayed answer: a service whose clock
        #: is that far ahead (negative: behind). Set at any time.
        self.date_offset = 0.0
        self._upstream_host: str = split.hostname
        self._upstream_port: int = split.port
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._stats: dict[OpKey, OpStats] = {}
        # Every request's operation and body, in arrival order, once keep_requests() was called.
        self._kept: list[tuple[OpKey, bytes]] | None = None
        self._stopping = threading.Event()
        self._stopped = False
        self._server = _ProxyServer((LOOPBACK, port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_SECONDS},
            name=f"faultproxy-{self.port}",
            daemon=True,
        )
        self._thread.start()

    # -- addressing --

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        """Give this to the client as ``endpoint_url``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def connections_accepted(self) -> int:
        """Client connections accepted so far (keep-alive reuses one for many requests)."""
        with self._server.tracking_lock:
            return self._server.connections_accepted

    # -- rules --

    def add_rule(
        self,
        fault: Fault | FaultKind,
        *,
        service: str | None = None,
        operation: str | None = None,
        rate: float = 1.0,
        count: int | None = None,
        seed: int = 0,
        skip: int = 0,
        when: Callable[[bytes], bool] | None = None,
    ) -> Rule:
        """Inject ``fault`` into matching requests from now on.

        A request matches when ``service`` and ``operation`` (``None`` = any) equal its
        :class:`OpKey`. A matching rule fires with probability ``rate``, drawn from its own
        ``random.Random(seed)`` so a test sees the same sequence on every run, and at most
        ``count`` times. Rules are tried in the order they were added; the first that fires
        decides the request's fate. The first ``skip`` requests it matches go their way (the
        fault lands mid-stream: after that many calls). ``when``: a further test of the
        request's body (called under the proxy's lock, in arrival order: keep it short).
        """
        if isinstance(fault, FaultKind):
            fault = Fault(fault)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], got {rate}")
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if skip < 0:
            raise ValueError(f"skip must be >= 0, got {skip}")
        rule = Rule(self, fault, service, operation, rate, count, seed, skip, when)
        with self._lock:
            self._rules.append(rule)
        return rule

    def rules(self) -> list[Rule]:
        """The rules currently installed, in matching order."""
        with self._lock:
            return list(self._rules)

    def clear(self) -> None:
        """Remove every rule (releasing any blackholed requests)."""
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            rule._removed.set()

    def _remove_rule(self, rule: Rule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)
        rule._removed.set()

    def _choose_rule(self, key: OpKey, body: bytes) -> Rule | None:
        with self._lock:
            self._stats.setdefault(key, OpStats()).requests += 1
            if self._kept is not None:
                self._kept.append((key, body))
            for rule in self._rules:
                matches = rule._matches(key, body)
                if matches and rule._skipped < rule.skip:
                    rule._skipped += 1
                    continue
                if matches and rule._rng.random() < rule.rate:
                    rule._fired += 1
                    if rule._first_fired_at is None:
                        rule._first_fired_at = time.time()
                    return rule
        return None

    # -- stats --

    def _count_fault(self, key: OpKey, kind: FaultKind) -> None:
        with self._lock:
            self._stats.setdefault(key, OpStats()).faults[kind] += 1

    def _count(self, key: OpKey, *, forwarded: int = 0, upstream_errors: int = 0) -> None:
        with self._lock:
            stats = self._stats.setdefault(key, OpStats())
            stats.forwarded += forwarded
            stats.upstream_errors += upstream_errors

    def keep_requests(self) -> None:
        """From now on, keep every request's operation and body (see :meth:`kept_requests`)."""
        with self._lock:
            if self._kept is None:
                self._kept = []

    def kept_requests(self) -> list[tuple[OpKey, bytes]]:
        """The requests kept since :meth:`keep_requests`, in the order they arrived."""
        with self._lock:
            return list(self._kept or [])

    def stats(self) -> dict[OpKey, OpStats]:
        """A snapshot of per-operation counters (requests, forwarded, faults by kind)."""
        with self._lock:
            return {key: value.copy() for key, value in self._stats.items()}

    def reset_stats(self) -> None:
        """Forget all counters."""
        with self._lock:
            self._stats.clear()

    # -- lifecycle --

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving, close every socket and join every thread; idempotent.

        Held requests (delay, blackhole) are released and closed unanswered; idle keep-alive
        connections are shut down so their threads stop waiting for a next request.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._server.shutdown()  # returns once serve_forever has stopped accepting
        with self._server.tracking_lock:
            connections = list(self._server.connections)
            threads = list(self._server.threads)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        for thread in [*threads, self._thread]:
            thread.join(timeout)
            if thread.is_alive():
                _log.warning(
                    "fault proxy thread %s did not end within %.0f s", thread.name, timeout
                )

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.url} -> {self.upstream_url}>"
