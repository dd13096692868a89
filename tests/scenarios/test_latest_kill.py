"""A member process SIGKILLed before its first checkpoint at the default ``LATEST`` (issue 17,
item 1b): the next owner reads from where the dead member began, so nothing written after that
is lost. Member processes (``tests/support/member.py``) on kinesalite + dynalite, as in
``test_scenarios.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.scenario import FAST, Scenario, assert_nothing_lost
from support.standins import NodeStandIn

pytestmark = pytest.mark.slow

Names = Callable[[str], str]


@pytest.fixture
def world(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names, tmp_path: Path
) -> Iterator[Scenario]:
    scenario = Scenario(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"), tmp_path
    )
    scenario.create_table()
    try:
        yield scenario
    finally:
        scenario.close()


def test_sigkill_before_the_first_checkpoint_at_latest_loses_nothing(
    world: Scenario, unique_name: Names
) -> None:
    stream = unique_name("s")
    shards = {f"{stream}/{s}" for s in world.create_stream(stream, 2)}
    slow_commits = {**FAST, "commit_interval": 600}  # no checkpoint before the kill
    latest = ["--initial-position", "LATEST"]
    first = world.start_member("m1", [stream], config=slow_commits, extra=latest)
    world.wait_balanced([first], shards)
    # Its fetchers opened their LATEST iterators: a record written before that is legitimately
    # not read by anyone. Each records where its read began right after opening it.
    world.wait(
        lambda: sum(c["started_at"] is not None for c in world.checkpoints(stream).values()) == 2,
        60,
        "both LATEST reads begun (their starts recorded)",
    )
    producer = world.producer(stream).start()
    world.wait(lambda: len(first.deliveries()) >= 50, 60, "the first member reading")
    first.kill()
    checkpoints = world.checkpoints(stream)
    assert all(not c.get("sequence_number") for c in checkpoints.values()), checkpoints
    second = world.start_member("m2", [stream], config=slow_commits, extra=latest)
    world.wait_balanced([second], shards)
    world.wait(lambda: len(second.deliveries()) >= 50, 60, "the second member reading")
    produced = producer.stop()
    world.wait_delivered(produced)
    second.terminate()
    assert second.wait(60) == 0, second.describe()
    assert_nothing_lost(produced, world.deliveries())
