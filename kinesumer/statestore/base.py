"""The state store interface: membership, shard cache and fenced checkpoints.

The engine talks only to this protocol; :mod:`kinesumer.statestore.dynamodb` implements it on one
DynamoDB table. Every write that can race is conditional, and the methods say in their return
value whether the condition held, so the caller decides what losing a race means.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..models import Checkpoint, ClientInfo, Position, Shard


@dataclass(frozen=True)
class SavedPosition:
    """Where a broadcast member stands in one shard, as saved under its own key.

    ``position`` is the last record processed; without one, ``started_at_ms`` (if any) is when
    the member began reading the shard, so a restart reads from there (AT_TIMESTAMP) and loses
    nothing that arrived while it was down.
    """

    stream: str
    shard_id: str
    position: Position | None = None
    started_at_ms: int | None = None
    finished: bool = False


@dataclass(frozen=True)
class ShardCache:
    """A stream's shard list with lineage, plus which closed shards the group has finished.

    ``digest`` identifies the content: the cache is rewritten only when it changes, and readers
    fetch the (possibly large) body only when the digest they hold is out of date.
    """

    stream: str
    shards: tuple[Shard, ...]
    finished: frozenset[str] = field(default_factory=frozenset)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json()).hexdigest()[:32]

    def to_json(self) -> bytes:
        body = {
            "shards": [
                [s.shard_id, s.parent_shard_id, s.adjacent_parent_shard_id, s.closed]
                for s in sorted(self.shards)
            ],
            "finished": sorted(self.finished),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, stream: str, raw: bytes) -> ShardCache:
        body = json.loads(raw)
        shards = tuple(Shard(sid, p, ap, bool(closed)) for sid, p, ap, closed in body["shards"])
        return cls(stream, shards, frozenset(body["finished"]))

    def by_id(self) -> dict[str, Shard]:
        return {s.shard_id: s for s in self.shards}


@dataclass(frozen=True)
class MembershipView:
    """The head of the membership view the leader publishes (:mod:`kinesumer.group.membership`):
    which member list is current (``members_key``, ``version``), when the leader's strongly
    consistent read of the client items behind it started (``read_at_ms``), when it was last
    published, and how many joins and leaves were announced (``changes``) against how many the
    list covers (``seen_changes``)."""

    version: int
    members_key: str
    read_at_ms: int
    published_at_ms: int
    leader: str
    seen_changes: int
    changes: int = 0
    #: The shard caches' digests the leader last read or wrote, by stream: a follower of this
    #: head needs no digest read of its own for these streams.
    digests: tuple[tuple[str, str], ...] = ()
    #: The leader's ``client_timeout`` (ms; 0 from an older version): what the group goes by,
    #: for the command line.
    timeout_ms: int = 0
    #: The leader's own heartbeat token as its read behind this publication found it
    #: (``ClientInfo.token``; (0, 0) from an older version): followers see it change with
    #: every head, so a leader that dies is judged ``client_timeout`` after they first saw its
    #: last token, without a read of its item while it publishes.
    leader_token: tuple[int, int] = (0, 0)

    @property
    def token(self) -> tuple[str, int, int, str]:
        """What changes at every publication. Followers judge the head stale when it has not
        changed for ``client_timeout`` on their own clock; its stamps are never compared with
        a clock."""
        return (self.leader, self.published_at_ms, self.version, self.members_key)


@dataclass(frozen=True)
class PublishedMembers:
    """A member list the leader published: the live members, and the members it judged dead
    (not pruned yet), each with the heartbeat token it died with (``ClientInfo.token``)."""

    live: list[ClientInfo]
    dead: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: False for a list an older version published (no verdicts in it): members of this version
    #: then judge for themselves, from the client items.
    judged: bool = True


@runtime_checkable
class MembershipViewStore(Protocol):
    """What a store needs for members to follow a published view instead of reading every
    client item each tick. A store without it (a test's stand-in) is read directly."""

    async def read_view_head(self, *, consistent: bool) -> MembershipView | None:
        """The view's head (None: none yet); eventually consistent unless ``consistent``."""

    async def read_view_members(self, members_key: str) -> PublishedMembers | None:
        """A published member list (eventually consistent: it never changes once written), or
        None when it is gone (the leader deleted it after publishing another)."""

    async def publish_view(
        self, seen: MembershipView | None, head: MembershipView, members: PublishedMembers | None
    ) -> bool:
        """Leader: write ``members`` (when not None) under ``head.members_key``, then the head,
        conditional on the head being still ``seen`` (version and list). False: another leader
        published in between; its view stands and ours (its list) is discarded."""

    def follow_digests(self, head: MembershipView | None) -> None:
        """Answer the next :meth:`StateStore.shard_cache_digests` from ``head``'s digests (once,
        when they cover every stream asked for); None: read them from the table."""

    async def announce_change(self) -> None:
        """Count a join or a graceful leave on the head (an atomic ADD), so that followers read
        the client items directly until the leader published a list covering it."""


class StateStore(Protocol):
    """Storage of one app's group state.

    Every method may raise :class:`~kinesumer.errors.StateTableNotFoundError` (no table),
    :class:`~kinesumer.errors.AccessDeniedError` (a permission is missing) or
    :class:`~kinesumer.errors.TransientAWSError` (still failing after the retries); reads raise
    :class:`~kinesumer.errors.CorruptStateError` for an item they cannot decode, and conditional
    writes :class:`~kinesumer.errors.StateStoreError` when they fail for another reason than
    their condition. A refused condition is never an error: it is the return value.
    """

    async def check(self) -> None:
        """Fail with a named error when the table is missing, has the wrong keys, or is denied."""

    # -- membership ---------------------------------------------------------------------------
    async def heartbeat(self, client: ClientInfo, ttl_seconds: int) -> None:
        """Register or refresh this client's item (unconditional: only its owner writes it)."""

    async def deregister(self, client_id: str) -> None:
        """Remove this client's item (on close), so the others rebalance at once."""

    async def list_clients(self) -> list[ClientInfo]:
        """Every registered client item, live or not."""

    async def get_client(self, client_id: str) -> ClientInfo | None:
        """One client item, strongly consistent (None: there is none): to confirm, before a
        takeover, that its owner has not heartbeated since it was judged dead."""

    async def prune_client(self, client: ClientInfo) -> bool:
        """Delete a dead client's item, conditional on its ``last_update`` being still the one
        read. True if deleted; False: it heartbeated since (it revived), the item stays."""

    # -- shard cache --------------------------------------------------------------------------
    async def shard_cache_digests(self, streams: Sequence[str]) -> dict[str, str]:
        """The current digest of each stream's shard cache (streams without a cache are absent)."""

    async def load_shard_cache(self, stream: str) -> ShardCache | None:
        """The whole shard cache of a stream, or None when there is none (or it moved on)."""

    def shard_cache_unreadable(self, stream: str) -> bool:
        """Whether the stream's cache was refused as unreadable at its last load: a leader's
        sync then writes a fresh one over it (conditional on it being still that head)."""

    async def save_shard_cache(self, cache: ShardCache, expected_digest: str | None) -> bool:
        """Replace the cache, conditional on its digest being still ``expected_digest`` (None:
        no cache yet). False: another writer (a leader that overlapped) got there first; its
        cache stands and this one is discarded."""

    # -- checkpoints --------------------------------------------------------------------------
    async def get_checkpoints(
        self, stream: str, shard_ids: Iterable[str] | None = None
    ) -> dict[str, Checkpoint]:
        """Checkpoints of a stream (strongly consistent), all or only ``shard_ids``. One that
        cannot be read back is left out and noted (see :meth:`checkpoint_unreadable`)."""

    def checkpoint_unreadable(self, stream: str, shard_id: str) -> bool:
        """Whether the shard's checkpoint could not be read back at its last read: do not read
        the shard (nor overwrite its checkpoint) until it can."""

    async def claim(
        self, stream: str, shard_id: str, client_id: str, seen: Checkpoint | None
    ) -> Checkpoint | None:
        """Take ownership of a shard if its checkpoint is still as ``seen`` (absent, unowned, or
        owned by the same lease of a dead client or of ourselves): conditional on owner and lease.
        Returns the new checkpoint, with a new lease number, or None when someone else got there
        first (do not read the shard)."""

    async def write_checkpoint(
        self,
        checkpoint: Checkpoint,
        position: Position | None,
        *,
        finished: bool = False,
        release: bool = False,
        done: bytes | None = None,
    ) -> bool:
        """Write ``position`` (and/or the finished flag, and/or release ownership, and/or the
        records ``done`` above the position: b"" removes them, None leaves them) if the shard
        is still owned by ``checkpoint.owner`` under ``checkpoint.lease`` (the fencing token).
        False: the lease was lost (taken over, or moved by an operator): stop reading the shard
        and drop what it buffered."""

    async def record_start(self, checkpoint: Checkpoint, started_at_ms: int) -> bool:
        """Record where a ``LATEST`` read of the shard began (epoch ms, by Kinesis's clock),
        before its first record is handed out, fenced on ``checkpoint.owner`` and
        ``checkpoint.lease`` as :meth:`write_checkpoint`; a start already recorded is kept.
        False: the lease was lost."""


class BroadcastPositions(Protocol):
    """A broadcast member's own saved positions (``Config(broadcast_resume=True)``), under its
    own key: never the group's checkpoints."""

    async def open_broadcast_session(self, client_id: str) -> int:
        """A new session number for ``client_id`` (an atomic ADD): the fence of its writes."""

    async def broadcast_positions(self, client_id: str) -> dict[tuple[str, str], SavedPosition]:
        """Every position ``client_id`` saved, by (stream, shard id)."""

    async def save_broadcast_position(
        self, client_id: str, session: int, saved: SavedPosition
    ) -> bool:
        """Save one position, conditional on ``session`` being still the newest; False: a newer
        session of the same client id took over."""


class GroupState(StateStore, MembershipViewStore, BroadcastPositions, Protocol):
    """A state table a member can be given instead of building its DynamoDB store
    (``Kinesumer(config, state=...)``): :class:`kinesumer.testing.MemoryState` is one.

    The member takes its app's view (:meth:`for_app`), and its heartbeat thread, which has no
    event loop, writes the client item through :meth:`write_client_blocking`. Operator controls
    (pins, step-downs, weights) are items of the DynamoDB table: a member on another state has
    none.
    """

    def for_app(self, app: str) -> GroupState:
        """The same table as app ``app`` sees it."""

    def write_client_blocking(self, client: ClientInfo, ttl_seconds: int) -> None:
        """:meth:`StateStore.heartbeat`, blocking, from a thread without an event loop."""
