"""At the default ``initial_position="LATEST"``, a lease lost before its first checkpoint (issue
17, item 1b): member A is cut off from the state table while it holds records its application
has not polled yet, so its heartbeat stops, B judges it dead and takes its shards over. Nothing
was ever checkpointed; B must read from where A began, not from B's own LATEST, and A, back on
the table, rejoins without losing what arrived meanwhile (kinesalite + dynalite, A's
DynamoDB through the fault proxy, which holds its requests unanswered).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.faultproxy import Fault, FaultProxy
from support.group import Member, create_stream, datas, make_config, put, state_store
from support.group import setup_table as create_table
from support.wait import eventually

from kinesumer import Record

Names = Callable[[str], str]


async def test_a_lease_lost_before_the_first_checkpoint_loses_nothing(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Names,
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    table_proxy = fault_proxy(dynalite.url)
    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        initial_position="LATEST",
        commit_interval=600,  # no checkpoint unless a handoff writes one
    )
    create_table(config)
    url, stream = kinesalite.url, unique_name("s")
    create_stream(url, stream, 2)
    sink: list[tuple[str, Record]] = []
    first = Member(config.replace(client_id="a", dynamodb_endpoint=table_proxy.url), [stream], sink)
    await first.consumer.subscribe([stream])  # joined, reading; the application polls later
    await eventually(
        lambda: sum(s.caught_up for s in first.consumer.stats().shards) == 2,
        what="both shards read at the tip",
    )
    produced = put(url, stream, 0, 60)
    await eventually(lambda: first.consumer.stats().buffered_records >= 60, what="A fetched")

    cut = table_proxy.add_rule(Fault.blackhole(), service="dynamodb")
    second = Member(config.replace(client_id="b"), [stream], sink).start()
    await eventually(lambda: len(second.owned()) == 2, timeout=30, what="B took both shards")
    async with state_store(config) as store:
        checkpoints = await store.get_checkpoints(stream)
    assert all(c.sequence_number is None for c in checkpoints.values())  # never checkpointed
    produced += put(url, stream, 60, 20)
    await eventually(lambda: set(datas(sink)) >= set(produced), timeout=60, what="every record")

    cut.remove()  # A is back on the table: its stale leases are fenced, it rejoins
    first.start()  # A's application polls at last (what it hands out now is a duplicate)
    await eventually(
        lambda: len(first.owned()) + len(second.owned()) == 2 and len(first.owned()) < 2,
        timeout=30,
        what="the shards held once between A and B",
    )
    produced += put(url, stream, 80, 20)
    await eventually(lambda: set(datas(sink)) >= set(produced), timeout=60, what="the rest")
    await first.close()
    await second.close()
    assert set(datas(sink)) == set(produced)
    assert first.error is None and second.error is None
