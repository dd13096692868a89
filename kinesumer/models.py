"""Plain data the library hands around: records, shards, members, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple


class Record(NamedTuple):
    """One Kinesis record, as delivered to the application.

    A NamedTuple because the hot path builds one per record: it is immutable and about three
    times cheaper to create than a frozen dataclass. ``sub_sequence_number`` is the index of a
    user record inside a KPL-aggregated record, 0 for plain records.
    """

    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    data: bytes
    approximate_arrival_timestamp: datetime | None


class EpochRecord(NamedTuple):
    """A :class:`Record` with its arrival time in epoch seconds (a float), as the GetRecords
    answer holds it: how the Spark executors unpack KPL aggregates on their way to
    :class:`~kinesumer.kinesis.columns.EpochColumns`."""

    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    data: bytes
    approximate_arrival_timestamp: float | None


@dataclass(frozen=True, order=True)
class Shard:
    """A shard with its lineage. ``closed`` means it has an ending sequence number (it was split
    or merged) and will reach SHARD_END once drained."""

    shard_id: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    closed: bool = False

    @property
    def parents(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)


@dataclass(frozen=True)
class ClientInfo:
    """A registered member of the group, as read from its client item."""

    client_id: str
    last_update_ms: int
    streams: frozenset[str] = frozenset()
    host: str = ""
    pid: int = 0
    version: str = ""
    #: ``"stream/shard"`` -> MillisBehindLatest (-1 unknown) of the shards it reads; only the
    #: furthest behind when they are too many for a 1 KB item (``owned_count`` is the total).
    owned: dict[str, int] = field(default_factory=dict)
    owned_count: int = -1  # -1: not reported (an older version)
    #: Enhanced fan-out: ``"stream/shard"`` -> stalls of its subscriptions under this member's
    #: lease, for the shards that stalled (the most stalled few); empty from an older version.
    efo_stalls: dict[str, int] = field(default_factory=dict)
    #: ``Config.assignment`` of that member ("" from an older version: it assigns by range).
    assignment: str = ""
    #: Heartbeats this member process has sent (0 from an older version): with ``last_update_ms``
    #: the *token* that changes at every heartbeat. Observers judge a member by whether its token
    #: changed (on their own clock), never by what its stamp says (:mod:`kinesumer.core.liveness`).
    beat: int = 0
    #: ``"<account>:<region>"``: where that member's streams given by name live (its home;
    #: the account is empty when it never needed it: names only, no ``role_arn``). "" from an
    #: older version.
    home: str = ""

    @property
    def token(self) -> tuple[int, int]:
        """What changes at every heartbeat: compared for equality only, never with a clock."""
        return (self.last_update_ms, self.beat)


@dataclass(frozen=True)
class Checkpoint:
    """A shard's checkpoint item: where reading stopped, who owns the shard, and whether the
    shard was read to its end.

    ``lease`` is a counter bumped by every claim: checkpoint writes are conditional on
    ``owner`` *and* ``lease``, so a writer from an older claim can never overwrite the position
    written under a newer one, even if the same client id claimed the shard again.

    ``started_at_ms``: a shard first read at ``LATEST`` keeps here (epoch ms, by the Kinesis
    server's clock, minus a margin) the instant reading began, written before its first record
    was handed out; while there is no ``sequence_number`` every later reader starts there
    (AT_TIMESTAMP), so nothing that arrived after that instant is skipped.
    """

    stream: str
    shard_id: str
    sequence_number: str | None = None
    sub_sequence_number: int = 0
    owner: str | None = None
    lease: int = 0
    finished: bool = False
    last_update_ms: int = 0
    started_at_ms: int | None = None
    #: Records done above ``sequence_number`` (a handler run finished them out of order), as
    #: encoded by :mod:`kinesumer.core.done_ranges`; b"" when none. The next owner skips them.
    done: bytes = b""


class Position(NamedTuple):
    """A point in a shard: the last record processed (sequence number and KPL sub-sequence)."""

    sequence_number: str
    sub_sequence_number: int = 0
