"""Heartbeats on a thread of their own.

Liveness must not depend on how busy the engine's event loop is: parsing a 10,000-record
GetRecords answer holds the loop for a few hundred milliseconds, and an async application may do
slow work on the same loop. Either would delay a loop-based heartbeat, make the member fence
itself, and set off needless rebalances. As the KCL renews leases on its own thread, this thread
writes the client item every ``heartbeat_interval`` with its own (blocking) boto3 client.

It also keeps the *fence*: the moment after which this member must not deliver any more,
because the others may by then consider it dead (see :attr:`Heartbeat.deadline`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .._version import __version__
from ..aws import ClientFactory, RequestStats
from ..config import Config
from ..models import ClientInfo
from ..statestore.dynamodb import client_item

log = logging.getLogger("kinesumer.heartbeat")


class Heartbeat:
    def __init__(
        self,
        config: Config,
        client_id: str,
        streams: Callable[[], tuple[str, ...]],
        owned: Callable[[], dict[str, int]] = dict,
        stats: RequestStats | None = None,
    ) -> None:
        self._config = config
        self._stats = stats
        self._client_id = client_id
        self._streams = streams
        self._owned = owned
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self.last_sent_ok = time.monotonic()
        self.deadline = self._deadline_after(self.last_sent_ok)
        self.last_attempt = 0.0
        self.failures = 0
        self.last_error: BaseException | None = None

    def _deadline_after(self, sent: float) -> float:
        """Until when our leases are safe to use (monotonic clock), kept in ``self.deadline``
        (a plain attribute: the delivery side reads it for every record).

        The others may take our shards once our last heartbeat is ``client_timeout`` old by their
        clock; we stop one ``heartbeat_interval`` earlier, counting from when the heartbeat was
        *sent*, so a member cut off from DynamoDB is silent before anyone else reads its shards.
        """
        config = self._config
        return sent + config.client_timeout - config.heartbeat_interval

    def landed(self, sent: float) -> None:
        """Record a heartbeat (sent at monotonic time ``sent``) that DynamoDB accepted."""
        if sent > self.last_sent_ok:
            self.last_sent_ok = sent
            self.deadline = self._deadline_after(sent)

    def info(self) -> ClientInfo:
        return ClientInfo(
            client_id=self._client_id,
            last_update_ms=int(time.time() * 1000),
            streams=frozenset(self._streams()),
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            owned=self._owned(),
        )

    @property
    def ttl_seconds(self) -> int:
        return int(max(self._config.client_timeout * 10, 3600))

    def start(self) -> None:
        config = self._config
        timeout = max(0.5, config.heartbeat_interval)
        factory = ClientFactory(config, self._stats)
        self._client = factory.sync_dynamodb(attempts=2, timeout=timeout)
        self._thread = threading.Thread(
            target=self._run, name=f"kinesumer-heartbeat-{self._client_id}", daemon=True
        )
        self._thread.start()

    def halt(self) -> None:
        """Stop heartbeating without waiting (safe on the event loop): a failed engine must look
        dead to the others, or its shards would be stranded."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 3 * self._config.heartbeat_interval))

    def _run(self) -> None:
        interval = self._config.heartbeat_interval
        while not self._stop.wait(max(0.0, self.last_attempt + interval - time.monotonic())):
            self.beat()

    def beat(self) -> None:
        sent = self.last_attempt = time.monotonic()
        try:
            self._client.put_item(
                TableName=self._config.dynamodb_table,
                Item=client_item(self._config.app, self.info(), self.ttl_seconds),
            )
        except Exception as exc:  # every failure is logged and counted; the fence acts on them
            self.failures += 1
            self.last_error = exc
            log.warning(
                "[%s] heartbeat failed (%d so far; fencing in %.1fs): %s",
                self._client_id,
                self.failures,
                max(0.0, self.deadline - time.monotonic()),
                exc,
            )
            return
        self.landed(sent)
