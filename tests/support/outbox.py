"""Outbox relays for the tests: on threads, each with its own producer on a Kinesis stand-in;
their errors fail the test (at once through :meth:`Relays.alive`, at the end through
:meth:`Relays.close`)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from kinesumer import FlushError, Producer
from kinesumer.outbox import (
    PostgresOutbox,
)


class Relays:
    """Relays of ``outbox`` writing to the Kinesis stand-in at ``url``."""

    def __init__(self, outbox: PostgresOutbox, url: str) -> None:
        self.outbox, self.url = outbox, url
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, count: int = 1, producer: dict[str, Any] | None = None, **options: Any) -> None:
        """``count`` relays; ``producer``: their Producer's keywords, ``options`` relay()'s."""
        for _ in range(count):
            kwargs = {"producer_options": producer or {}, **options}
            thread = threading.Thread(target=self._run, kwargs=kwargs, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _run(self, producer_options: dict[str, Any], **options: Any) -> None:
        try:
            settings = {"kinesis_endpoint": self.url, "linger": 0.01, **producer_options}
            producer = Producer(region="us-east-1", **settings)
            try:
                self.outbox.relay(producer, stop=self.stop, **{"poll_interval": 0.5, **options})
            finally:
                # Puts that failed were the relay's to retry (it did): not an error here.
                with contextlib.suppress(FlushError):
                    producer.close()
        except BaseException as exc:
            self.errors.append(exc)

    def alive(self) -> None:
        """Fail the test if a relay died."""
        assert not self.errors, self.errors

    def pending(self) -> int:
        """Rows not yet acknowledged (a relay's error fails the test at once)."""
        self.alive()
        return self.outbox.stats().pending

    def drained(self) -> bool:
        """Whether the outbox is empty (a relay's error fails the test at once)."""
        return self.pending() == 0

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        self.alive()
