"""A local AWS for tests: moto in server mode on a free loopback port, stopped by its own handle.

:class:`LocalAWS` starts moto's threaded server (all services) on ``127.0.0.1`` with port 0, so
the kernel picks a free port at bind time (no pick-then-bind race), and :meth:`LocalAWS.stop`
stops that server only. :meth:`LocalAWS.environment` is what points boto3, aiobotocore and
kinesumer at it: botocore's own ``AWS_ENDPOINT_URL_<SERVICE>`` variables, fake credentials and a
region, so code under test needs no endpoint argument.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.request
from typing import Any

#: The region the local AWS answers for, unless a test asks for another.
REGION = "us-east-1"
LOOPBACK = "127.0.0.1"


class LocalAWSError(RuntimeError):
    """moto's server did not start (or is not installed)."""


class LocalAWS:
    """moto in server mode in a thread of this process. ``start()`` then ``url``; ``stop()``."""

    def __init__(self, *, region: str = REGION, startup_timeout: float = 30.0) -> None:
        self.region = region
        self._startup_timeout = startup_timeout
        self._server: Any = None
        self.url = ""

    def start(self) -> LocalAWS:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:  # the testing extra brings it
            raise LocalAWSError(
                "the local AWS needs moto's server: pip install 'kinesumer[testing]'"
            ) from exc
        # werkzeug logs every request at INFO and ignores verbose=False.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        # start() waits forever when binding fails: wait for it with a bound.
        starter = threading.Thread(target=server.start, name="kinesumer-local-aws", daemon=True)
        starter.start()
        starter.join(self._startup_timeout)
        if starter.is_alive():
            raise LocalAWSError(f"moto's server did not bind {LOOPBACK} in time")
        self._server = server
        host, port = server.get_host_and_port()
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
        if server is not None:
            server.stop()

    def reset(self) -> None:
        """Forget every stream, table and record (moto's reset API): one test's state is not
        the next one's."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def environment(self) -> dict[str, str]:
        """The variables that point boto3, aiobotocore and kinesumer at this server."""
        return {
            "AWS_ENDPOINT_URL_KINESIS": self.url,
            "AWS_ENDPOINT_URL_DYNAMODB": self.url,
            "AWS_ENDPOINT_URL_STS": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
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
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def __repr__(self) -> str:
        return f"LocalAWS({json.dumps(self.url)})"
