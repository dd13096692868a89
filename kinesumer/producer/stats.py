"""What a producer reports about itself: :class:`ProducerStats`, a snapshot from ``stats()``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LatencySummary:
    """Put-to-acknowledgement seconds of the last (up to 4,096) records written."""

    count: int = 0
    p50: float | None = None
    p99: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class ProducerStats:
    """A producer's counters since it was created, and what it holds now.

    ``records_put``/``bytes_put``: written (bytes are data plus key); ``calls``: PutRecords
    calls answered or failed; ``retries``: entries sent again (refused entries, or entries of a
    call that failed as a whole with a transient error); ``throttled_entries``: of those,
    refused for throughput; ``records_failed`` and ``failures`` (by error class name): records
    whose future holds an error; ``buffered_records``/``buffered_bytes``: put, not yet resolved;
    ``latency``: put-to-ack.
    """

    records_put: int = 0
    bytes_put: int = 0
    calls: int = 0
    retries: int = 0
    throttled_entries: int = 0
    records_failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    buffered_records: int = 0
    buffered_bytes: int = 0
    latency: LatencySummary = field(default_factory=LatencySummary)


def latency_summary(samples: list[float]) -> LatencySummary:
    if not samples:
        return LatencySummary()
    ordered = sorted(samples)
    last = len(ordered) - 1
    return LatencySummary(
        count=len(ordered),
        p50=ordered[last // 2],
        p99=ordered[min(last, round(last * 0.99))],
        max=ordered[last],
    )
