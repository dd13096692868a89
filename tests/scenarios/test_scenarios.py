"""Fault-tolerance scenarios: group members as separate OS processes on kinesalite + dynalite.

Each member is ``tests/support/member.py``, one real :class:`kinesumer.Kinesumer` that writes every
record it delivers to a file; the test process produces numbered records with known partition
keys and checks *every* record: none lost, duplicates only where the guarantees allow them (and
explained one by one), shard and key order kept. Faults are real: SIGKILL, SIGTERM, a fault proxy
between a member and a stand-in (throttling, 5xx, resets, a blackholed DynamoDB, expired
iterators), a reshard, a deleted stream, corrupt state.

Timings are shorter than the defaults (``support.scenario.FAST``: heartbeat 0.5 s, client_timeout 2
s, commit_interval 1 s). The machine is shared, so every wait is a bounded poll with a generous
deadline and nothing asserts on how long something took."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence, Set
from pathlib import Path
from typing import Any

import aws_kinesis_agg
import pytest
from support.faultproxy import Fault, FaultKind, FaultProxy, OpKey
from support.group import POSITIONS, Member, datas, make_config, put, setup_table
from support.group import create_stream as create_stream_in_process
from support.group import duplicates as in_process_duplicates
from support.scenario import (
    FAST,
    Delivery,
    MemberProcess,
    Scenario,
    assert_key_order,
    assert_nothing_lost,
    assert_shard_order_across_members,
    assert_shard_order_per_member,
    duplicates,
    dynamodb_client,
    first_deliveries,
    read_checkpoints,
    warning_lines,
)
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.consumer.base import engine_of

pytestmark = pytest.mark.slow

Names = Callable[[str], str]
ProxyFactory = Callable[[str], FaultProxy]

THROTTLE_SECONDS = 8.0
"""Scenario 5: how long (at least) 20% of GetRecords and DynamoDB writes are throttled."""
OUTAGE_SECONDS = 5.0
"""Scenario 5: then how long (at least) 5xx, resets and slow responses go on."""


@pytest.fixture
def world(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names, tmp_path: Path
) -> Iterator[Scenario]:
    """A fresh app and state table; every member and producer started through it is stopped
    (by its own pid) when the test ends, pass or fail."""
    scenario = Scenario(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"), tmp_path
    )
    scenario.create_table()
    try:
        yield scenario
    finally:
        scenario.close()


# --- helpers ------------------------------------------------------------------------------------


def shard_keys(stream: str, shard_ids: Sequence[str]) -> set[str]:
    return {f"{stream}/{s}" for s in shard_ids}


def stop_gracefully(world: Scenario, members: Sequence[MemberProcess], timeout: float = 60) -> None:
    """SIGTERM every member at once; each must exit 0 with a ``closed`` event and no error."""
    for member in members:
        member.terminate()
    for member in members:
        try:
            code = member.wait(timeout)
        except Exception as exc:
            raise AssertionError(f"{member.client_id} did not stop\n{world.describe()}") from exc
        assert code == 0, f"{member.client_id} exited {code}\n{member.describe()}"
        assert_no_errors(member)


def assert_no_errors(member: MemberProcess) -> None:
    assert member.errors() == [], member.describe()
    closed = member.last_event("closed")
    assert closed is not None and closed["code"] == 0, member.describe()


def delivered_shards(deliveries: Sequence[Delivery]) -> set[str]:
    return {f"{d.stream}/{d.shard_id}" for d in deliveries}


def read_by_others(
    world: Scenario, shards: Set[str], others: Sequence[MemberProcess], after: float
) -> bool:
    """Whether every shard in ``shards`` has a record delivered by one of ``others`` after the
    monotonic time ``after``."""
    seen = {f"{d.stream}/{d.shard_id}" for d in world.deliveries(others) if d.mono > after}
    return shards <= seen


# --- 1. a stable group --------------------------------------------------------------------------


def test_stable_group_reads_every_record_once_in_shard_order(
    world: Scenario, unique_name: Names
) -> None:
    """Three members, eight shards, a producer writing throughout (started once the group has
    settled): every record delivered exactly once, each shard in order, each member reading
    only the shards it was assigned."""
    stream = unique_name("s")
    shards = shard_keys(stream, world.create_stream(stream, 8))
    members = [world.start_member(f"m{i}", [stream]) for i in (1, 2, 3)]
    world.wait_balanced(members, shards)
    assigned = {m.client_id: m.owned() for m in members}
    producer = world.producer(stream).start()
    world.wait(lambda: producer.count >= 1200, 60, "1200 records produced")
    produced = producer.stop()
    world.wait_delivered(produced)
    stop_gracefully(world, members)

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert duplicates(deliveries) == {}
    assert_shard_order_per_member(deliveries)
    assert delivered_shards(deliveries) == shards  # every shard carried records
    for member in members:
        assert delivered_shards(member.deliveries()) <= assigned[member.client_id]


# --- 2. a crash ---------------------------------------------------------------------------------


def test_sigkilled_member_shards_taken_over_duplicates_only_after_its_checkpoint(
    world: Scenario, unique_name: Names
) -> None:
    """SIGKILL the leader mid-stream. The others take its shards from their checkpoints: nothing
    is lost, and every duplicate is a record the dead member delivered after the checkpoint that
    was in DynamoDB when it died (read right after the kill, before anyone took over)."""
    stream = unique_name("s")
    shards = shard_keys(stream, world.create_stream(stream, 8))
    members = [world.start_member(f"m{i}", [stream]) for i in (1, 2, 3)]
    world.wait_balanced(members, shards)
    victim, survivors = members[0], members[1:]  # m1: the lowest id, the leader
    theirs = victim.owned()
    producer = world.producer(stream).start()

    def victim_checkpointed() -> bool:
        found = world.checkpoints(stream)
        return all(found.get(s.split("/", 1)[1], {}).get("sequence_number") for s in theirs)

    world.wait(victim_checkpointed, 60, "the victim's first checkpoints")
    world.wait(lambda: len(victim.deliveries()) >= 150, 60, "the victim reading")

    victim.kill()
    killed_at = time.monotonic()
    at_kill = world.checkpoints(stream)  # before takeover: that takes client_timeout (2 s)
    for key in theirs:
        shard = key.split("/", 1)[1]
        assert at_kill[shard]["owner"] == victim.client_id, "read after the takeover began"

    world.wait_balanced(survivors, shards)
    world.wait(
        lambda: read_by_others(world, theirs, survivors, killed_at), 60, "its shards read again"
    )
    produced = producer.stop()
    world.wait_delivered(produced)
    stop_gracefully(world, survivors)

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert_shard_order_per_member(deliveries)
    assert_shard_order_across_members(deliveries)
    replayed = duplicates(deliveries)
    for record_id, copies in replayed.items():
        stream_name, shard, sequence, _ = record_id
        first, *again = copies
        assert first.client_id == victim.client_id, f"{record_id} first delivered by {first}"
        assert len(again) == 1 and again[0].client_id != victim.client_id, copies
        assert f"{stream_name}/{shard}" in theirs
        checkpoint = at_kill[shard]["sequence_number"]
        assert checkpoint is None or int(sequence) > int(checkpoint), (
            f"{record_id} was at or before the checkpoint {checkpoint}: it should not replay"
        )
    # Conversely, everything the victim delivered after its checkpoint was replayed.
    after_checkpoint = [
        d
        for d in victim.deliveries()
        if int(d.sequence_number) > int(at_kill[d.shard_id]["sequence_number"] or 0)
    ]
    assert {d.record_id for d in after_checkpoint} == set(replayed)
    print(
        f"\nscenario 2: {len(replayed)} duplicates after SIGKILL "
        f"(victim delivered {len(victim.deliveries())}, {len(produced)} produced)"
    )


# --- 3. a graceful leave and a join -------------------------------------------------------------


def test_graceful_leave_and_join_without_duplicates(world: Scenario, unique_name: Names) -> None:
    """A member stops on SIGTERM (this one iterates the generator and is closed from another
    thread), another joins: every handoff is graceful, so no record is lost or repeated."""
    stream = unique_name("s")
    shards = shard_keys(stream, world.create_stream(stream, 8))
    m1 = world.start_member("m1", [stream])
    m2 = world.start_member("m2", [stream], api="generator")
    m3 = world.start_member("m3", [stream])
    world.wait_balanced([m1, m2, m3], shards)
    producer = world.producer(stream).start()
    world.wait(lambda: all(len(m.deliveries()) >= 50 for m in (m1, m2, m3)), 60, "all reading")

    m2.terminate()
    left_at = time.monotonic()
    assert m2.wait(60) == 0, m2.describe()
    assert_no_errors(m2)
    world.wait_balanced([m1, m3], shards)
    world.wait(lambda: read_by_others(world, m2.owned_at(left_at), [m1, m3], left_at), 60, "m2's")

    m4 = world.start_member("m4", [stream])
    world.wait_balanced([m1, m3, m4], shards)
    world.wait(lambda: delivered_shards(m4.deliveries()) >= m4.owned(), 60, "m4 reading")
    produced = producer.stop()
    world.wait_delivered(produced)
    stop_gracefully(world, [m1, m3, m4])

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert duplicates(deliveries) == {}
    assert_shard_order_per_member(deliveries)


# --- 4. split and merge -------------------------------------------------------------------------


@pytest.mark.parametrize("initial", POSITIONS)
def test_split_and_merge_parents_drained_before_children_across_members(
    world: Scenario, unique_name: Names, initial: str
) -> None:
    """Split one shard and merge two others while three members consume. For every key, every
    record written before the reshard is delivered (by whichever member) before any record
    written after it; per-key order holds; nothing is lost; the parents end ``finished``. At
    ``LATEST`` too: the children start at ``TRIM_HORIZON`` (their records follow their
    parents')."""
    stream = unique_name("s")
    roots = world.create_stream(stream, 4)
    at = ["--initial-position", initial]
    members = [world.start_member(f"m{i}", [stream], extra=at) for i in (1, 2, 3)]
    world.wait_balanced(members, shard_keys(stream, roots))
    world.wait_reading(stream, shard_keys(stream, roots), initial)
    producer = world.producer(stream).start()
    world.wait(lambda: len(world.delivered_numbers()) >= 300, 60, "300 records before")

    with producer.gate:  # nothing is written while the shards change: each record is pre or post
        boundary = producer.count
        first = world.kinesis.list_shards(StreamName=stream)["Shards"][0]
        low, high = (int(first["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        world.kinesis.split_shard(
            StreamName=stream, ShardToSplit=roots[0], NewStartingHashKey=str((low + high) // 2)
        )
        world.kinesis.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
        )
        world.kinesis.merge_shards(
            StreamName=stream, ShardToMerge=roots[1], AdjacentShardToMerge=roots[2]
        )
        world.kinesis.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
        )
    parents = set(roots[:3])
    children = set(world.shard_ids(stream)) - set(roots)
    assert len(children) == 3
    open_shards = shard_keys(stream, sorted(children | {roots[3]}))

    world.wait(lambda: producer.count >= boundary + 600, 60, "600 records after the reshard")
    world.wait(
        lambda: delivered_shards(world.deliveries()) >= open_shards, 60, "children being read"
    )
    produced = producer.stop()
    world.wait_delivered(produced)
    world.wait_balanced(members, open_shards)
    stop_gracefully(world, members)

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert duplicates(deliveries) == {}
    assert_shard_order_per_member(deliveries)
    assert_key_order(deliveries)
    firsts = first_deliveries(deliveries)
    pre: dict[str, float] = defaultdict(float)
    post: dict[str, float] = defaultdict(lambda: float("inf"))
    for d in firsts:
        if d.number < boundary:
            assert d.shard_id in parents or d.shard_id == roots[3]
            pre[d.partition_key] = max(pre[d.partition_key], d.mono)
        else:
            assert d.shard_id not in parents, f"record {d.number} came from a parent"
            post[d.partition_key] = min(post[d.partition_key], d.mono)
    for key in pre:
        assert pre[key] < post[key], f"{key}: a post-reshard record came before a pre-reshard one"
    checkpoints = world.checkpoints(stream)
    assert {s for s, c in checkpoints.items() if c["finished"]} == parents
    assert all(len(d.sequence_number) >= 50 for d in deliveries)  # 56-digit, kept as text


# --- 5. throttling, then 5xx and resets ---------------------------------------------------------


def test_throttling_then_server_errors_slow_consumption_but_lose_nothing(
    world: Scenario, unique_name: Names, fault_proxy: ProxyFactory
) -> None:
    """For 8 s, 20% of GetRecords and of DynamoDB writes are throttled, then for 5 s calls
    fail with 5xx, connection resets and slow answers (each phase also lasts until its faults
    were injected), then all is clean. The members slow down and recover by themselves:
    nothing lost, no crash, and the faults are visible to the application in
    ``stats().retries`` and as WARNING lines in the log."""
    stream = unique_name("s")
    shards = shard_keys(stream, world.create_stream(stream, 4))
    kinesis_proxy = fault_proxy(world.kinesis_url)
    dynamodb_proxy = fault_proxy(world.dynamodb_url)
    members = [
        world.start_member(
            f"m{i}", [stream], kinesis_url=kinesis_proxy.url, dynamodb_url=dynamodb_proxy.url
        )
        for i in (1, 2)
    ]
    world.wait_balanced(members, shards)
    producer = world.producer(stream, batch=10).start()

    def faults(proxy: FaultProxy, operation: str | None, *kinds: FaultKind) -> int:
        return sum(
            stats.faults[kind]
            for key, stats in proxy.stats().items()
            for kind in kinds
            if operation is None or key.operation == operation
        )

    def run_phase(seconds: float, what: str, faults_seen: Callable[[], bool]) -> None:
        """At least ``seconds``, and until the faults the assertions count were injected (on a
        slow machine fewer calls are made in a phase)."""
        ends = time.monotonic() + seconds
        world.wait(
            lambda: (
                (time.monotonic() >= ends and faults_seen()) or not all(m.running for m in members)
            ),
            seconds + 60,
            what,
        )
        for member in members:
            assert member.running, f"{member.client_id} died during {what}\n{member.describe()}"

    phases = [time.monotonic()]
    throttles = [
        kinesis_proxy.add_rule(Fault.throttle(), operation="GetRecords", rate=0.2, seed=1),
        dynamodb_proxy.add_rule(Fault.throttle(), operation="UpdateItem", rate=0.2, seed=2),
        dynamodb_proxy.add_rule(Fault.throttle(), operation="PutItem", rate=0.2, seed=3),
    ]
    run_phase(
        THROTTLE_SECONDS,
        "the throttling phase",
        lambda: (
            faults(kinesis_proxy, "GetRecords", FaultKind.THROTTLE) > 0
            and faults(dynamodb_proxy, "UpdateItem", FaultKind.THROTTLE) > 0
        ),
    )
    for rule in throttles:
        rule.remove()
    phases.append(time.monotonic())
    for seed, proxy in enumerate((kinesis_proxy, dynamodb_proxy)):
        proxy.add_rule(Fault.http_500(), rate=0.08, seed=10 + seed)
        proxy.add_rule(Fault.http_503(), rate=0.05, seed=20 + seed)
        proxy.add_rule(Fault.reset(), rate=0.05, seed=30 + seed)
        proxy.add_rule(Fault.delay(1.0), rate=0.04, seed=40 + seed)
    server_error = (FaultKind.HTTP_500, FaultKind.HTTP_503)
    run_phase(
        OUTAGE_SECONDS,
        "the 5xx/reset phase",
        lambda: (
            faults(kinesis_proxy, "GetRecords", FaultKind.RESET) > 0
            and faults(kinesis_proxy, None, *server_error)
            + faults(dynamodb_proxy, None, *server_error)
            > 0
        ),
    )
    kinesis_proxy.clear()
    dynamodb_proxy.clear()
    phases.append(time.monotonic())
    clean_from = producer.count
    world.wait(lambda: producer.count >= clean_from + 200, 60, "records in the clean phase")
    produced = producer.stop()
    world.wait_delivered(produced, timeout=120)
    phases.append(time.monotonic())
    stop_gracefully(world, members)

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert_shard_order_across_members(deliveries)
    replayed = duplicates(deliveries)
    retries: Counter[str] = Counter()
    for member in members:
        stats = member.final_stats()
        assert stats is not None, member.describe()
        retries.update(stats["retries"])
    injected = kinesis_proxy.stats()[OpKey("kinesis", "GetRecords")].faults
    assert injected[FaultKind.THROTTLE] > 0 and injected[FaultKind.RESET] > 0
    assert retries["kinesis.GetRecords:ProvisionedThroughputExceededException"] > 0, retries
    assert retries["dynamodb.UpdateItem:ProvisionedThroughputExceededException"] > 0, retries
    server_errors = sum(
        n
        for key, n in retries.items()
        if key.endswith((":InternalFailure", ":ServiceUnavailable", ":InternalServerError"))
    )
    assert server_errors > 0, retries
    logs = "".join(m.stderr_text() for m in members)
    throttled_lines = warning_lines(logs, "ProvisionedThroughputExceededException")
    assert any("GetRecords" in line for line in throttled_lines)
    assert any("dynamodb." in line for line in throttled_lines)
    rates = []
    for start, end in itertools.pairwise(phases):
        count = sum(1 for d in first_deliveries(deliveries) if start <= d.mono < end)
        rates.append(f"{count / max(end - start, 1e-9):.0f}/s")
    print(
        f"\nscenario 5: retries {dict(sorted(retries.items()))}; {len(replayed)} duplicates; "
        f"delivery rate throttled/5xx/clean: {', '.join(rates)}; {len(produced)} produced"
    )


# --- 6. cut off from DynamoDB -------------------------------------------------------------------


class CheckpointSampler:
    """Reads a stream's checkpoint items every ``interval`` seconds on a thread, to show that no
    shard's checkpoint ever moves backwards."""

    def __init__(self, world: Scenario, stream: str, interval: float = 0.2) -> None:
        self.samples: list[tuple[float, dict[str, dict[str, Any]]]] = []
        self._world, self._stream, self._interval = world, stream, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-sampler", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                self.samples.append((time.monotonic(), self._world.checkpoints(self._stream)))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> CheckpointSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def assert_never_backwards(self) -> None:
        assert self.error is None, repr(self.error)
        last: dict[str, int] = {}
        for at, items in self.samples:
            for shard, item in items.items():
                sequence = item["sequence_number"]
                if sequence is None:
                    continue
                assert int(sequence) >= last.get(shard, 0), (
                    f"{shard}: checkpoint went back from {last[shard]} to {sequence} at {at}"
                )
                last[shard] = int(sequence)


def test_member_cut_off_from_dynamodb_is_fenced_and_rejoins(
    world: Scenario, unique_name: Names, fault_proxy: ProxyFactory
) -> None:
    """m1's DynamoDB calls are blackholed longer than client_timeout. It stops delivering
    before the others take its shards (never two readers at once); its late checkpoint writes
    cannot overwrite theirs (sampled checkpoints never go backwards); when DynamoDB answers
    again it rejoins and reads again."""
    stream = unique_name("s")
    shards = shard_keys(stream, world.create_stream(stream, 6))
    proxy = fault_proxy(world.dynamodb_url)
    cut = world.start_member("m1", [stream], dynamodb_url=proxy.url)
    others = [world.start_member(f"m{i}", [stream]) for i in (2, 3)]
    members = [cut, *others]
    world.wait_balanced(members, shards)
    theirs = cut.owned()
    producer = world.producer(stream).start()

    def cut_checkpointed() -> bool:
        found = world.checkpoints(stream)
        return all(found.get(s.split("/", 1)[1], {}).get("sequence_number") for s in theirs)

    world.wait(cut_checkpointed, 60, "m1's first checkpoints")
    with CheckpointSampler(world, stream) as sampler:
        rule = proxy.add_rule(Fault.blackhole(), service="dynamodb")
        cut_at = time.monotonic()
        world.wait_balanced(others, shards)
        world.wait(lambda: read_by_others(world, theirs, others, cut_at), 60, "takeover reads")
        rule.remove()
        back_at = time.monotonic()
        world.wait_balanced(members, shards)
        world.wait(lambda: any(d.mono > back_at for d in cut.deliveries()), 60, "m1 reading again")
        produced = producer.stop()
        world.wait_delivered(produced)
    stop_gracefully(world, members)

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert_shard_order_across_members(deliveries)
    sampler.assert_never_backwards()
    assert len(sampler.samples) > 10
    for key in theirs:
        shard = key.split("/", 1)[1]
        last_by_cut = max(
            (d.mono for d in cut.deliveries() if d.shard_id == shard and d.mono < back_at),
            default=cut_at,
        )
        first_by_others = min(
            d.mono for d in world.deliveries(others) if d.shard_id == shard and d.mono > cut_at
        )
        assert last_by_cut < first_by_others, f"{key}: m1 and another member read it at once"
    replayed = duplicates(deliveries)
    for copies in replayed.values():
        # Delivered by m1 before it fenced itself (not checkpointed), then by the new owner.
        assert [c.client_id == cut.client_id for c in copies] == [True, False], copies
        assert copies[0].mono < back_at
    assert warning_lines(cut.stderr_text(), "no heartbeat has landed"), cut.describe()
    stats = cut.final_stats() or {}
    print(
        f"\nscenario 6: {len(replayed)} duplicates; m1 checkpoint conflicts (refused writes): "
        f"{stats.get('checkpoint_conflicts')}; {len(sampler.samples)} checkpoint samples"
    )


# --- 7. expired iterators -----------------------------------------------------------------------


@pytest.mark.parametrize("initial", POSITIONS)
def test_expired_iterator_resumes_after_last_record_without_replay(
    world: Scenario, unique_name: Names, fault_proxy: ProxyFactory, initial: str
) -> None:
    """GetRecords answers ExpiredIteratorException three times. With commit_interval far beyond
    the test, no checkpoint is ever written, so a resume from the checkpoint (at ``LATEST``,
    from where the read began) would replay the whole shard: reading resumes after the last
    record instead, with no duplicate."""
    stream = unique_name("s")
    shards = shard_keys(stream, world.create_stream(stream, 2))
    proxy = fault_proxy(world.kinesis_url)
    member = world.start_member(
        "m1",
        [stream],
        kinesis_url=proxy.url,
        config={**FAST, "commit_interval": 600},
        extra=["--initial-position", initial],
    )
    world.wait_reading(stream, shards, initial)
    producer = world.producer(stream)
    produced = producer.put(200)
    world.wait_delivered(produced)
    iterators = OpKey("kinesis", "GetShardIterator")
    before = proxy.stats()[iterators].forwarded
    rule = proxy.add_rule(Fault.expired_iterator(), operation="GetRecords", count=3)
    producer.start()
    world.wait(lambda: rule.exhausted, 60, "three expired iterators")
    world.wait(lambda: producer.count >= len(produced) + 300, 60, "more records")
    produced = producer.stop()
    world.wait_delivered(produced)
    assert all(c["sequence_number"] is None for c in world.checkpoints(stream).values())
    after = proxy.stats()[iterators].forwarded
    stop_gracefully(world, [member])

    deliveries = world.deliveries()
    assert_nothing_lost(produced, deliveries)
    assert duplicates(deliveries) == {}
    assert_shard_order_per_member(deliveries)
    assert after == before + 3  # one fresh iterator per expiry, nothing else re-read
    assert member.stderr_text().count("iterator expired; resuming at") == 3


# --- 8. bad inputs at the edges -----------------------------------------------------------------


def kpl_garbage() -> bytes:
    """KPL magic and a valid MD5, but a body that is not an AggregatedRecord."""
    body = b"\xff\xff\xff\xff"
    magic: bytes = aws_kinesis_agg.MAGIC
    return magic + body + hashlib.md5(body).digest()


def test_bad_inputs_are_delivered_intact_or_named(world: Scenario, unique_name: Names) -> None:
    """Edge cases, all at once (each member is its own process):

    * empty, binary, KPL-lookalike and 1 MiB records are delivered byte for byte;
    * a checkpoint whose sequence number is not a number (another app can write the table):
      the member does not read that shard nor overwrite its checkpoint, logs it naming the item,
      and reads its other shard;
    * a state table with the wrong key schema: StateTableSchemaError at start;
    * a missing state table: StateTableNotFoundError; a missing stream: StreamNotFoundError;
    * a stream deleted while being read: StreamNotFoundError, after every record written
      before the deletion was delivered.
    """
    rng = random.Random(8)
    edge = unique_name("edge")
    world.create_stream(edge, 1)
    payloads = [
        b"",
        bytes(range(256)),
        rng.randbytes(1000),
        aws_kinesis_agg.MAGIC + b"not an aggregate",
        kpl_garbage(),
        "unicode ✓ λ".encode(),
        rng.randbytes(1024 * 1024),
        b"x" * (1024 * 1024),
    ]
    for index, payload in enumerate(payloads):
        world.kinesis.put_record(StreamName=edge, Data=payload, PartitionKey=f"edge-{index}")
    edge_member = world.start_member("edge", [edge])

    corrupt = unique_name("corrupt")
    corrupt_shards = world.create_stream(corrupt, 2)
    world.producer(corrupt).put(40)
    world.dynamodb.put_item(
        TableName=world.table,
        Item={
            "pk": {"S": f"check_point#{world.app}#{corrupt}"},
            "sk": {"S": corrupt_shards[0]},
            "sequence_number": {"S": "not-a-number"},
        },
    )
    corrupt_member = world.start_member("corrupt", [corrupt], api="generator")

    doomed = unique_name("doomed")
    world.create_stream(doomed, 1)
    doomed_records = world.producer(doomed).put(50)
    # Its own app: in the edge/corrupt app the leader would notice the deletion first.
    doomed_member = world.start_member("doomed", [doomed], app=unique_name("app"))

    wrong_schema = unique_name("wrongkeys")
    world.dynamodb.create_table(
        TableName=wrong_schema,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    missing_table, missing_stream = unique_name("missing"), unique_name("missing")
    starts: list[tuple[MemberProcess, str, str]] = []
    for name, table, streams, error, needle in (
        ("schema", wrong_schema, [edge], "StateTableSchemaError", wrong_schema),
        ("notable", missing_table, [edge], "StateTableNotFoundError", missing_table),
        ("nostream", world.table, [missing_stream], "StreamNotFoundError", missing_stream),
    ):
        member = world.start_member(name, streams, app=unique_name("app"), table=table)
        starts.append((member, error, needle))

    world.wait(lambda: len(edge_member.deliveries()) == len(payloads), 60, "edge records")
    world.wait(lambda: len(doomed_member.deliveries()) == len(doomed_records), 60, "doomed")
    world.kinesis.delete_stream(StreamName=doomed, EnforceConsumerDeletion=True)

    def failed_with(member: MemberProcess, error: str, needle: str) -> None:
        code = member.wait(60)
        assert code == 3, f"{member.client_id} exited {code}\n{member.describe()}"
        found = member.errors()
        assert [e["error"] for e in found] == [error], member.describe()
        assert needle in found[0]["message"], found[0]["message"]

    other = corrupt_shards[1]
    iterator = world.kinesis.get_shard_iterator(
        StreamName=corrupt, ShardId=other, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    in_other = len(world.kinesis.get_records(ShardIterator=iterator)["Records"])
    world.wait(
        lambda: len([d for d in corrupt_member.deliveries() if d.shard_id == other]) >= in_other,
        60,
        "the corrupt member reads its readable shard",
    )
    assert corrupt_member.process.poll() is None, corrupt_member.describe()
    assert not [d for d in corrupt_member.deliveries() if d.shard_id == corrupt_shards[0]]
    assert world.checkpoints(corrupt)[corrupt_shards[0]]["sequence_number"] == "not-a-number"
    assert warning_lines(
        corrupt_member.stderr_text(), "unreadable checkpoint", corrupt_shards[0], "not-a-number"
    )
    failed_with(doomed_member, "StreamNotFoundError", doomed)
    assert sorted(d.number for d in doomed_member.deliveries()) == doomed_records
    for member, error, needle in starts:
        failed_with(member, error, needle)
        assert member.errors()[0]["where"] == "consume"
        assert member.deliveries() == []

    stop_gracefully(world, [edge_member, corrupt_member])
    got = {d.partition_key: d.data for d in edge_member.deliveries()}
    assert len(edge_member.deliveries()) == len(payloads)
    for index, payload in enumerate(payloads):
        assert got[f"edge-{index}"] == payload, f"payload {index} ({len(payload)} B) changed"
    assert warning_lines(edge_member.stderr_text(), "KPL magic", "not a valid aggregate")


# --- a race in close() (fixed in bfabd41; kept as its regression test) -------------------------


async def test_graceful_close_does_not_reclaim_its_shards(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names, fault_proxy: ProxyFactory
) -> None:
    """A graceful close must leave its shards unowned and cause no duplicate.

    Before bfabd41, close() handed off while a coordinator tick was still running: the tick then
    re-claimed the shards just released (the member is live until it deregisters), started
    fetchers, and the application was handed records of a lease nobody checkpointed or released;
    the next owner delivered them again (20 duplicates here, every run).

    Slow DynamoDB answers (Query 0.4 s: a coordinator tick is always in flight; DeleteItem 1.5 s:
    the deregistration at the end of close) make the race deterministic: the tick running when
    close() starts finishes after the handoffs and sees the member still live.
    """
    proxy = fault_proxy(dynalite.url)
    config = make_config(
        kinesalite.url, proxy.url, unique_name("app"), unique_name("state"), client_id="a"
    )
    setup_table(config.replace(dynamodb_endpoint=dynalite.url))
    stream = unique_name("s")
    create_stream_in_process(kinesalite.url, stream, 2)
    produced = put(kinesalite.url, stream, 0, 20)
    sink: list[tuple[str, Record]] = []
    a = Member(config, [stream], sink).start()
    await eventually(lambda: len(a.owned()) == 2 and len(sink) == 20, what="a reading")
    proxy.add_rule(Fault.delay(0.4), operation="Query")
    proxy.add_rule(Fault.delay(1.5), operation="DeleteItem")
    await asyncio.sleep(1.0)
    closing = asyncio.create_task(a.close())
    await asyncio.sleep(0.1)  # close() is under way (the old code had released both shards)
    produced += await asyncio.get_running_loop().run_in_executor(
        None, put, kinesalite.url, stream, 20, 20
    )
    await closing
    items = read_checkpoints(
        dynamodb_client(dynalite.url), config.dynamodb_table, config.app, stream
    )
    owners = {shard: item["owner"] for shard, item in items.items() if item["owner"]}
    b = Member(config.replace(client_id="b", dynamodb_endpoint=dynalite.url), [stream], sink)
    b.start()

    def b_caught_up() -> bool:
        shards = [s for s in b.consumer.stats().shards if s.status == "active"]
        return len(shards) == 2 and all(s.caught_up for s in shards)

    await eventually(b_caught_up, timeout=30, what="b reading both shards to their end")
    await b.close()
    assert set(datas(sink)) == set(produced)
    replayed = in_process_duplicates(sink)
    assert not owners and not replayed, (
        f"after a graceful close the shards are still owned by {owners}, and "
        f"{len(replayed)} records were delivered twice"
    )


# --- regression: records refused at the fence are read again, never lost -------------------------


async def test_records_refused_at_the_fence_are_not_lost_when_a_heartbeat_lands(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names
) -> None:
    """Past the fence a member must not deliver, but what it refuses has to be read again (by a
    new owner from the checkpoint, or by itself once its lease is confirmed): never skipped.

    The interleaving is forced rather than waited for. Heartbeats every 30 s keep the heartbeat
    thread out of the way. The cursor's fence is wrapped so that one read sees the deadline just
    passed and a heartbeat then lands (``Heartbeat.landed``, what the heartbeat thread calls),
    so the watchdog, which reads the heartbeat itself, never sees the lapse: exactly what happens
    when a throttled heartbeat is retried and lands within the watchdog's 0.1 s blind spot.
    """

    class LapsingFence:
        """The heartbeat's deadline, except that the first read finds it just passed."""

        def __init__(self, heartbeat: Any) -> None:
            self.heartbeat = heartbeat
            self.lapsed = False

        @property
        def deadline(self) -> float:
            if not self.lapsed:
                self.lapsed = True
                lapsed_at = time.monotonic() - 0.001
                self.heartbeat.landed(time.monotonic())  # the late heartbeat lands right after
                return lapsed_at
            deadline: float = self.heartbeat.deadline
            return deadline

    config = make_config(
        kinesalite.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        heartbeat_interval=30.0,
        client_timeout=60.0,
    )
    setup_table(config)
    stream = unique_name("s")
    create_stream_in_process(kinesalite.url, stream, 1)
    produced = put(kinesalite.url, stream, 0, 20)  # one PutRecords: one GetRecords batch
    consumer = AsyncKinesumer(config)
    records = consumer.consume([stream])
    got = [await anext(records)]  # record 0 in hand; the other 19 wait in the cursor's batch
    # Test seam: the delivery fence is the heartbeat's deadline; wrap it so it lapses once.
    cursor = engine_of(consumer).cursor
    cursor.fence = LapsingFence(cursor.fence)
    produced += await asyncio.get_running_loop().run_in_executor(
        None, put, kinesalite.url, stream, 20, 20
    )

    async def collect() -> None:
        async for record in records:
            got.append(record)
            if record.data == b"39":
                return

    await asyncio.wait_for(collect(), 30)
    active = [s.shard_id for s in consumer.stats().shards if s.status == "active"]
    await consumer.aclose()
    missing = sorted(set(produced) - {r.data for r in got}, key=int)
    assert not missing, (
        f"{len(missing)} records never delivered ({b', '.join(missing).decode()}) while the "
        f"lease stayed active ({active})"
    )


# --- regression: GetShardIterator failing past its retries does not stop the member ---------------


async def test_get_shard_iterator_failing_past_its_retries_does_not_stop_the_member(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names, fault_proxy: ProxyFactory
) -> None:
    """Eight 503s in a row on GetShardIterator (a few seconds of a Kinesis blip, or of the
    5-per-second-per-shard GetShardIterator throttle during a large rebalance) are transient:
    the member must keep its shard and read it once the calls succeed again."""
    proxy = fault_proxy(kinesalite.url)
    config = make_config(proxy.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream_in_process(kinesalite.url, stream, 1)
    produced = put(kinesalite.url, stream, 0, 10)
    rule = proxy.add_rule(Fault.http_503(), operation="GetShardIterator", count=8)
    consumer = AsyncKinesumer(config)
    got: list[Record] = []

    async def collect() -> None:
        async for record in consumer.consume([stream]):
            got.append(record)
            if len(got) == len(produced):
                return

    try:
        await asyncio.wait_for(collect(), 60)
    finally:
        await consumer.aclose()
    assert rule.exhausted
    assert sorted(r.data for r in got) == sorted(produced)
