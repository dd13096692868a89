"""A shard handed over twice in a row with done runs above its checkpoint (issue 17 review),
through the real checkpoint writes on dynalite: A writes runs above its mark; B inherits them,
passes part of a run (only that much was fetched) and hands off; C must still skip every record
A or B finished, and nothing else.

B's mark then stops inside a run it inherited. That run used to be written as it was, starting
below the mark: the encoding's first gap came out negative, every reader refused the attribute,
and C handled again every record of every run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.group import make_config, setup_table, state_store

from kinesumer.group.checkpointer import Checkpointer
from kinesumer.handlers.progress import LowWater
from kinesumer.models import Position, Record
from kinesumer.read.progress import shard_lease

SEQ = 49_600_000_000_000_000_000_000_000_000


def record(n: int) -> Record:
    return Record("s", "shard-0", str(SEQ + n), 0, "k", b"", None)


def key(n: int) -> tuple[int, int]:
    return (SEQ + n, 0)


async def test_a_run_passed_in_part_is_still_skipped_by_the_third_owner(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]
) -> None:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    async with state_store(config) as store:
        # A: checkpoint at 100, 101 undone (an abandoned call), 102-110 and 115-120 done.
        claimed = await store.claim("s", "shard-0", "a", None)
        assert claimed is not None
        a = shard_lease(claimed)
        a.progress.set_done_source(
            lambda: (Position(str(SEQ + 100)), [(key(102), key(110)), (key(115), key(120))])
        )
        assert await Checkpointer(store, "a").write(a, release=True)
        # B: handles 101, passes 102-107 as done (its fetch got that far), hands off.
        seen = (await store.get_checkpoints("s", ["shard-0"]))["shard-0"]
        claimed = await store.claim("s", "shard-0", "b", seen)
        assert claimed is not None
        b = shard_lease(claimed)
        assert b.progress.skipping
        tracker = LowWater(b)
        own = []
        for n in range(101, 108):
            assert b.progress.mark_delivered(record(n))
            if b.progress.skipping and b.progress.already_done(record(n)):
                tracker.finish(tracker.admit(record(n)))
            else:
                own.append(tracker.admit(record(n)))
        assert len(own) == 1
        tracker.finish(own[0])
        assert b.progress.processed == Position(str(SEQ + 107))
        assert await Checkpointer(store, "b").write(b, release=True)
        # C: resumes after 107 and skips exactly what A and B finished.
        seen = (await store.get_checkpoints("s", ["shard-0"]))["shard-0"]
        assert seen.sequence_number == str(SEQ + 107)
        claimed = await store.claim("s", "shard-0", "c", seen)
        assert claimed is not None
        c = shard_lease(claimed)
        assert c.progress.skipping, "C ignores the done runs B wrote (unreadable)"
        skipped = [n for n in range(108, 125) if c.progress.already_done(record(n))]
        assert skipped == [108, 109, 110, *range(115, 121)]
