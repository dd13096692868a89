"""The source's offset: which batch, where each of its shards starts, and the per-shard limits.

Spark stores offsets as JSON in ``<checkpointLocation>/offsets/<batch>``; this module is their
codec. Kinesis has no high-water mark, so an offset does not say where a batch *ends*: it names
batch ``b`` and each shard's **start**; executors read from there up to the shard's limit and
record where they stopped in the ledger (:mod:`.ledger`), from which the next offset is formed::

    {"v": 1, "query": "<ledger id>", "batch": 7, "owner": "<client id>", "group": "<group>",
     "shards": {"orders/shardId-000": {"after": "4960...", "sub": 0, "lease": 3},
                "orders/shardId-001": {"at": "TRIM_HORIZON", "lease": 1},
                "orders/shardId-002": {"at_timestamp": 1767225600000, "lease": 2}},
     "limits": {"orders/shardId-000": 2500, ...}}

``query`` is made once per Spark checkpoint (by ``initialOffset``) and travels in every offset,
so a restart finds the same ledger. ``group`` names the consumer group the query's member
joined (:mod:`.groups`); offsets written before groups per query have none (their query was
in the app's group). Sequence numbers stay strings (up to 56 digits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ...config import InitialPosition
from ...errors import CorruptStateError
from ...models import Position

if TYPE_CHECKING:
    from ...kinesis import KinesisReader

VERSION = 1


@dataclass(frozen=True)
class Start:
    """Where a shard's reading starts in a batch: after a position, or at an iterator type."""

    after: Position | None = None
    at: str | None = None  # "TRIM_HORIZON" | "LATEST"
    at_timestamp_ms: int | None = None
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.after is not None:
            out = {"after": self.after.sequence_number, "sub": self.after.sub_sequence_number}
        elif self.at_timestamp_ms is not None:
            out = {"at_timestamp": self.at_timestamp_ms}
        else:
            out = {"at": self.at or "TRIM_HORIZON"}
        out["lease"] = self.lease
        return out

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Start:
        lease = int(value.get("lease", 0))
        if "after" in value:
            return cls(after=Position(str(value["after"]), int(value.get("sub", 0))), lease=lease)
        if "at_timestamp" in value:
            return cls(at_timestamp_ms=int(value["at_timestamp"]), lease=lease)
        at = value.get("at")
        if at not in ("TRIM_HORIZON", "LATEST"):
            raise CorruptStateError(f"kinesumer offset: unknown start {value!r}")
        return cls(at=at, lease=lease)

    @property
    def initial(self) -> str | datetime:
        """The iterator type for :meth:`KinesisReader.shard_iterator` when ``after`` is None."""
        if self.at_timestamp_ms is not None:
            return datetime.fromtimestamp(self.at_timestamp_ms / 1000, timezone.utc)
        return self.at or "TRIM_HORIZON"

    async def open(
        self, reader: KinesisReader, stream: str, shard_id: str, after: Position | None
    ) -> tuple[str, int | None]:
        """An iterator at ``after`` (AT its sequence number, as
        :meth:`~kinesumer.kinesis.KinesisReader.shard_iterator` gives), else at this start; and
        the instant (epoch ms) before which the reader skips the leading records, or None.

        An ``AT_TIMESTAMP`` start goes the way the group's readers reopen an instant
        (:meth:`~kinesumer.kinesis.KinesisReader.iterator_since`): a TRIM_HORIZON scan where it
        costs no more (kinesalite's AT_TIMESTAMP never answers on a shard with no record after
        the instant; AWS answers at once), else AT_TIMESTAMP. The leading records that arrived
        before the instant are skipped either way, so the first record read is the first that
        arrived at or after it, to the millisecond (a timestamp sent in whole seconds, or a
        scan, may begin earlier), and a replay reads the same records. By Kinesis's arrival
        stamps only: this host's clock is never compared with them."""
        if after is not None or self.at_timestamp_ms is None:
            initial: InitialPosition = "LATEST" if self.at == "LATEST" else "TRIM_HORIZON"
            return await reader.shard_iterator(stream, shard_id, after, initial), None
        iterator, _ = await reader.iterator_since(stream, shard_id, self.at_timestamp_ms)
        return iterator, self.at_timestamp_ms

    def describe(self) -> str:
        if self.after is not None:
            return f"after {self.after.sequence_number}/{self.after.sub_sequence_number}"
        if self.at_timestamp_ms is not None:
            return f"at {self.initial}"
        return f"at {self.at}"


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_ms(when: datetime) -> int:
    """An aware ``when`` as epoch milliseconds, by integer arithmetic (a float's ``timestamp()``
    can land a millisecond early), rounded up: a record stamped in the same millisecond but
    before a sub-millisecond instant did not arrive at or after it."""
    return -((EPOCH - when) // timedelta(milliseconds=1))


def ms_datetime(ms: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime (exact: no float on the way)."""
    return EPOCH + timedelta(milliseconds=ms)


def shard_name(stream: str, shard_id: str) -> str:
    return f"{stream}/{shard_id}"


def shard_key(name: str) -> tuple[str, str]:
    # The last "/": a DynamoDB stream's ARN has "/" in it, a shard id never has.
    stream, _, shard_id = name.rpartition("/")
    return stream, shard_id


@dataclass(frozen=True)
class SourceOffset:
    """One offset of the source (see the module docstring)."""

    query: str
    batch: int
    owner: str = ""
    shards: dict[tuple[str, str], Start] = field(default_factory=dict)
    limits: dict[tuple[str, str], int] = field(default_factory=dict)
    group: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.group is None else {"group": self.group}
        return out | {
            "v": VERSION,
            "query": self.query,
            "batch": self.batch,
            "owner": self.owner,
            "shards": {shard_name(*k): s.to_json() for k, s in sorted(self.shards.items())},
            "limits": {shard_name(*k): n for k, n in sorted(self.limits.items())},
        }

    @classmethod
    def from_json(cls, value: Any) -> SourceOffset:
        if not isinstance(value, dict) or value.get("v") != VERSION or "query" not in value:
            raise CorruptStateError(
                f"not a kinesumer source offset (version {VERSION}): {str(value)[:200]}; was the "
                f"checkpoint folder written by another source?"
            )
        return cls(
            query=str(value["query"]),
            batch=int(value["batch"]),
            owner=str(value.get("owner", "")),
            shards={shard_key(k): Start.from_json(v) for k, v in value["shards"].items()},
            limits={shard_key(k): int(v) for k, v in value.get("limits", {}).items()},
            group=None if value.get("group") is None else str(value["group"]),
        )


def sequence_after(a: Position, b: Position) -> bool:
    """Whether ``a`` lies after ``b`` (sequence numbers compared as integers, then sub)."""
    return (int(a.sequence_number), a.sub_sequence_number) > (
        int(b.sequence_number),
        b.sub_sequence_number,
    )
