"""A group of member processes (``tests/support/member.py``) reading three streams named
``orders`` by ARN, in two accounts and two regions, on moto in server mode (issue 36): account
A's (the caller's, 123456789012) in us-east-1 (the home: its items under the plain name) and in
eu-west-1, and account B's in us-east-1, read through a role of B (``--account``: the members'
``Config.accounts``) assumed with moto's STS (``--sts-endpoint``: the members' ``sts_endpoint``).

While a producer thread writes to all three, one member is killed with SIGKILL (no handoff, no
final checkpoint, its heartbeat stops mid-flight), a third joins, and B's stream is resharded
(its first shard split). Every record is delivered; each member delivers each key of each stream
in order, and across members each key's records are first delivered in order; a record is
delivered twice only when the killed member had delivered it after its last checkpoint (the next
owner reads that tail again); the state table's checkpoint items are partitioned by stream
exactly: the home stream's under its plain name, the other two under their ARNs, each shard of
each stream once.

It takes about 20 s (more on a busy machine): three member processes start (a Python process
importing the library and joining a group takes seconds), a killed member is seen dead only once
its heartbeat is older than ``client_timeout`` (2 s here), and the shards move at the kill, the
join and the reshard, each move waiting for a lease or a handoff, on moto's Python server.

moto's own SplitShard moves the parent's records into the children and never ends the parent:
:func:`support.moto_reshard.aws_like_splits` makes it split as Kinesis does for this test.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from support.accounts import A, B, arn, role_in_b, three_places
from support.moto_reshard import aws_like_splits
from support.scenario import (
    Delivery,
    MemberProcess,
    Scenario,
    by_record,
    first_deliveries,
    key_of,
)

pytestmark = pytest.mark.slow

Names = Callable[[str], str]
ROLE_B = role_in_b("orders-reader")
SHARDS = 2
PLACES = ("a-us", "a-eu", "b-us")


class ThreePlaceProducer:
    """Writes numbered records (data ``b"<n>"``, key :func:`key_of`, numbers counted per stream)
    to the three places from a thread: ``batch`` records to each every ``interval`` seconds with
    PutRecords. Hold :attr:`gate` to pause it (taken around each round of three PutRecords)."""

    def __init__(self, clients: dict[str, Any], name: str, batch: int = 5, interval: float = 0.25):
        self.clients, self.name, self.batch, self.interval = clients, name, batch, interval
        self.gate = threading.Lock()
        self.produced: dict[str, list[int]] = {place: [] for place in clients}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="producer-3", daemon=True)

    def start(self) -> ThreePlaceProducer:
        self._thread.start()
        return self

    def count(self) -> int:
        with self.gate:
            return sum(len(n) for n in self.produced.values())

    def put(self) -> None:
        with self.gate:
            for place, client in self.clients.items():
                first = len(self.produced[place])
                numbers = list(range(first, first + self.batch))
                answer = client.put_records(
                    StreamName=self.name,
                    Records=[{"Data": str(n).encode(), "PartitionKey": key_of(n)} for n in numbers],
                )
                assert not answer.get("FailedRecordCount"), answer
                self.produced[place] += numbers

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.put()
        except BaseException as exc:  # re-raised by stop()
            self._error = exc

    def stop(self) -> dict[str, list[int]]:
        self._stop.set()
        self._thread.join(timeout=60)
        if self._error is not None:
            raise AssertionError(f"the producer failed: {self._error!r}") from self._error
        return self.produced


@pytest.fixture
def world(
    moto_url: str, unique_name: Names, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Scenario]:
    aws_like_splits(monkeypatch)  # moto's own split moves records and never ends the parent
    scenario = Scenario(moto_url, moto_url, unique_name("app"), unique_name("state"), tmp_path)
    scenario.create_table()
    try:
        yield scenario
    finally:
        scenario.close()  # every member process, each by its own pid


def split_first_shard(client: Any, name: str) -> tuple[str, list[str]]:
    """Split the stream's first shard at the middle of its hash range: the parent's id and the
    children's."""
    before = {s["ShardId"] for s in client.list_shards(StreamName=name)["Shards"]}
    shard = client.list_shards(StreamName=name)["Shards"][0]
    low, high = (int(shard["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    client.split_shard(
        StreamName=name, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1})
    after = {s["ShardId"] for s in client.list_shards(StreamName=name)["Shards"]}
    return shard["ShardId"], sorted(after - before)


def checkpoint_items(world: Scenario) -> dict[str, dict[str, dict[str, Any]]]:
    """Every checkpoint item of the app, by partition (the stream's state key), then shard."""
    client = boto3.client("dynamodb", endpoint_url=world.dynamodb_url, region_name="us-east-1")
    prefix = f"check_point#{world.app}#"
    found: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    kwargs: dict[str, Any] = {"TableName": world.table, "ConsistentRead": True}
    while True:
        answer = client.scan(**kwargs)
        for item in answer["Items"]:
            pk = item["pk"]["S"]
            if pk.startswith(prefix):
                found[pk[len(prefix) :]][item["sk"]["S"]] = {
                    "sequence_number": item.get("sequence_number", {}).get("S"),
                    "owner": item.get("owner", {}).get("S"),
                    "finished": bool(item.get("finished", {}).get("BOOL", False)),
                }
        if "LastEvaluatedKey" not in answer:
            return dict(found)
        kwargs["ExclusiveStartKey"] = answer["LastEvaluatedKey"]


def numbers_by_stream(deliveries: list[Delivery]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = defaultdict(set)
    for d in deliveries:
        found[d.stream].add(d.number)
    return found


def test_a_killed_member_of_a_group_reading_three_accounts_and_regions_loses_nothing(
    world: Scenario, unique_name: Names, moto_url: str
) -> None:
    name = unique_name("orders")
    clients = three_places(moto_url, name, ROLE_B, shards=SHARDS)
    arns = {
        "a-us": arn("us-east-1", A, name),
        "a-eu": arn("eu-west-1", A, name),
        "b-us": arn("us-east-1", B, name),
    }
    streams = [arns[p] for p in PLACES]
    place_of = {a: p for p, a in arns.items()}
    extra = ["--sts-endpoint", moto_url, "--account", f"{B}={ROLE_B}"]

    def start(client_id: str) -> MemberProcess:
        return world.start_member(client_id, streams, extra=extra)

    def shard_ids(place: str) -> set[str]:
        return {s["ShardId"] for s in clients[place].list_shards(StreamName=name)["Shards"]}

    all_shards = frozenset(f"{arns[p]}/{s}" for p in PLACES for s in shard_ids(p))
    assert len(all_shards) == SHARDS * 3
    producer = ThreePlaceProducer(clients, name)
    first, second = start("m1"), start("m2")
    world.wait_balanced([first, second], all_shards, 120)
    producer.start()
    try:
        # m1 mid-stream: records of its own delivered, a checkpoint of its saved; the kill
        # comes while the producer writes on.
        def mid_way() -> bool:
            if len(first.deliveries()) < 60:
                return False
            saved = checkpoint_items(world).values()
            return any(
                c["owner"] == "m1" and c["sequence_number"]
                for items in saved
                for c in items.values()
            )

        world.wait(mid_way, 90, "m1 reading, a checkpoint of its saved")
        killed_at = time.monotonic()  # members on this machine share CLOCK_MONOTONIC
        first.kill()
        third = start("m3")
        world.wait_balanced([second, third], all_shards, 120)

        # B's stream reshards while the group reads on: no record written during the split.
        with producer.gate:
            parent, children = split_first_shard(clients["b-us"], name)
        assert len(children) == 2
        world.wait(
            lambda: (
                {f"{arns['b-us']}/{c}" for c in children}
                <= {f"{d.stream}/{d.shard_id}" for d in world.deliveries()}
            ),
            90,
            "records of both of B's new shards delivered",
        )
    finally:
        produced = producer.stop()
    world.wait(
        lambda: all(
            set(produced[place_of[s]]) <= numbers_by_stream(world.deliveries()).get(s, set())
            for s in streams
        ),
        120,
        f"all {sum(len(n) for n in produced.values())} records delivered",
    )
    for survivor in (second, third):
        survivor.terminate()
    for survivor in (second, third):
        assert survivor.wait(60) == 0, survivor.describe()
        assert not survivor.errors(), survivor.describe()

    deliveries = world.deliveries()
    # Nothing lost, nothing unknown; records name each stream as the members named it.
    assert set(numbers_by_stream(deliveries)) == set(streams)
    for stream, numbers in numbers_by_stream(deliveries).items():
        assert numbers == set(produced[place_of[stream]]), stream
    # Each member delivered each key of each stream in order (a member never read a shard
    # again from an older checkpoint of its own) ...
    for member in world.members:
        last: dict[tuple[str, str], int] = {}
        for d in member.deliveries():
            previous = last.get((d.stream, d.partition_key), -1)
            assert d.number > previous, (member.client_id, d.stream, d.partition_key, d.number)
            last[(d.stream, d.partition_key)] = d.number
    # ... and across members each key's records were first delivered in order.
    first_seen: dict[tuple[str, str], int] = {}
    for d in first_deliveries(deliveries):
        previous = first_seen.get((d.stream, d.partition_key), -1)
        assert d.number > previous, (d.client_id, d.stream, d.partition_key, d.number)
        first_seen[(d.stream, d.partition_key)] = d.number
    # Delivered twice only: by m1 before its kill, then by a survivor after it (the tail m1
    # delivered after its last checkpoint), never by a graceful handoff or the reshard.
    for record, copies in by_record(deliveries).items():
        if len(copies) > 1:
            assert len(copies) == 2, (record, [c.client_id for c in copies])
            assert copies[0].client_id == "m1" and copies[0].mono < killed_at, record
            assert copies[1].client_id != "m1" and copies[1].mono >= killed_at, record
    assert len(by_record(first.deliveries())) > len(
        [r for r, c in by_record(deliveries).items() if len(c) > 1]
    ), "the killed member's checkpoints were not used"

    # The state table: the home stream under its plain name, the others under their ARNs,
    # each shard of each stream once; B's split parent read to its end.
    items = checkpoint_items(world)
    expected = {name: shard_ids("a-us"), arns["a-eu"]: shard_ids("a-eu")}
    expected[arns["b-us"]] = shard_ids("b-us")
    assert {k: set(v) for k, v in items.items()} == expected
    assert len(expected[arns["b-us"]]) == SHARDS + 2
    assert items[arns["b-us"]][parent]["finished"]
    assert all(c["sequence_number"] for shards in items.values() for c in shards.values())
