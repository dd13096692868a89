"""The demo's producer: numbered records (data ``b"<n>"``) at a steady rate, released a step at a
time by the demo."""

from __future__ import annotations

import threading
import time
from typing import Any

from ...aws import ClientFactory
from ...config import Config
from .constants import APP, REGION, STREAM, TABLE


class Producer(threading.Thread):
    """Puts records 0..total-1 at ``rate`` per second, never past what the demo allowed so far
    (the demo lets it go on a third at a time, so that every step has records to show)."""

    def __init__(self, url: str, total: int, rate: float) -> None:
        super().__init__(name="kinesumer-demo-producer", daemon=True)
        config = Config(app=APP, dynamodb_table=TABLE, region=REGION, kinesis_endpoint=url)
        self._client: Any = ClientFactory(config).sync_kinesis()
        self.total, self.rate = total, rate
        self.produced = 0
        self.error: BaseException | None = None
        self._allowed = 0
        self._cond = threading.Condition()
        self._stopped = threading.Event()

    def allow(self, count: int) -> None:
        with self._cond:
            self._allowed = min(self.total, max(self._allowed, count))
            self._cond.notify_all()

    def stop(self) -> None:
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()

    def run(self) -> None:
        try:
            step = max(1, min(500, round(self.rate / 10)))
            next_at = time.monotonic()
            while self.produced < self.total and not self._stopped.is_set():
                with self._cond:
                    while self._allowed <= self.produced and not self._stopped.is_set():
                        self._cond.wait()
                        next_at = time.monotonic()
                    limit = self._allowed
                numbers = range(self.produced, min(self.produced + step, limit))
                if numbers and not self._stopped.is_set():
                    self._put(numbers)
                    self.produced = numbers.stop
                next_at += len(numbers) / self.rate
                self._stopped.wait(max(0.0, next_at - time.monotonic()))
        except Exception as exc:  # reported by the demo, which then fails
            self.error = exc

    def _put(self, numbers: range) -> None:
        pending = [{"Data": str(i).encode(), "PartitionKey": str(i)} for i in numbers]
        for attempt in range(20):
            response = self._client.put_records(StreamName=STREAM, Records=pending)
            pending = [
                entry
                for entry, result in zip(pending, response["Records"], strict=True)
                if "ErrorCode" in result
            ]
            if not pending:
                return
            time.sleep(0.05 * (attempt + 1))
        raise RuntimeError(f"put_records kept failing for {len(pending)} records")
