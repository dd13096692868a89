"""What the demo shows: the live screen (members, shards, events) and the final summary."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from ..render import table
from ..view import GroupStatus, MemberView
from .constants import APP, STREAM
from .members import Deliveries, Member
from .producer import Producer


class Demo(Protocol):
    """What the screen and the summary read of a run (the script's ``Demo`` is one)."""

    url: str
    shards: int
    total: int
    rate: float
    tty: bool
    t0: float
    deliveries: Deliveries
    members: dict[str, Member]
    events: list[str]
    failures: list[str]
    status: GroupStatus | None
    producer: Producer
    logdir: Path
    victim: Member | None
    takeover: float | None
    joined: tuple[str, float] | None

    def unique(self) -> int: ...

    def shards_of(self, member: MemberView) -> str: ...

    def print(self, text: str) -> None: ...


def frame(demo: Demo, events: bool = True) -> list[str]:
    """The screen: counts, members, shards and (with ``events``) the latest events."""
    elapsed = time.monotonic() - demo.t0
    d = demo.deliveries
    unique = demo.unique()
    lines = [
        f"kinesumer demo   {elapsed:5.1f}s   moto {demo.url}   app {APP}   stream {STREAM}",
        "",
        f"produced  {demo.producer.produced:>7} / {demo.total} at {demo.rate:g}/s",
        f"consumed  {unique:>7} unique, {d.total - unique} duplicate deliveries",
        "",
    ]
    table_members = {m.client_id: m for m in demo.status.members} if demo.status else {}
    rows = []
    for name, member in demo.members.items():
        row = table_members.get(name)
        state = member.state
        if state == "running":
            state = "live" if row is not None and row.live else "joining"
        rows.append(
            [
                name,
                str(member.proc.pid),
                state,
                "*" if row is not None and row.leader and member.state == "running" else "",
                demo.shards_of(row) if row is not None and member.state == "running" else "",
                str(d.by_member.get(name, 0)),
            ]
        )
    lines += table(["MEMBER", "PID", "STATE", "LEADER", "SHARDS", "CONSUMED"], rows)
    shards = demo.status.streams.get(STREAM, ()) if demo.status else ()
    shard_rows = [
        [
            short(s.shard_id),
            s.owner or "-",
            position(s.checkpoint.sequence_number if s.checkpoint else None),
            "-" if s.lag_ms is None else f"{s.lag_ms} ms",
        ]
        for s in shards
    ]
    lines += ["", *table(["SHARD", "OWNER", "CHECKPOINT", "LAG"], shard_rows)]
    if events:
        lines += ["", "events", *(f"  {e}" for e in demo.events[-8:])]
    return lines


def summary(demo: Demo) -> int:
    """The final picture and the verdict: exit 1 when anything was lost or went wrong."""
    d = demo.deliveries
    produced = demo.producer.produced
    lost = [n for n in range(produced) if n not in d.by_number]
    extra = d.total - len(d.by_number)
    victim = demo.victim.name if demo.victim else None
    expected = sum(
        len(names) - 1 for names in d.by_number.values() if len(names) > 1 and victim in names
    )
    if not demo.tty:
        demo.print("")
        for line in frame(demo, events=False):
            demo.print(line)
    by_member = ", ".join(
        f"{name} {d.by_member.get(name, 0)}" + (" (killed)" if m.state == "killed" else "")
        for name, m in demo.members.items()
    )
    if extra == expected:
        why = f"all re-deliveries of what {victim} had not checkpointed when it was killed"
    else:
        why = f"{expected} re-deliveries of {victim}'s records, {extra - expected} unexpected"
    lines = [
        "",
        "summary",
        f"  produced    {produced} records ({demo.shards} shards)",
        f"  consumed    {len(d.by_number)} unique in {d.total} deliveries",
        f"  lost        {len(lost)}" + (f": {lost[:10]}" if lost else ""),
        f"  duplicates  {extra}" + (f" ({why})" if extra else ""),
        f"  by member   {by_member}",
    ]
    if demo.takeover is not None:
        lines.append(
            f"  takeover    {victim}'s shards taken over {demo.takeover:.1f}s after SIGKILL"
        )
    if demo.joined is not None:
        lines.append(f"  join        {demo.joined[0]} got its shards in {demo.joined[1]:.1f}s")
    for failure in demo.failures:
        lines.append(f"  problem     {failure}")
    if demo.failures:
        lines.append(f"  logs        {demo.logdir}")
    ok = not lost and not demo.failures and produced == demo.total
    lines.append("result: OK, nothing lost" if ok else "result: FAILED")
    for line in lines:
        demo.print(line)
    return 0 if ok else 1


def short(shard_id: str) -> str:
    return shard_id.rsplit("-", 1)[-1].lstrip("0") or "0"


def position(sequence: str | None) -> str:
    if sequence is None:
        return "-"
    return sequence if len(sequence) <= 14 else "..." + sequence[-11:]
