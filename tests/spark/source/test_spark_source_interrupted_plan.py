"""A query stopped while its driver plans or settles a batch still hands its shards over at
once, and a batch Spark committed is still checkpointed whole.

``query.stop()`` ends the source worker with SIGTERM, which the worker turns into
``SystemExit``; landing inside ``latestOffset`` after the member began a shard's batch and before
the planner recorded that batch, it left a begin nobody would complete or abandon: the leave then
waited ``handoff_timeout`` for that shard (a plain member of the group got it only then; CI saw
it still owned 5 s after the stop). The planner with its real member on kinesalite + dynalite;
the SIGTERM is raised where it can land, after the begins. A settle cut short between two
shards' completes: the leave completes the rest at their ledger ends (abandoned, the group's
other members would read that committed batch's records of them again)."""

from __future__ import annotations

import asyncio
import pickle
import threading
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.spark_fakes import SoloMember
from support.spark_source import checkpoints
from support.wait import wait_until

from kinesumer.spark.source.driver.planner import Planner
from kinesumer.spark.source.executor.read import read_records
from kinesumer.spark.source.offsets import SourceOffset
from kinesumer.spark.source.options import SourceOptions

#: Long, so a leave that waits for it cannot pass for one that does not.
HANDOFF_TIMEOUT = 300.0
#: How long the leave may take here: seconds of DynamoDB writes, far under HANDOFF_TIMEOUT.
LEAVE_BOUND = 60.0


def test_a_sigterm_after_the_begins_of_a_plan_does_not_hold_the_leave(
    kinesalite: Any, dynalite: Any, unique_name: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        handoff_timeout=HANDOFF_TIMEOUT,
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 10)
    planner = Planner(SourceOptions(config=config, streams=(stream,), shared_group=True))
    planner.initial_offset()
    origin = SourceOffset(planner.query or "", 0).to_json()
    wait_until(
        lambda: len([i for i in checkpoints(config, stream).values() if "owner" in i]) == 2,
        30,
        "the query's member claiming both shards",
    )
    begun: list[Any] = []

    def sigterm(start: Any, starts: dict[Any, Any], *args: Any) -> None:
        begun.extend(starts)
        raise SystemExit(143)  # what the worker's SIGTERM handler raises

    monkeypatch.setattr(planner, "_plan", sigterm)
    with pytest.raises(SystemExit):
        planner.latest_offset(origin, None)  # begins both shards, then the signal lands
    assert len(begun) == 2
    # A daemon: on a regression the leave waits HANDOFF_TIMEOUT, and must not hold the exit.
    leaving = threading.Thread(target=planner.close, name="leave", daemon=True)
    leaving.start()
    leaving.join(LEAVE_BOUND)
    assert not leaving.is_alive(), "the leave waited for a batch that was never planned"
    items = checkpoints(config, stream)
    assert len(items) == 2 and all("owner" not in item for item in items.values()), items


def test_a_sigterm_between_the_completes_of_a_committed_batch_completes_the_rest_at_the_leave(
    kinesalite: Any, dynalite: Any, unique_name: Any
) -> None:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 20)
    members: list[SoloMember] = []

    def factory(config: Any) -> SoloMember:
        members.append(SoloMember(config))
        return members[-1]

    planner = Planner(SourceOptions(config=config, streams=(stream,)), factory)  # type: ignore[arg-type]
    planner.initial_offset()
    origin = SourceOffset(planner.query or "", 0).to_json()
    first = planner.latest_offset(origin, None)
    assert len(first["shards"]) == 2
    for partition in planner.partitions(first):  # the executors read batch 1
        asyncio.run(read_records(pickle.loads(pickle.dumps(partition))))
    member = members[-1]
    complete = member.complete
    completes: list[Any] = []

    def cut_short(key: Any, position: Any, *, finished: bool = False) -> bool:
        completes.append(key)
        if len(completes) == 2:
            raise SystemExit(143)  # the SIGTERM lands as the second shard is completed
        return complete(key, position, finished=finished)

    member.complete = cut_short  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        planner.commit(first)  # Spark committed batch 1
    member.complete = complete  # type: ignore[method-assign]
    ends = {key: entry.end for key, entry in planner.io.batch(first["batch"]).items()}
    planner.close()
    assert member.closed
    assert len(ends) == 2 and all(end is not None for end in ends.values())
    assert member.positions == ends  # both checkpointed at batch 1's end, none abandoned
    assert not [call for call in member.calls if call[0] == "abandon"]
    assert sum(member.begun.values()) == 0
