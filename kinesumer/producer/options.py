"""The settings of a producer that are not about reaching AWS, checked when it is built.

Reaching AWS (``region``, ``kinesis_endpoint``, ``role_arn``, ``external_id``, ...) uses the
words and the checks of :class:`~kinesumer.Config`; these are the producer's own. Durations are
seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from .records import MAX_CALL_RECORDS, MAX_RECORD_BYTES

#: A shard's write limits (Kinesis service quotas): the default pace per shard.
SHARD_RECORDS_PER_SECOND = 1000
SHARD_BYTES_PER_SECOND = 1024 * 1024


@dataclass(frozen=True)
class ProducerOptions:
    """How a producer batches, bounds, paces and retries (see ``Producer`` for each).

    ``linger``: how long a record may wait for others to fill a call; ``max_buffered_records`` /
    ``max_buffered_bytes``: what may be put and not yet written (a full buffer blocks ``put``, or
    raises :class:`~kinesumer.errors.BufferFullError` with ``block=False``; a record larger than
    ``max_buffered_bytes``, up to 10 MiB on a raised stream, waits for an empty buffer);
    ``delivery_timeout``: after this long unwritten, a record fails with
    :class:`~kinesumer.errors.DeliveryTimeoutError`; ``ordering``: ``"key"`` keeps each partition
    key's records in put order through partial failures, ``"none"`` does not; ``aggregate``:
    pack records into KPL aggregates per shard; ``max_in_flight``: concurrent PutRecords calls
    per stream; ``shard_records_per_second`` / ``shard_bytes_per_second``: the pace per shard
    (None: unpaced); ``retry_backoff`` / ``max_retry_backoff``: the backoff of a refused entry
    (exponential, full jitter).
    """

    linger: float = 0.05
    max_buffered_records: int = 100_000
    max_buffered_bytes: int = 64 * 1024 * 1024
    block: bool = True
    delivery_timeout: float = 120.0
    ordering: Literal["key", "none"] = "key"
    aggregate: bool = False
    max_in_flight: int = 8
    shard_records_per_second: int | None = SHARD_RECORDS_PER_SECOND
    shard_bytes_per_second: int | None = SHARD_BYTES_PER_SECOND
    retry_backoff: float = 0.05
    max_retry_backoff: float = 2.0

    @property
    def min_batch(self) -> float:
        """Records a paced shard gathers room for before a call (a linger's worth of its pace;
        a backlog smaller than this goes as soon as it fits): a trickle of tiny calls would
        cost a call's CPU for a few records each."""
        rate = self.shard_records_per_second
        return max(1.0, min(float(rate), rate * self.linger)) if rate else 1.0

    @property
    def min_call_entries(self) -> int:
        """Entries a call needs to go while another call of its stream is in flight (else its
        records wait for that call's answer and go with the keys it frees): without it, the
        keys of one call, freed together, would cycle through calls of a few entries each."""
        return 1 if self.aggregate else max(1, MAX_CALL_RECORDS // self.max_in_flight // 2)

    def __post_init__(self) -> None:
        _number("linger", self.linger, 0.0)
        _number("delivery_timeout", self.delivery_timeout, 0.001)
        _number("retry_backoff", self.retry_backoff, 0.0)
        _number("max_retry_backoff", self.max_retry_backoff, self.retry_backoff)
        _integer("max_buffered_records", self.max_buffered_records, 1)
        _integer("max_buffered_bytes", self.max_buffered_bytes, MAX_RECORD_BYTES)
        _integer("max_in_flight", self.max_in_flight, 1)
        if self.shard_records_per_second is not None:
            _integer("shard_records_per_second", self.shard_records_per_second, 1)
        if self.shard_bytes_per_second is not None:
            _integer("shard_bytes_per_second", self.shard_bytes_per_second, MAX_RECORD_BYTES)
        if self.ordering not in ("key", "none"):
            raise ConfigError(
                "ordering", f'must be "key" or "none", not {self.ordering!r}', "Producer"
            )
        for name in ("block", "aggregate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    name, f"must be True or False, not {getattr(self, name)!r}", "Producer"
                )


def _number(name: str, value: object, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(name, f"must be a number >= {minimum}, not {value!r}", "Producer")


def _integer(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, not {value!r}", "Producer")
