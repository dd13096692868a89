"""A lease: this member's claim of one shard, paired with the read side's progress on it.

Two objects, each changed by one owner:

- :class:`Claim` (this module, the group side): the checkpoint item as claimed (owner and lease
  number: the fencing identity of every write), the status and its lifecycle, what the last
  checkpoint write left in the item (``checkpointed``, ``done_written``, ``finished``). Changed
  on the engine's loop by leasing (claims), the checkpointer (writes, handoff, release, finish,
  loss) and membership (the heartbeats' fence), with one exception: the delivery cursor, on
  whatever thread delivers, applies the group's own fence (:meth:`Claim.fence`) the moment it
  sees the heartbeat's deadline passed.
- the read progress (the read side: :class:`kinesumer.read.progress.ShardProgress` for a
  member that reads its shards, the external member's own for reads done elsewhere): delivered,
  processed and fetched positions, SHARD_END reached, lag, the inherited done runs and the skip
  of done records, the fetcher task. Changed by the fetchers (loop) and the delivery side (the
  application's thread, ``run()``'s workers); the group side only reads it, through the narrow
  :class:`ReadProgress` view below, and asks it to stop fetching.

:class:`Lease` pairs the two and nothing more; ``group/`` never imports ``read/``, so the
pairing is generic in the progress type and a member says which progress its leases carry.

The one step that must not interleave, "is this lease still deliverable? then it is delivered",
spans both objects: the claim's status and the progress's ``delivered``. One lock, the claim's
:attr:`Claim.lock`, orders it: every status change takes it, and the progress takes the same
lock to check the status and move ``delivered`` (and for its other multi-field changes). One
lock rather than one per object: the step needs both, two locks would need an order, and the
per-record hot path would pay twice. Single marks are single attribute writes, so the loop may
read them while another thread writes them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from ..core import done_ranges
from ..core.done_ranges import Run
from ..models import Checkpoint, Position

log = logging.getLogger("kinesumer.checkpoint")


class LeaseStatus(enum.Enum):
    """Where a claim is in its life. Every transition, and who makes it::

        (claim) ──────────────► ACTIVE        leasing.Leasing: a conditional claim succeeded
        ACTIVE ──begin_handoff─► REVOKING     Checkpointer.handoff: the assignment moved the
                                              shard away, or the member is closing
        REVOKING ──release────► RELEASED      Checkpointer.handoff: the final write landed
        ACTIVE ──finish───────► RELEASED      Checkpointer.finish: SHARD_END reached, every
                                              record processed, written ``finished``
        ACTIVE/REVOKING ─fence─► LOST         delivery.Cursor (any thread): the fence passed
                                              while delivering; records are being dropped
        ACTIVE/REVOKING ─lose──► LOST         Checkpointer.lose: a write was refused, or the
                                              heartbeats failed (membership's fence)

    RELEASED and LOST are final: a shard claimed again gets a new claim.
    """

    ACTIVE = "active"  # claimed: fetching and delivering
    REVOKING = "revoking"  # moving away gracefully: no more deliveries, finishing the in-hand one
    LOST = "lost"  # someone else owns it now: drop everything buffered
    RELEASED = "released"  # handed back (or finished) with its checkpoint written


class Claim:
    """This member's ownership of one shard, from a successful claim until release or loss.

    Read its fields freely; change them only through its methods (group side, on the loop;
    :meth:`fence` from any thread).
    """

    __slots__ = (
        "__weakref__",
        "_loss_handled",
        "checkpoint",
        "checkpointed",
        "done_written",
        "finished",
        "inherited",
        "lock",
        "status",
    )

    def __init__(self, checkpoint: Checkpoint) -> None:
        #: The item as claimed: its owner and lease number fence every later write.
        self.checkpoint = checkpoint
        self.status = LeaseStatus.ACTIVE
        #: The position last written to the checkpoint (where the claim resumed, at first).
        self.checkpointed: Position | None = resumed_at(checkpoint)
        #: Checkpointed finished (SHARD_END reached and every record processed).
        self.finished = False
        #: The ``done`` attribute the checkpoint item holds (as claimed, then as last written).
        self.done_written = checkpoint.done
        #: The previous owner's done runs above the claimed position (empty when they do not
        #: apply): the read side skips those records and writes the runs back until passed.
        self.inherited: tuple[Run, ...] = _inherited_runs(checkpoint)
        #: Orders status changes against the read side's "still deliverable? then delivered"
        #: (see the module docstring): taken by this claim and by its progress.
        self.lock = threading.Lock()
        self._loss_handled = False

    def __repr__(self) -> str:
        return f"Claim({self.checkpoint!r}, status={self.status.value})"

    @property
    def key(self) -> tuple[str, str]:
        return (self.checkpoint.stream, self.checkpoint.shard_id)

    @property
    def deliverable(self) -> bool:
        return self.status is LeaseStatus.ACTIVE

    # -- the checkpointer's writes (on the engine's loop) --------------------------------------
    def mark_checkpointed(self, position: Position | None) -> None:
        """A checkpoint write landed with ``position`` (the checkpointer, an exactly-once sink's
        commit, a sink saying where reading resumes). Sets ``checkpointed``."""
        self.checkpointed = position

    def mark_done_written(self, blob: bytes) -> None:
        """Checkpointer: a write landed with this ``done`` attribute."""
        self.done_written = blob

    # -- status transitions ----------------------------------------------------------------------
    def fence(self) -> None:
        """Cursor (any thread): the fence passed while delivering; stop delivering at once
        (status LOST). The checkpointer's :meth:`lose` does the rest on the engine's loop."""
        with self.lock:
            self.status = LeaseStatus.LOST

    def begin_handoff(self) -> bool:
        """ACTIVE → REVOKING: no more deliveries. False (nothing changed) when the claim already
        ended (LOST or RELEASED). The caller stops the fetcher."""
        with self.lock:
            if self.status in (LeaseStatus.LOST, LeaseStatus.RELEASED):
                return False
            self.status = LeaseStatus.REVOKING
        return True

    def release(self) -> None:
        """REVOKING → RELEASED: the handoff's final write (checkpoint, owner cleared) landed."""
        with self.lock:
            self.status = LeaseStatus.RELEASED

    def finish(self) -> None:
        """ACTIVE → RELEASED with ``finished``: the shard was checkpointed finished."""
        with self.lock:
            self.status = LeaseStatus.RELEASED
            self.finished = True

    def lose(self) -> bool:
        """→ LOST: another member owns the shard now; no more deliveries. True the first time
        only (the caller then stops the fetcher and tells the hooks); False once handled or
        when the claim was already released."""
        if self.status is LeaseStatus.RELEASED or self._loss_handled:
            return False
        self._loss_handled = True
        self.fence()
        return True


def resumed_at(checkpoint: Checkpoint) -> Position | None:
    """The position a claim of ``checkpoint`` resumes after (None: the shard's start)."""
    start = checkpoint.sequence_number
    return None if start is None else Position(start, checkpoint.sub_sequence_number)


def _inherited_runs(checkpoint: Checkpoint) -> tuple[Run, ...]:
    """The previous owner's done runs, if they were written with the position the checkpoint
    holds now (else a writer that knows nothing of them moved it: ignored)."""
    if not checkpoint.done:
        return ()
    try:
        base, runs = done_ranges.decode(checkpoint.done)
    except ValueError as exc:
        log.warning("%s/%s: done runs ignored (%s)", checkpoint.stream, checkpoint.shard_id, exc)
        return ()
    if base != resumed_at(checkpoint):
        return ()
    return tuple(runs)


class ReadProgress(Protocol):
    """What the group side reads of a lease's read progress (the read side implements it):
    the checkpointer writes ``processed`` and :meth:`done_marks`, waits on ``in_hand`` for a
    handoff and on ``drained`` to finish a shard, and stops the fetcher when the claim ends;
    the member reports the rest in its stats and client item."""

    @property
    def processed(self) -> Position | None: ...
    @property
    def in_hand(self) -> bool: ...
    @property
    def drained(self) -> bool: ...
    @property
    def reached_end(self) -> bool: ...
    @property
    def millis_behind(self) -> int | None: ...
    @property
    def caught_up(self) -> bool: ...
    @property
    def efo_stalls(self) -> int: ...
    @property
    def efo_polling(self) -> bool: ...

    def done_marks(self) -> tuple[Position | None, list[Run]]:
        """The position to write and the runs of done records above it, read together."""
        ...

    def stop_fetching(self) -> None:
        """Cancel the task reading the shard, if any (the claim ended or the member failed)."""
        ...


ProgressT = TypeVar("ProgressT", bound=ReadProgress)
ProgressT_co = TypeVar("ProgressT_co", bound=ReadProgress, covariant=True)

#: How a member makes the read progress of a claim it just made.
NewProgress = Callable[[Claim], ProgressT]


class Lease(Generic[ProgressT_co]):
    """A claim and the read progress under it: the two are created together (when the claim
    succeeds) and never re-paired."""

    __slots__ = ("claim", "progress")

    def __init__(self, claim: Claim, progress: ProgressT_co) -> None:
        self.claim = claim
        self.progress = progress

    def __repr__(self) -> str:
        return f"Lease({self.claim!r}, {self.progress!r})"

    @property
    def key(self) -> tuple[str, str]:
        return self.claim.key


async def wait_for_parents(
    claim: Claim, parents_finished: Callable[[], Awaitable[bool]], interval: float
) -> bool:
    """Parents before children: poll until every parent of the shard is checkpointed finished.
    False when the claim ended meanwhile."""
    while claim.deliverable and not await parents_finished():  # noqa: ASYNC110 (polls DynamoDB)
        await asyncio.sleep(interval)
    return claim.deliverable
