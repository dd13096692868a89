"""A local AWS: moto in server mode on a free loopback port, open only to whoever started it.

:class:`LocalAWS` serves moto's backends on ``127.0.0.1`` with port 0, so the kernel picks a free
port at bind time (no pick-then-bind race), and :meth:`LocalAWS.stop` stops that server only.
:meth:`LocalAWS.environment` is what points boto3, aiobotocore and kinesumer at it: botocore's own
``AWS_ENDPOINT_URL_<SERVICE>`` variables, this server's credentials and a region, so code under
test needs no endpoint argument.

Loopback is shared by every user of the machine, and moto checks no signature. So the server
(:class:`SignedOnly`, in front of moto) answers only requests signed (SigV4, verified) with the
random key pair made for this server, or with credentials its own STS handed to such a caller
(``AssumeRole``); only for the services the fixtures use (Kinesis, DynamoDB and its streams,
STS); and its ``/moto-api/`` (reset, state) only with a random header. Another local user can
then neither read a test's records, inject one, nor reach moto's other services (Batch runs jobs
through docker where a daemon is reachable).
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import re
import secrets
import socket
import string
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

#: The region the local AWS answers for, unless a test asks for another.
REGION = "us-east-1"
LOOPBACK = "127.0.0.1"
#: The signing names of the services the server answers (DynamoDB Streams signs as dynamodb).
SERVICES = frozenset({"kinesis", "dynamodb", "sts"})
#: The header :meth:`LocalAWS.reset` sends to moto's own API with the server's admin token.
ADMIN_HEADER = "X-Kinesumer-Admin-Token"

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, ?SignedHeaders=(?P<headers>[a-z0-9;-]+), ?"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)
_ISSUED = re.compile(
    rb"<AccessKeyId>([^<]+)</AccessKeyId>\s*<SecretAccessKey>([^<]+)</SecretAccessKey>"
)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class LocalAWSError(RuntimeError):
    """moto's server did not start (or is not installed)."""


def _random_key_id() -> str:
    alphabet = string.ascii_uppercase + string.digits
    return "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16))


class SignedOnly:
    """WSGI middleware answering only this server's own callers (see the module docstring).

    A request is let through when its ``Authorization`` is SigV4 for one of :data:`SERVICES`,
    by a key this server knows, and its signature is the one that key's secret gives for the
    request as received. Credentials that moto's STS returns to an admitted ``AssumeRole``
    become known keys (tests assume roles to act in other accounts)."""

    def __init__(self, app: WSGIApp, access_key: str, secret_key: str, admin_token: str) -> None:
        self._app = app
        self._admin_token = admin_token
        self._secrets = {access_key: secret_key}
        self._lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/moto-api"):
            token = environ.get("HTTP_" + ADMIN_HEADER.upper().replace("-", "_"), "")
            if not hmac.compare_digest(token.encode(), self._admin_token.encode()):
                return _refuse(start_response, "", "moto's API needs this server's admin token")
            return self._app(environ, start_response)
        body = _read_body(environ)
        match = _AUTHORIZATION.match(environ.get("HTTP_AUTHORIZATION", ""))
        if match is None:
            return _refuse(start_response, "", "the request is not signed with SigV4")
        service = match["service"]
        if service not in SERVICES:
            return _refuse(start_response, service, f"{service} is not served here")
        with self._lock:
            secret = self._secrets.get(match["key"])
        if secret is None:
            return _refuse(start_response, service, "signed with a key this server did not issue")
        if not _signature_holds(environ, body, match, secret):
            return _refuse(start_response, service, "the signature does not match this server's")
        if service != "sts":
            return self._app(environ, start_response)
        answer = b"".join(self._app(environ, start_response))
        with self._lock:
            for key, issued_secret in _ISSUED.findall(answer):
                self._secrets[key.decode()] = issued_secret.decode()
        return [answer]


def _read_body(environ: Environ) -> bytes:
    """The request's body, read once and put back for moto."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body: bytes = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _signature_holds(environ: Environ, body: bytes, match: re.Match[str], secret: str) -> bool:
    """Whether the request's signature is the one ``secret`` gives (botocore's SigV4 code
    recomputes it over the headers the request says it signed)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    headers: dict[str, str] = {}
    for name in match["headers"].split(";"):
        if name == "host":
            value = environ.get("HTTP_HOST", "")
        elif name == "content-type":
            value = environ.get("CONTENT_TYPE", "")
        elif name == "content-length":
            value = environ.get("CONTENT_LENGTH", "")
        else:
            value = environ.get("HTTP_" + name.upper().replace("-", "_"), "")
        headers[name] = value
    timestamp = headers.get("x-amz-date")
    if not timestamp:
        return False
    raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
    query = environ.get("QUERY_STRING", "")
    if "?" not in raw_uri and query:
        raw_uri = f"{raw_uri}?{query}"
    request = AWSRequest(
        method=environ.get("REQUEST_METHOD", "GET"),
        url=f"http://{headers.get('host') or environ.get('HTTP_HOST', LOOPBACK)}{raw_uri}",
        headers=headers,
        data=body,
    )
    request.context["timestamp"] = timestamp
    auth = SigV4Auth(Credentials(match["key"], secret), match["service"], match["region"])
    canonical = auth.canonical_request(request)
    expected: str = auth.signature(auth.string_to_sign(request, canonical), request)
    return hmac.compare_digest(expected, match["signature"])


def _refuse(start_response: StartResponse, service: str, why: str) -> list[bytes]:
    """403 in the service's own error shape, so a client names the refusal."""
    message = f"kinesumer's local AWS refused the request: {why}"
    if service == "sts":
        body = (
            "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidClientTokenId</Code>"
            f"<Message>{message}</Message></Error></ErrorResponse>"
        ).encode()
        content_type = "text/xml"
    else:
        body = json.dumps({"__type": "UnrecognizedClientException", "message": message}).encode()
        content_type = "application/x-amz-json-1.1"
    start_response(
        "403 Forbidden",
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("x-amzn-ErrorType", "UnrecognizedClientException"),
        ],
    )
    return [body]


class LocalAWS:
    """moto in server mode in a thread of this process. ``start()`` then ``url``; ``stop()``.

    Each server makes its own random credentials (``access_key``, ``secret_key``) and
    ``admin_token``; :meth:`environment` and :meth:`client` carry them."""

    def __init__(self, *, region: str = REGION, startup_timeout: float = 30.0) -> None:
        self.region = region
        self._startup_timeout = startup_timeout
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self.access_key = _random_key_id()
        self.secret_key = secrets.token_urlsafe(30)
        self.admin_token = secrets.token_urlsafe(24)

    def start(self) -> LocalAWS:
        try:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server
        except ImportError as exc:  # the testing extra brings it
            raise LocalAWSError(
                "the local AWS needs moto's server: pip install 'kinesumer[testing]'"
            ) from exc
        from .moto_dynamodb import serialize_dynamodb_requests

        # werkzeug logs every request at INFO.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        serialize_dynamodb_requests()  # conditional writes atomic, as DynamoDB's are
        app = SignedOnly(
            DomainDispatcherApplication(create_backend_app),
            self.access_key,
            self.secret_key,
            self.admin_token,
        )
        try:
            server = make_server(
                LOOPBACK, 0, app, threaded=True, request_handler=MotoRequestHandler
            )
        except OSError as exc:
            raise LocalAWSError(f"moto's server could not bind {LOOPBACK}: {exc}") from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="kinesumer-local-aws", daemon=True
        )
        self._thread.start()
        host, port = str(server.server_address[0]), int(server.server_address[1])
        self.url = f"http://{host}:{port}"
        deadline = time.monotonic() + self._startup_timeout
        while True:
            try:
                socket.create_connection((host, port), timeout=1.0).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise LocalAWSError(f"moto's server on {self.url} never accepted") from None
                time.sleep(0.05)

    def stop(self) -> None:
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()

    def reset(self) -> None:
        """Forget every stream, table and record (moto's reset API): one test's state is not
        the next one's."""
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset",
            data=b"",
            method="POST",
            headers={ADMIN_HEADER: self.admin_token},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def environment(self) -> dict[str, str]:
        """The variables that point boto3, aiobotocore and kinesumer at this server."""
        return {
            "AWS_ENDPOINT_URL_KINESIS": self.url,
            "AWS_ENDPOINT_URL_DYNAMODB": self.url,
            "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": self.url,
            "AWS_ENDPOINT_URL_STS": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
        }

    def client(self, service: str) -> Any:
        """A blocking boto3 client of ``service`` on this server."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def __repr__(self) -> str:
        return f"LocalAWS({json.dumps(self.url)})"
