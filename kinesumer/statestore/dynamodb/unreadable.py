"""What a member could not read back from the state table, and skipped.

Any app with write access to a shared table can write any item (the Terraform consumer policy
scopes each app to its own keys; a hand-made policy may not). A member that stopped at the first
item it cannot decode would let one app stop another, and a restart would stop again. So readers
skip such items and report them here instead: each is logged once (at WARNING, naming the item
and what is wrong) and counted once in ``consumer.stats().corrupt_state_items`` and the
``kinesumer_corrupt_state_items`` metric; a shard whose checkpoint is unreadable is listed in
``consumer.stats().unreadable_shards`` for as long as it stays so, and is not read.
"""

from __future__ import annotations

import logging

from ...aws import RequestStats
from ...errors import CorruptStateError

log = logging.getLogger("kinesumer.statestore")

#: Distinct unreadable items remembered (to log and count each once); past it the memory starts
#: over (they are logged again) rather than growing with what another app writes.
MAX_REMEMBERED = 10_000


class Unreadable:
    """The unreadable items one member met, reported to its ``stats``."""

    def __init__(self, stats: RequestStats) -> None:
        self._stats = stats
        self._reported: set[tuple[str | None, str | None, str]] = set()
        self._checkpoints: set[tuple[str, str]] = set()

    def skip(self, kind: str, error: CorruptStateError) -> None:
        """An item of ``kind`` (client, checkpoint, shard_cache, view) was skipped."""
        key = (error.pk, error.sk, str(error))
        if key in self._reported:
            return
        if len(self._reported) >= MAX_REMEMBERED:
            self._reported.clear()
        self._reported.add(key)
        log.warning("skipping an unreadable %s item: %s", kind, error)
        self._stats.corrupt_item(kind)

    def checkpoint(self, stream: str, shard_id: str, error: CorruptStateError | None) -> None:
        """The checkpoint of ``stream/shard_id`` was read: unreadable (``error``), or readable
        or absent (None: a repaired or deleted one may be read again)."""
        key = (stream, shard_id)
        if error is None:
            if key in self._checkpoints:
                self._checkpoints.discard(key)
                self._stats.shard_unreadable(f"{stream}/{shard_id}", None)
                log.info("the checkpoint of %s/%s reads back again", stream, shard_id)
            return
        self.skip("checkpoint", error)
        if key not in self._checkpoints and len(self._checkpoints) < MAX_REMEMBERED:
            self._checkpoints.add(key)
            self._stats.shard_unreadable(f"{stream}/{shard_id}", str(error))

    def checkpoint_unreadable(self, stream: str, shard_id: str) -> bool:
        """Whether the last read of this shard's checkpoint could not decode it."""
        return (stream, shard_id) in self._checkpoints

    def shards_of(self, stream: str) -> set[str]:
        """The shards of ``stream`` whose checkpoint was unreadable at its last read."""
        return {shard_id for s, shard_id in self._checkpoints if s == stream}
