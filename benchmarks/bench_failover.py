"""Failover timings of the consumer group, members as OS processes, the library's defaults.

    .venv/bin/python benchmarks/bench_failover.py [--rounds 5] [--shards 6]

On kinesalite + dynalite (started here on free loopback ports, stopped by pid), each round uses a
fresh stream and app. Members are ``tests/support/member.py`` processes (one real ``Kinesumer``
each, generator API, every delivered record written with its CLOCK_MONOTONIC time, which all
processes on the machine share), with no Config override: heartbeat_interval 1 s, client_timeout 3
s, commit_interval 5 s, handoff_timeout 5 s. A producer writes one record to every shard every 40 ms
throughout (explicit hash keys), so "the first record read from a shard" is known to within that.

A round:

1. three members start and settle (two shards each, every shard being read);
2. **crash**: SIGKILL one of them (the leader in one round out of three); seconds until every
   shard it owned has delivered a record from another member;
3. **join**: a fourth member starts; seconds from its start (its process is up and imports done,
   and separately from the spawn) until the assignment is balanced and every shard that changed
   hands has delivered a record from its new owner;
4. **graceful leave**: SIGTERM the newcomer; seconds until each of its shards has delivered a
   record from another member (its exit code must be 0);
5. the producer stops, and every record it wrote must have been delivered (a sanity check; the
   duplicates the crash caused are counted).

The issue's aim: crash failover under 5 s, graceful leave and join under 2 s. The table gives
medians; the machine is shared, so compare within a run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.scenario import (  # noqa: E402
    Delivery,
    MemberProcess,
    Scenario,
    balanced,
    duplicates,
)
from support.standins import start_dynalite, start_kinesalite  # noqa: E402

for _name, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ.setdefault(_name, _value)

PRODUCE_EVERY = 0.04
"""Seconds between producer batches; each batch writes one record to every shard."""
DEADLINE = 90.0
"""Upper bound for any one wait: far above the aim, so a slow machine still finishes."""

AIMS = {"crash": 5.0, "leave": 2.0, "join": 2.0, "join_spawn": None}
LABELS = {
    "crash": "crash failover: SIGKILL -> its shards read again",
    "leave": "graceful leave: SIGTERM -> its shards read again",
    "join": "join: member up -> balanced, moved shards read",
    "join_spawn": "join incl. interpreter start (spawn -> same)",
}


def first_read_after(
    deliveries: Sequence[Delivery], shard: str, after: float, by: set[str]
) -> float | None:
    """Monotonic time of the first record of ``shard`` delivered after ``after`` by ``by``."""
    times = [
        d.mono
        for d in deliveries
        if d.mono > after and f"{d.stream}/{d.shard_id}" == shard and d.client_id in by
    ]
    return min(times) if times else None


def owners(members: Sequence[MemberProcess]) -> dict[str, str]:
    return {shard: m.client_id for m in members for shard in m.owned()}


def all_read(world: Scenario, shards: dict[str, str], after: float) -> bool:
    """Whether every shard has delivered a record from its given owner after ``after``."""
    deliveries = world.deliveries()
    return all(
        first_read_after(deliveries, shard, after, {owner}) is not None
        for shard, owner in shards.items()
    )


def settle(world: Scenario, members: Sequence[MemberProcess], shards: frozenset[str]) -> None:
    """Until the members own a balanced split and each has read every shard it owns."""
    world.wait_balanced(members, shards, timeout=DEADLINE)
    world.wait(lambda: all_read(world, owners(members), 0.0), DEADLINE, "every shard read")


def one_round(world: Scenario, number: int, shard_count: int) -> dict[str, float]:
    stream = f"bench-{number}-{os.getpid()}"
    shard_ids = world.create_stream(stream, shard_count)
    shards = frozenset(f"{stream}/{s}" for s in shard_ids)
    ranges = world.kinesis.list_shards(StreamName=stream)["Shards"]
    hash_keys = [s["HashKeyRange"]["StartingHashKey"] for s in ranges]
    producer = world.producer(
        stream, batch=shard_count, interval=PRODUCE_EVERY, hash_keys=hash_keys
    ).start()
    members = [
        world.start_member(f"r{number}m{i}", [stream], api="generator", config={})
        for i in (1, 2, 3)
    ]
    settle(world, members, shards)
    result: dict[str, float] = {}

    # Crash.
    victim = members[number % 3]
    survivors = [m for m in members if m is not victim]
    lost = victim.owned()
    killed = time.monotonic()
    victim.kill()
    names = {m.client_id for m in survivors}
    world.wait(
        lambda: all(first_read_after(world.deliveries(), s, killed, names) for s in lost),
        DEADLINE,
        f"{victim.client_id}'s shards read again",
    )
    deliveries = world.deliveries()
    result["crash"] = (
        max(first_read_after(deliveries, s, killed, names) or 0 for s in lost) - killed
    )
    settle(world, survivors, shards)

    # Join.
    before = owners(survivors)
    spawned = time.monotonic()
    newcomer = world.start_member(f"r{number}m4", [stream], api="generator", config={})
    group = [*survivors, newcomer]

    def joined() -> bool:
        if not balanced(group, shards):
            return False
        moved = {s: o for s, o in owners(group).items() if before.get(s) != o}
        return all_read(world, moved, spawned)

    world.wait(joined, DEADLINE, "a balanced, reading group after the join")
    after = owners(group)
    moved = {s: o for s, o in after.items() if before.get(s) != o}
    deliveries = world.deliveries()
    done = max(first_read_after(deliveries, s, spawned, {o}) or 0 for s, o in moved.items())
    started = newcomer.events("starting")[0]["mono"]
    result["join"] = done - started
    result["join_spawn"] = done - spawned

    # Graceful leave.
    leaving = newcomer.owned()
    names = {m.client_id for m in survivors}
    left = time.monotonic()
    newcomer.terminate()
    world.wait(
        lambda: all(first_read_after(world.deliveries(), s, left, names) for s in leaving),
        DEADLINE,
        "the leaver's shards read again",
    )
    deliveries = world.deliveries()
    result["leave"] = max(first_read_after(deliveries, s, left, names) or 0 for s in leaving) - left
    code = newcomer.wait(DEADLINE)
    if code != 0:
        raise SystemExit(f"the leaving member exited {code}\n{newcomer.describe()}")

    produced = producer.stop()
    world.wait_delivered(produced, timeout=DEADLINE)
    result["duplicates"] = len(duplicates(world.deliveries()))
    for member in survivors:
        member.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", type=int, default=6)
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    kinesalite = start_kinesalite()
    dynalite = start_dynalite()
    results: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as workdir:
            world = Scenario(
                kinesalite.url, dynalite.url, f"bench-{os.getpid()}", "bench-state", Path(workdir)
            )
            world.create_table()
            for number in range(args.rounds):
                world.app = f"bench-{os.getpid()}-{number}"
                try:
                    results.append(one_round(world, number, args.shards))
                finally:
                    world.close()
                    world.members.clear()
                    world.producers.clear()
                r = results[-1]
                print(
                    f"  round {number + 1}: crash {r['crash']:.2f}s, join {r['join']:.2f}s "
                    f"(spawn {r['join_spawn']:.2f}s), leave {r['leave']:.2f}s, "
                    f"{r['duplicates']:.0f} duplicates after the crash",
                    flush=True,
                )
    finally:
        kinesalite.stop()
        dynalite.stop()
    report(results, args, started, load_before)


def report(
    results: list[dict[str, float]],
    args: argparse.Namespace,
    started: datetime.datetime,
    load_before: tuple[float, float, float],
) -> None:
    load_after = os.getloadavg()
    print()
    print(
        f"kinesumer failover, {args.rounds} rounds; machine: {os.cpu_count()} cores, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}; "
        f"{started:%Y-%m-%d %H:%M} UTC; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after"
    )
    print(
        "3 member processes (generator API), library defaults (heartbeat 1 s, client_timeout "
        f"3 s, commit 5 s, handoff 5 s), {args.shards} shards, kinesalite + dynalite on loopback"
    )
    print()
    width = max(len(label) for label in LABELS.values())
    print(f"| {'measure':<{width}} |  median |     min |     max |   aim | runs (s)")
    print(f"|{'-' * (width + 2)}|---------|---------|---------|-------|{'-' * 30}")
    for key, label in LABELS.items():
        values = [r[key] for r in results]
        aim = AIMS[key]
        verdict = "" if aim is None else (" ok" if statistics.median(values) < aim else " MISSED")
        print(
            f"| {label:<{width}} | {statistics.median(values):6.2f}s | {min(values):6.2f}s | "
            f"{max(values):6.2f}s | {'' if aim is None else f'< {aim:.0f} s':>5} | "
            f"{', '.join(f'{v:.2f}' for v in values)}{verdict}"
        )
    dups = [int(r["duplicates"]) for r in results]
    print()
    print(
        "records delivered twice, per round (only the crash may cause any: what the victim "
        f"delivered since its last checkpoint, up to commit_interval = 5 s of it): {dups}"
    )
    print("every record produced was delivered in every round")


if __name__ == "__main__":
    main()
