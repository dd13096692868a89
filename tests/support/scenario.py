"""Helpers for the multi-process scenarios (``tests/scenarios/test_scenarios.py``) and the failover
benchmark.

A scenario is a world of real OS processes: kinesalite and dynalite (the session's stand-ins),
group members started from ``tests/support/member.py`` (each one real ``kinesumer.Kinesumer``), and
a
producer thread in the test process writing numbered records with boto3. Members report what
they delivered in JSON-lines files; the helpers here read those files as they grow, wait for
conditions with generous deadlines (the machine is shared and busy: never a timing assertion),
and check every record.

Why files rather than pipes: a member killed with SIGKILL leaves its file behind, complete up
to the last line the kernel received, which is exactly what "delivered before the crash" means.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from kinesumer import Config, create_state_table
from support.wait import wait_until

MEMBER_SCRIPT = Path(__file__).resolve().with_name("member.py")
#: The script of one ``run()`` member process (handlers, kill -9 scenarios).
HANDLER_MEMBER_SCRIPT = Path(__file__).resolve().with_name("handler_member.py")
REGION = "us-east-1"

FAST: dict[str, float] = {
    "heartbeat_interval": 0.5,
    "client_timeout": 2.0,
    "commit_interval": 1.0,
    "shard_sync_interval": 2.0,
    "handoff_timeout": 2.0,
}
"""Shorter timings than the defaults, for speed: a member is seen dead 2 s after its last
heartbeat and fences itself 1.5 s after its last *landed* one (client_timeout - heartbeat)."""

KEYS = 64
"""Partition keys ``key-0`` .. ``key-63``: enough that every shard of an 8-shard stream gets
records (the hash of each key decides its shard)."""

STOP_GRACE = 20.0
"""How long :meth:`MemberProcess.stop` waits after SIGTERM before SIGKILL: a graceful close
hands every shard off, which on a busy machine can take several seconds."""


def key_of(number: int) -> str:
    return f"key-{number % KEYS}"


# --- reading what members wrote -----------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One record as a member delivered it (one line of its ``--out`` file)."""

    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    data: bytes
    client_id: str
    mono: float
    wall: float

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> Delivery:
        text = line.get("data")
        data = text.encode("utf-8") if text is not None else base64.b64decode(line["data_b64"])
        return cls(
            stream=line["stream"],
            shard_id=line["shard_id"],
            sequence_number=line["sequence_number"],
            sub_sequence_number=int(line["sub_sequence_number"]),
            partition_key=line["partition_key"],
            data=data,
            client_id=line["client_id"],
            mono=float(line["mono"]),
            wall=float(line["wall"]),
        )

    @property
    def record_id(self) -> tuple[str, str, str, int]:
        """What identifies a Kinesis (user) record: stream, shard, sequence, sub-sequence."""
        return (self.stream, self.shard_id, self.sequence_number, self.sub_sequence_number)

    @property
    def position(self) -> tuple[int, int]:
        """Sequence numbers are 56-digit decimal strings: compare them as integers."""
        return (int(self.sequence_number), self.sub_sequence_number)

    @property
    def number(self) -> int:
        """The producer's record number (its data is the number in decimal)."""
        return int(self.data)


class JsonLinesTail:
    """Reads a JSON-lines file that another process is still appending to.

    Only complete lines are parsed: a line cut short by a SIGKILL stays pending (and is never
    counted). Each call reads only the bytes added since the last one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[dict[str, Any]] = []
        self._offset = 0
        self._pending = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except FileNotFoundError:
            return self.items
        self._offset += len(chunk)
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        self.items.extend(json.loads(line) for line in lines if line.strip())
        return self.items


# --- member processes ---------------------------------------------------------------------------


def member_command(
    *,
    app: str,
    table: str,
    kinesis_url: str,
    dynamodb_url: str,
    client_id: str,
    out: Path,
    streams: Sequence[str],
    api: str = "poll",
    config: Mapping[str, float | int] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of one ``tests/support/member.py`` process."""
    command = [
        sys.executable,
        str(MEMBER_SCRIPT),
        "--app",
        app,
        "--table",
        table,
        "--kinesis",
        kinesis_url,
        "--dynamodb",
        dynamodb_url,
        "--client-id",
        client_id,
        "--out",
        str(out),
        "--api",
        api,
    ]
    for name, value in (config or {}).items():
        command += ["--" + name.replace("_", "-"), str(value)]
    return [*command, *extra, *streams]


class MemberProcess:
    """A running ``tests/support/member.py``: its process, and the files it writes.

    Every way to stop it targets this process's own pid; :meth:`stop` is idempotent and safe in
    a ``finally`` (SIGTERM, wait, SIGKILL, wait).
    """

    def __init__(
        self,
        client_id: str,
        command: list[str],
        workdir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.client_id = client_id
        self.out_path = workdir / f"{client_id}.jsonl"
        self.events_path = workdir / f"{client_id}.jsonl.events"
        self.stderr_path = workdir / f"{client_id}.stderr"
        self.command = command
        self.started_at = time.monotonic()
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=None if env is None else {**os.environ, **env},
            )
        self._records = JsonLinesTail(self.out_path)
        self._events = JsonLinesTail(self.events_path)
        self._parsed: list[Delivery] = []

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    # -- what it wrote --
    def deliveries(self) -> list[Delivery]:
        lines = self._records.read()
        if len(self._parsed) < len(lines):
            self._parsed.extend(Delivery.from_json(x) for x in lines[len(self._parsed) :])
        return self._parsed

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = self._events.read()
        return [e for e in found if e["event"] == name] if name else list(found)

    def last_event(self, name: str) -> dict[str, Any] | None:
        found = self.events(name)
        return found[-1] if found else None

    def owned(self) -> frozenset[str]:
        """``stream/shard`` ids this member owns, as its stats sampler last reported them
        (empty once it is no longer running)."""
        if not self.running:
            return frozenset()
        event = self.last_event("owned")
        return frozenset(event["shards"]) if event else frozenset()

    def owned_at(self, mono: float) -> frozenset[str]:
        """What it owned at monotonic time ``mono`` (from its ``owned`` events)."""
        current: frozenset[str] = frozenset()
        for event in self.events("owned"):
            if event["mono"] > mono:
                break
            current = frozenset(event["shards"])
        return current

    def errors(self) -> list[dict[str, Any]]:
        return self.events("error")

    def final_stats(self) -> dict[str, Any] | None:
        closed = self.last_event("closed")
        return closed.get("stats") if closed else None

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self, tail: int = 2500) -> str:
        """For failure messages: state, recent events and the end of its log."""
        events = "\n".join(json.dumps(e) for e in self.events()[-8:])
        return (
            f"--- member {self.client_id} pid={self.pid} returncode={self.returncode} "
            f"delivered={len(self.deliveries())}\n{events}\n--- stderr (tail)\n"
            f"{self.stderr_text()[-tail:]}"
        )

    def dump_stacks(self) -> None:
        """SIGUSR1: the member writes every thread's and every asyncio task's stack to stderr."""
        if self.running:
            self.process.send_signal(signal.SIGUSR1)

    # -- stopping --
    def terminate(self) -> None:
        """SIGTERM: the member closes gracefully (hands its shards off) and exits 0."""
        if self.running:
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: no handoff, no final checkpoint, the heartbeat stops mid-flight."""
        if self.running:
            self.process.kill()
        self.process.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Terminate, wait up to ``grace`` seconds, then kill; reaped either way."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)


# --- waiting ------------------------------------------------------------------------------------


# --- producing ----------------------------------------------------------------------------------


class Producer:
    """Writes numbered records (data ``b"<n>"``, key :func:`key_of`) to a stream from a thread.

    ``batch`` records every ``interval`` seconds with PutRecords, straight to kinesalite (never
    through a fault proxy: producing is not under test). Hold :attr:`gate` to pause it (it is
    taken around every PutRecords), e.g. so that no record is written during a reshard.
    ``hash_keys``: record ``n`` gets ``ExplicitHashKey=hash_keys[n % len(hash_keys)]``, to write
    every shard at a known rate (the failover benchmark times "first record read from a shard").
    """

    def __init__(
        self,
        kinesis_url: str,
        stream: str,
        *,
        batch: int = 20,
        interval: float = 0.1,
        first: int = 0,
        key: Callable[[int], str] = key_of,
        hash_keys: Sequence[str] = (),
    ) -> None:
        self._client = kinesis_client(kinesis_url)
        self.hash_keys = list(hash_keys)
        self.stream = stream
        self.batch = batch
        self.interval = interval
        self.key = key
        self.gate = threading.Lock()
        self._next = first
        self._produced: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"producer-{stream}", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._produced)

    @property
    def produced(self) -> list[int]:
        with self._lock:
            return list(self._produced)

    def put(self, count: int) -> list[int]:
        """Write ``count`` records now, from the calling thread."""
        with self.gate:
            numbers = list(range(self._next, self._next + count))
            self._next += count
            for start in range(0, len(numbers), 500):
                chunk = numbers[start : start + 500]
                response = self._client.put_records(
                    StreamName=self.stream, Records=[self._entry(n) for n in chunk]
                )
                failed = response.get("FailedRecordCount", 0)
                if failed:
                    raise AssertionError(f"kinesalite refused {failed} records: {response}")
                with self._lock:
                    self._produced.extend(chunk)
        return numbers

    def _entry(self, number: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"Data": str(number).encode(), "PartitionKey": self.key(number)}
        if self.hash_keys:
            entry["ExplicitHashKey"] = self.hash_keys[number % len(self.hash_keys)]
        return entry

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.put(self.batch)
        except BaseException as exc:  # re-raised from stop()
            self._error = exc

    def stop(self) -> list[int]:
        """Stop the thread; every number written. Raises what the thread failed with."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self._error is not None:
            raise AssertionError(f"the producer failed: {self._error!r}") from self._error
        return self.produced


def kinesis_client(url: str) -> Any:
    return boto3.client("kinesis", endpoint_url=url, region_name=REGION)


def dynamodb_client(url: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=url, region_name=REGION)


# --- the world of one scenario ------------------------------------------------------------------


class Scenario:
    """Stand-in endpoints, app and table of one scenario, and every member it started.

    :meth:`close` stops every member (each by its own pid, each in its own ``try``).
    """

    def __init__(
        self, kinesis_url: str, dynamodb_url: str, app: str, table: str, workdir: Path
    ) -> None:
        self.kinesis_url = kinesis_url
        self.dynamodb_url = dynamodb_url
        self.app = app
        self.table = table
        self.workdir = workdir
        self.kinesis = kinesis_client(kinesis_url)
        self.dynamodb = dynamodb_client(dynamodb_url)
        self.members: list[MemberProcess] = []
        self.producers: list[Producer] = []

    def config(self) -> Config:
        return Config(
            app=self.app,
            dynamodb_table=self.table,
            region=REGION,
            kinesis_endpoint=self.kinesis_url,
            dynamodb_endpoint=self.dynamodb_url,
        )

    def create_table(self) -> None:
        create_state_table(self.config())

    def create_stream(self, name: str, shards: int) -> list[str]:
        """Create a stream and wait until it is ACTIVE; its shard ids, sorted."""
        self.kinesis.create_stream(StreamName=name, ShardCount=shards)
        self.kinesis.get_waiter("stream_exists").wait(
            StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
        )
        return self.shard_ids(name)

    def shard_ids(self, stream: str, open_only: bool = False) -> list[str]:
        shards = self.kinesis.list_shards(StreamName=stream)["Shards"]
        return sorted(
            s["ShardId"]
            for s in shards
            if not (open_only and "EndingSequenceNumber" in s["SequenceNumberRange"])
        )

    def producer(self, stream: str, **options: Any) -> Producer:
        producer = Producer(self.kinesis_url, stream, **options)
        self.producers.append(producer)
        return producer

    def start_member(
        self,
        client_id: str,
        streams: Sequence[str],
        *,
        kinesis_url: str | None = None,
        dynamodb_url: str | None = None,
        api: str = "poll",
        config: Mapping[str, float | int] | None = None,
        extra: Sequence[str] = (),
        app: str | None = None,
        table: str | None = None,
        clock_skew: float = 0.0,
    ) -> MemberProcess:
        """Start a member process (FAST timings unless ``config`` says otherwise), optionally
        through fault proxies instead of the stand-ins themselves, or in another app or table
        (it is still stopped with this scenario's members), or with its wall clock shifted by
        ``clock_skew`` seconds (``tests/support/member.py``: ``KINESUMER_TEST_CLOCK_SKEW``)."""
        command = member_command(
            app=app or self.app,
            table=table or self.table,
            kinesis_url=kinesis_url or self.kinesis_url,
            dynamodb_url=dynamodb_url or self.dynamodb_url,
            client_id=client_id,
            out=self.workdir / f"{client_id}.jsonl",
            streams=streams,
            api=api,
            config=FAST if config is None else config,
            extra=extra,
        )
        env = {"KINESUMER_TEST_CLOCK_SKEW": repr(clock_skew)} if clock_skew else None
        member = MemberProcess(client_id, command, self.workdir, env)
        self.members.append(member)
        return member

    def deliveries(self, members: Iterable[MemberProcess] | None = None) -> list[Delivery]:
        return [d for m in (self.members if members is None else members) for d in m.deliveries()]

    def delivered_numbers(self) -> set[int]:
        return {d.number for d in self.deliveries()}

    def describe(self) -> str:
        """For failure messages: ask every running member for its stacks (SIGUSR1), then show
        each member's recent events and log."""
        running = [m for m in self.members if m.running]
        for member in running:
            member.dump_stacks()
        if running:
            time.sleep(1.0)
        return "\n".join(m.describe(tail=6000 if m in running else 2500) for m in self.members)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> float:
        return wait_until(predicate, timeout, what, self.describe, interval=0.1)

    def wait_balanced(
        self, members: Sequence[MemberProcess], shards: Iterable[str], timeout: float = 60
    ) -> float:
        """Until ``members`` own ``shards`` (``stream/shard``) between them, disjointly, each
        as many as a fair split gives (sizes differ by at most one)."""
        wanted = frozenset(shards)
        return self.wait(
            lambda: balanced(members, wanted), timeout, f"a balanced split of {wanted}"
        )

    def wait_reading(
        self, stream: str, shards: Iterable[str], initial: str, timeout: float = 60
    ) -> float:
        """At ``LATEST``: until the read of every shard in ``shards`` (``stream/shard``) began,
        its start recorded in its checkpoint item (the iterator is open: records put from now
        on are read), or it has a position. At another initial position: at once."""
        if initial != "LATEST":
            return 0.0
        ids = {key.split("/", 1)[1] for key in shards}

        def begun() -> bool:
            found = self.checkpoints(stream)
            return all(
                found.get(i, {}).get("started_at") is not None
                or found.get(i, {}).get("sequence_number") is not None
                for i in ids
            )

        return self.wait(begun, timeout, f"the reads of {sorted(ids)} begun")

    def wait_delivered(self, numbers: Iterable[int], timeout: float = 60) -> float:
        wanted = set(numbers)
        return self.wait(
            lambda: wanted <= self.delivered_numbers(),
            timeout,
            f"all {len(wanted)} records delivered",
        )

    def checkpoints(self, stream: str) -> dict[str, dict[str, Any]]:
        """The checkpoint items of ``stream`` (see :func:`read_checkpoints`)."""
        return read_checkpoints(self.dynamodb, self.table, self.app, stream)

    def close(self) -> None:
        """Stop every producer and member process; each in its own try, each by its own pid."""
        errors: list[BaseException] = []
        for producer in self.producers:
            try:
                producer.stop()
            except BaseException as exc:
                errors.append(exc)
        for member in self.members:
            try:
                member.stop()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def read_checkpoints(dynamodb: Any, table: str, app: str, stream: str) -> dict[str, dict[str, Any]]:
    """The checkpoint items of ``stream``, read straight from DynamoDB with boto3 (consistent
    reads): shard id -> {sequence_number (str or None), owner, lease, finished, started_at
    (epoch ms or None: where a LATEST read began, recorded once its iterator is open)}. Items are
    ``pk=check_point#<app>#<stream>``, ``sk=<shard id>``; the sequence number is a string."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": f"check_point#{app}#{stream}"}},
        "ConsistentRead": True,
    }
    while True:
        response = dynamodb.query(**kwargs)
        items += response["Items"]
        if "LastEvaluatedKey" not in response:
            break
        kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
    return {
        item["sk"]["S"]: {
            "sequence_number": item.get("sequence_number", {}).get("S"),
            "owner": item.get("owner", {}).get("S"),
            "lease": int(item.get("lease", {}).get("N", "0")),
            "finished": bool(item.get("finished", {}).get("BOOL", False)),
            "started_at": int(item["started_at"]["N"]) if "started_at" in item else None,
        }
        for item in items
    }


def balanced(members: Sequence[MemberProcess], shards: frozenset[str]) -> bool:
    """Whether ``members`` own exactly ``shards`` between them, disjointly and evenly."""
    owned = [m.owned() for m in members]
    if any(not m.running for m in members):
        return False
    if sum(len(o) for o in owned) != len(shards) or frozenset().union(*owned) != shards:
        return False
    low = len(shards) // len(members)
    return all(low <= len(o) <= low + 1 for o in owned)


# --- checking every record ----------------------------------------------------------------------


def by_record(deliveries: Iterable[Delivery]) -> dict[tuple[str, str, str, int], list[Delivery]]:
    """Every delivery of each record, in delivery order (members share CLOCK_MONOTONIC)."""
    found: dict[tuple[str, str, str, int], list[Delivery]] = defaultdict(list)
    for d in deliveries:
        found[d.record_id].append(d)
    for copies in found.values():
        copies.sort(key=lambda d: d.mono)
    return found


def duplicates(deliveries: Iterable[Delivery]) -> dict[tuple[str, str, str, int], list[Delivery]]:
    """Records delivered more than once, with every delivery in order."""
    return {k: v for k, v in by_record(deliveries).items() if len(v) > 1}


def assert_nothing_lost(produced: Iterable[int], deliveries: Iterable[Delivery]) -> None:
    """Every produced number was delivered, and nothing was delivered that was not produced."""
    wanted = Counter(produced)
    assert all(n == 1 for n in wanted.values()), "the producer wrote a number twice"
    got = {d.number for d in deliveries}
    missing = sorted(set(wanted) - got)
    unknown = sorted(got - set(wanted))
    assert not missing, f"{len(missing)} records never delivered, e.g. {missing[:20]}"
    assert not unknown, f"{len(unknown)} delivered records were never produced: {unknown[:20]}"


def assert_shard_order_per_member(deliveries: Iterable[Delivery]) -> None:
    """Within each member, each shard's records came in strictly increasing sequence order."""
    last: dict[tuple[str, str, str], tuple[int, int]] = {}
    for d in deliveries:  # each member's deliveries in file (= delivery) order
        key = (d.client_id, d.stream, d.shard_id)
        previous = last.get(key)
        assert previous is None or d.position > previous, (
            f"{d.client_id} delivered {d.stream}/{d.shard_id} out of order: "
            f"{d.sequence_number} after {previous[0] if previous else None}"
        )
        last[key] = d.position


def assert_shard_order_across_members(deliveries: Iterable[Delivery]) -> None:
    """Across members, each shard's records were *first* delivered in sequence order: a new
    owner may replay what the old one delivered after its checkpoint, but never delivers a new
    record before an older one, and never while the old owner is still delivering."""
    last: dict[tuple[str, str], Delivery] = {}
    for d in first_deliveries(deliveries):
        previous = last.get((d.stream, d.shard_id))
        assert previous is None or d.position > previous.position, (
            f"{d.stream}/{d.shard_id}: {d.sequence_number} (by {d.client_id}) was first "
            f"delivered after {previous.sequence_number if previous else None} "
            f"(by {previous.client_id if previous else None})"
        )
        last[(d.stream, d.shard_id)] = d


def first_deliveries(deliveries: Iterable[Delivery]) -> list[Delivery]:
    """The first delivery of every record, across members, in delivery order."""
    return sorted((copies[0] for copies in by_record(deliveries).values()), key=lambda d: d.mono)


def assert_key_order(deliveries: Iterable[Delivery]) -> None:
    """Across members, each partition key's records were first delivered in the order they were
    produced (the producer numbers them in order)."""
    last: dict[str, int] = {}
    for d in first_deliveries(deliveries):
        previous = last.get(d.partition_key, -1)
        assert d.number > previous, (
            f"key {d.partition_key}: record {d.number} ({d.shard_id}, by {d.client_id}) was "
            f"delivered before record {previous}"
        )
        last[d.partition_key] = d.number


def warning_lines(text: str, *needles: str) -> list[str]:
    """WARNING lines of a member's log that mention every one of ``needles``."""
    return [
        line
        for line in text.splitlines()
        if " WARNING " in line and all(n in line for n in needles)
    ]
