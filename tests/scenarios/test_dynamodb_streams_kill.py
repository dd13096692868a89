"""A group of two member processes (``tests/support/member.py``) reading a DynamoDB table's
stream by its ARN on moto in server mode (issue 38), while writers put, update and delete 200
items; the member reading the stream is killed with SIGKILL mid-way. Every change is delivered,
each item's changes in order, and a change is delivered twice only when the killed member had
delivered it after its last checkpoint (the uncheckpointed tail the next owner reads again).

moto gives a table's stream one shard, so one member reads and the other is a hot standby that
takes the shard over once the killed member's heartbeat is older than ``client_timeout``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.scenario import Delivery, MemberProcess, Scenario, by_record, first_deliveries
from support.table_streams import TableChanges, create_streamed_table, numbered

from kinesumer.dynamodb_streams import change

pytestmark = pytest.mark.slow

Names = Callable[[str], str]
ITEMS = 200


@pytest.fixture
def world(moto_url: str, unique_name: Names, tmp_path: Path) -> Iterator[Scenario]:
    scenario = Scenario(moto_url, moto_url, unique_name("app"), unique_name("state"), tmp_path)
    scenario.create_table()
    try:
        yield scenario
    finally:
        scenario.close()


class Writer:
    """Writes the changes of its items from a thread: a put, an update of every second item, a
    delete of every third, item after item. Before its ``pause_at``-th item it waits for
    :attr:`go`, so that the rest is written while the test kills a member."""

    def __init__(self, changes: TableChanges, items: range, pause_at: int, go: threading.Event):
        self.changes, self.items, self.pause_at, self.go = changes, items, pause_at, go
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"writer-{items.start}")

    def _run(self) -> None:
        try:
            for i, n in enumerate(self.items):
                if i == self.pause_at and not self.go.wait(120):
                    raise AssertionError("never told to write the second half")
                self.changes.put(f"k{n}", **numbered(n))
                if n % 2 == 0:
                    self.changes.update(f"k{n}", name=f"renamed {n}", n=n * 10)
                if n % 3 == 0:
                    self.changes.delete(f"k{n}")
        except BaseException as exc:  # re-raised by join()
            self.error = exc

    def join(self) -> None:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "a writer never finished"
        if self.error is not None:
            raise AssertionError(f"a writer failed: {self.error!r}") from self.error


def item_changes(deliveries: list[Delivery]) -> dict[str, list[tuple[str, Any, Any]]]:
    """Each item's changes, as first delivered across members, in delivery order."""
    seen: dict[str, list[tuple[str, Any, Any]]] = {}
    for d in first_deliveries(deliveries):
        c = change(d.data)
        seen.setdefault(c.keys["pk"], []).append((c.event_name, c.new_image, c.old_image))
    return seen


def test_a_killed_member_of_a_table_stream_group_loses_no_change_and_keeps_item_order(
    world: Scenario, unique_name: Names
) -> None:
    table = unique_name("items")
    arn = create_streamed_table(world.dynamodb_url, table)
    changes = TableChanges(world.dynamodb_url, table)
    members = [world.start_member(m, [arn]) for m in ("m1", "m2")]

    def reader() -> MemberProcess | None:
        """The one member owning the shard once both see both live (before, the first to
        join holds it until the assignment of two moves it)."""
        seen = [m.last_event("owned") for m in members]
        if any(e is None or sorted(e["live"]) != ["m1", "m2"] for e in seen):
            return None
        owners = [m for m in members if m.owned()]
        return owners[0] if len(owners) == 1 else None

    world.wait(lambda: reader() is not None, 90, "one member of two reading the table's stream")
    go = threading.Event()
    writers = [Writer(changes, range(w, ITEMS, 2), ITEMS // 4, go) for w in (0, 1)]
    for writer in writers:
        writer.thread.start()
    try:
        # Half the items written, some of them read and checkpointed: the rest is written
        # during the kill.
        def mid_way() -> bool:
            r = reader()
            if r is None or len(r.deliveries()) < 100:
                return False
            saved = world.checkpoints(arn).values()
            return any(c["owner"] == r.client_id and c["sequence_number"] for c in saved)

        world.wait(mid_way, 90, "the reader mid-way, a checkpoint written")
        killed = reader()
        assert killed is not None
        go.set()
        killed_at = time.monotonic()  # members on this machine share CLOCK_MONOTONIC
        killed.kill()
    finally:
        go.set()
        for writer in writers:
            writer.join()
    survivor = next(m for m in members if m is not killed)
    world.wait(
        lambda: len(by_record(world.deliveries())) >= changes.count,
        120,
        f"all {changes.count} changes delivered",
    )
    survivor.terminate()
    assert survivor.wait(60) == 0, survivor.describe()

    deliveries = world.deliveries()
    assert changes.count == ITEMS + ITEMS // 2 + (ITEMS + 2) // 3
    assert item_changes(deliveries) == changes.expected  # none lost, none extra, item order
    assert len(by_record(deliveries)) == changes.count
    # Read again only what the killed member delivered last, after its last checkpoint: the
    # survivor's first records after the kill are a tail of the killed member's, each once,
    # then only new ones; before the kill (a graceful handoff at the join), none of them.
    mine = [d.record_id for d in killed.deliveries()]
    before = {d.record_id for d in survivor.deliveries() if d.mono < killed_at}
    theirs = [d.record_id for d in survivor.deliveries() if d.mono >= killed_at]
    assert len(set(mine)) == len(mine) and len(set(theirs)) == len(theirs)
    assert not before & set(mine), "a graceful handoff delivered a change twice"
    again = [r for r in theirs if r in set(mine)]
    assert again == theirs[: len(again)], "the survivor read again a change it was not first to"
    assert again == mine[len(mine) - len(again) :], "read again more than the unsaved tail"
    assert len(again) < len(mine), "the killed member's checkpoints were not used"
