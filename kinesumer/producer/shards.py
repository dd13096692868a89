"""The shard map a producer routes by, and the pacing of each shard's writes.

:class:`ShardMap` holds a stream's open shards (from ListShards) by hash key range: a record goes
to the shard whose range holds its hash key, exactly as Kinesis routes it, so the producer can
batch and pace per shard. A map goes stale when the stream is resharded; the producer notices
when Kinesis answers with another shard than the map named, and lists the shards again.

:class:`ShardPacer` is a token bucket per shard at the shard's write limits (1,000 records and
1 MiB per second by default), a second's worth of burst: the producer sends no faster, so that
throttling stays the exception. A large record (over the bucket) goes from a full bucket and
leaves it in debt, as Kinesis bursts for it. Both classes are pure: time comes in as an argument.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any


class ShardMap:
    """Open shards of one stream by hash key range."""

    def __init__(self, shards: Sequence[Mapping[str, Any]]) -> None:
        open_shards: list[tuple[int, int, str]] = sorted(
            (
                int(s["HashKeyRange"]["StartingHashKey"]),
                int(s["HashKeyRange"]["EndingHashKey"]),
                str(s["ShardId"]),
            )
            for s in shards
            if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
        )
        if not open_shards:
            raise ValueError("a stream with no open shard")
        self._starts = [start for start, _, _ in open_shards]
        self._ends = [end for _, end, _ in open_shards]
        self.shard_ids = [shard_id for _, _, shard_id in open_shards]

    def shard_for(self, hash_key: int) -> str:
        """The open shard whose range holds ``hash_key``."""
        index = bisect.bisect_right(self._starts, hash_key) - 1
        return self.shard_ids[max(index, 0)]

    def __len__(self) -> int:
        return len(self.shard_ids)


class ShardPacer:
    """A token bucket of records and bytes per second for one shard."""

    __slots__ = ("_bytes", "_last", "_records", "byte_rate", "record_rate")

    def __init__(self, record_rate: float | None, byte_rate: float | None, now: float) -> None:
        self.record_rate = record_rate
        self.byte_rate = byte_rate
        self._records = record_rate or 0.0
        self._bytes = byte_rate or 0.0
        self._last = now

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._last)
        self._last = now
        if self.record_rate is not None:
            self._records = min(self.record_rate, self._records + elapsed * self.record_rate)
        if self.byte_rate is not None:
            self._bytes = min(self.byte_rate, self._bytes + elapsed * self.byte_rate)

    def room(self, now: float) -> tuple[float, float]:
        """How many records and bytes may go now (infinite where unpaced)."""
        self._refill(now)
        return (
            self._records if self.record_rate is not None else float("inf"),
            self._bytes if self.byte_rate is not None else float("inf"),
        )

    def full(self) -> bool:
        """Whether the bytes bucket is full (as of the last :meth:`room`): a large record, over
        the bucket's size, goes only then, and leaves the bucket in debt by the rest."""
        return self.byte_rate is None or self._bytes >= self.byte_rate

    def take(self, records: int, nbytes: int) -> None:
        """Spend what was sent (after :meth:`room` said it fits)."""
        self._records -= records
        self._bytes -= nbytes

    def wait(self, records: int, nbytes: int, now: float) -> float:
        """Seconds until ``records``/``nbytes`` fit."""
        have_records, have_bytes = self.room(now)
        waits = [0.0]
        if self.record_rate and have_records < records:
            waits.append((records - have_records) / self.record_rate)
        if self.byte_rate and have_bytes < nbytes:
            waits.append((min(nbytes, self.byte_rate) - have_bytes) / self.byte_rate)
        return max(waits)
