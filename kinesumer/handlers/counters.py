"""What ``run()``'s handlers did with their records, counted: :class:`HandlerCounters`.

One per handler name, shared by the runner (the fast path counts ``ok`` itself) and the
invocation (every policy outcome); read by ``consumer.stats().handled`` and, when metrics are on,
exported as the Prometheus counter ``kinesumer_handler_records_total``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..observability.metrics import Metrics

#: What can happen to a record given to a handler (``ConsumerStats.handled``): handled
#: (``ok``), handler calls beyond the first (``retried``, counted per extra attempt and record),
#: given up by the policy (``discarded``, ``dead_lettered``, ``retry_later``), stopped the run
#: (``failed``), payloads that did not decode (``decode_error``) and records older than
#: ``max_record_age`` that went to the policy instead of the handler (``too_old``).
OUTCOMES: tuple[str, ...] = (
    "ok",
    "retried",
    "discarded",
    "dead_lettered",
    "retry_later",
    "failed",
    "decode_error",
    "too_old",
)


class HandlerCounters:
    """Records by outcome for one handler (see :data:`OUTCOMES`): thread-safe, cheap, and fed
    to Prometheus as ``kinesumer_handler_records_total`` when metrics are on."""

    def __init__(self, name: str, metrics: Metrics | None = None) -> None:
        self.name = name
        self._metrics = metrics
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, outcome: str, n: int = 1) -> None:
        """``n`` records had ``outcome``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown handler outcome {outcome!r}; one of {OUTCOMES}")
        with self._lock:
            self._counts[outcome] = self._counts.get(outcome, 0) + n
        if self._metrics is not None:
            self._metrics.handled(self.name, outcome, n)

    def snapshot(self) -> dict[str, int]:
        """Outcome -> records so far (outcomes that never happened are left out)."""
        with self._lock:
            return dict(self._counts)
