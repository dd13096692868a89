"""A batch handler's undecodable records keep their place: the records before a bad one are
handled before its dead letter is written, the ones after it only afterwards (per-key order for
the reader of the dead-letter stream, as without batches)."""

from __future__ import annotations

import threading
from typing import Any

from support.invocation import FakeKinesis, invocation, lease, record

from kinesumer.handlers import Batch
from kinesumer.handlers.policies import DeadLetter, Retry
from kinesumer.handlers.retry_later import Item, units


def test_a_bad_payload_is_dead_lettered_between_its_neighbours() -> None:
    client = FakeKinesis()
    calls: list[tuple[list[int], int]] = []  # (ids in the call, dead letters written before it)

    def handle(messages: list[Any]) -> None:
        calls.append(([m.value["id"] for m in messages], len(client.puts)))

    made, counters = invocation(
        handle,
        client,
        batch=Batch(max_size=10),
        decode="json",
        on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=1)),
    )
    records = [
        record(b'{"id": 1}', seq="101", key="k1"),
        record(b'{"id": 2}', seq="102", key="k2"),
        record(b"not json", seq="103", key="k1"),
        record(b'{"id": 4}', seq="104", key="k1"),
    ]
    made.call_sync(records, lease(), threading.Event())
    assert calls == [([1, 2], 0), ([4], 1)]
    [dead] = client.puts
    assert dead["StreamName"] == "orders-dlq" and dead["PartitionKey"] == "k1"
    assert counters.counts["ok"] == 3 and counters.counts["dead_lettered"] == 1


def test_units_come_in_the_records_order() -> None:
    items = [
        Item(r, r) for r in (record(b"1", seq="1"), record(b"x", seq="2"), record(b"3", seq="3"))
    ]

    def decode(r: Any) -> int:
        return int(r.data)

    made = units(items, decode, True, lambda: None)
    assert [(len(u.items), u.error is not None) for u in made] == [
        (1, False),
        (1, True),
        (1, False),
    ]
    one_by_one = units(items, decode, False, lambda: None)
    assert [u.items[0].delivered.sequence_number for u in one_by_one] == ["1", "2", "3"]
