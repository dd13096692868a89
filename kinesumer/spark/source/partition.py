"""The input partition of one shard in one micro-batch: everything an executor's read needs.

``partitions()`` runs in the driver's long-lived Python worker; ``read()`` runs in executor
workers that never see the driver's objects (no member, no clients, nothing learned after the
reader was pickled). So a partition carries the whole :class:`~kinesumer.Config` (endpoints,
region, role, retries, scan settings), the shard, its start, its record limit, the ledger it
writes to and the claim it was planned under. It is a frozen dataclass of plain values:
picklable, and printable in Spark's task logs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import Config
from .compat import InputPartition
from .offsets import SourceOffset, Start
from .options import SourceOptions


@dataclass(frozen=True)
class ShardPartition(InputPartition):
    """Read ``stream/shard_id`` from ``start`` for batch ``batch`` of query ``query``."""

    config: Config
    query: str
    batch: int
    stream: str
    shard_id: str
    start: Start
    limit: int
    owner: str
    max_read_seconds: float
    ledger_ttl: int
    #: How long a read rides out a Kinesis or DynamoDB outage (option ``outage_timeout``).
    outage_timeout: float = 300.0
    #: Read the shard's next batch ahead on this host when records are behind (option
    #: ``read_ahead``; see :mod:`kinesumer.spark.source.executor.readahead`).
    read_ahead: bool = False
    #: This run of the query (a token the driver's reader makes when Spark creates it, once per
    #: run): a read-ahead file of another run is not taken (its "caught up" is that of then).
    run: str = ""
    #: The batch was planned by this run's reader (its ``latestOffset``), not taken from the
    #: offset log after a restart, and these are the first partitions planned for it (not a
    #: further job's that reads the batch again): a first task attempt finds no ledger item
    #: unless a concurrent attempt wrote one, so it skips looking (see :mod:`.executor`).
    planned_here: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.stream, self.shard_id

    def describe(self) -> str:
        return f"batch {self.batch} {self.stream}/{self.shard_id} {self.start.describe()}"


def partitions_of(o: SourceOptions, end: SourceOffset) -> list[ShardPartition]:
    """One partition per shard of batch ``end`` (sorted by stream and shard)."""
    return [
        ShardPartition(
            config=o.config,
            query=end.query,
            batch=end.batch,
            stream=stream,
            shard_id=shard_id,
            start=start,
            limit=end.limits.get((stream, shard_id), o.max_records_per_shard),
            owner=end.owner,
            max_read_seconds=o.max_read_seconds,
            ledger_ttl=o.ledger_ttl_seconds,
            outage_timeout=o.outage_timeout,
            read_ahead=o.read_ahead,
        )
        for (stream, shard_id), start in sorted(end.shards.items())
    ]
