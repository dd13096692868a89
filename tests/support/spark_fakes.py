"""A stand-in group member for unit tests of the source's planner (no engine, no Spark).

:class:`SoloMember` owns every shard of its streams, parents before children (a child is listed
only once every parent was completed with ``finished=True``), and records each call, so a test
can check what the planner began, completed and abandoned. Shards in ``hidden`` are not listed
by ``owned()`` (a claim that comes late). A shard in ``lose`` has its lease lost at its next
``complete()`` (refused, False) and re-claimed at once under the next lease number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3

from kinesumer import Config
from kinesumer.models import Position


@dataclass(frozen=True)
class FakeOwned:
    stream: str
    shard_id: str
    owner: str
    lease: int
    position: Position | None
    start: Any
    started_at_ms: int | None = None  # where a plain member began reading at LATEST

    @property
    def key(self) -> tuple[str, str]:
        return self.stream, self.shard_id


@dataclass(frozen=True)
class FakeStats:
    client_id: str
    claims_pending: bool = False
    coordinator_ticks: int = 0


@dataclass
class SoloMember:
    config: Config
    client_id: str = "solo-1"
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    positions: dict[tuple[str, str], Position | None] = field(default_factory=dict)
    finished: set[tuple[str, str]] = field(default_factory=set)
    begun: dict[tuple[str, str], int] = field(default_factory=dict)
    streams: tuple[str, ...] = ()
    ticks: int = 0
    closed: bool = False
    hidden: set[tuple[str, str]] = field(default_factory=set)
    lose: set[tuple[str, str]] = field(default_factory=set)
    leases: dict[tuple[str, str], int] = field(default_factory=dict)
    started: dict[tuple[str, str], int] = field(default_factory=dict)

    def start(self, streams: Sequence[str]) -> None:
        self.streams = tuple(streams)
        self.calls.append(("start", self.streams))

    def _shards(self) -> list[dict[str, Any]]:
        client = boto3.client(
            "kinesis", endpoint_url=self.config.kinesis_endpoint, region_name="us-east-1"
        )
        out = []
        for stream in self.streams:
            for shard in client.list_shards(StreamName=stream)["Shards"]:
                out.append({"stream": stream, **shard})
        return out

    def owned(self) -> list[FakeOwned]:
        out = []
        for shard in self._shards():
            key = (shard["stream"], shard["ShardId"])
            if key in self.finished or key in self.hidden:
                continue
            parents = [shard.get(p) for p in ("ParentShardId", "AdjacentParentShardId")]
            known = {s["ShardId"] for s in self._shards() if s["stream"] == key[0]}
            pending = [p for p in parents if p and p in known and (key[0], p) not in self.finished]
            if pending:
                continue
            is_child = any(p and p in known for p in parents)
            start = "TRIM_HORIZON" if is_child else self.config.initial_position
            lease = self.leases.get(key, 1)
            position = self.positions.get(key)
            started = self.started.get(key)
            out.append(FakeOwned(*key, self.client_id, lease, position, start, started))
        return out

    def begin(self, key: tuple[str, str], lease: int | None = None) -> bool:
        self.calls.append(("begin", key))
        self.begun[key] = self.begun.get(key, 0) + 1
        return key not in self.finished and lease in (None, self.leases.get(key, 1))

    def record_start(self, key: tuple[str, str], lease: int, started_at_ms: int) -> bool:
        self.calls.append(("record_start", key, started_at_ms))
        if lease != self.leases.get(key, 1):
            return False
        if self.positions.get(key) is None:
            self.started.setdefault(key, started_at_ms)
        return True

    def complete(
        self, key: tuple[str, str], position: Position | None, *, finished: bool = False
    ) -> bool:
        self.calls.append(("complete", key, position, finished))
        assert self.begun.get(key, 0) > 0, f"complete({key}) without begin"
        self.begun[key] -= 1
        if key in self.lose:  # lost: nothing written; claimed again under the next lease
            self.lose.discard(key)
            self.leases[key] = self.leases.get(key, 1) + 1
            return False
        if position is not None:
            self.positions[key] = position
        if finished:
            self.finished.add(key)
        return True

    def abandon(self, key: tuple[str, str]) -> None:
        self.calls.append(("abandon", key))
        self.begun[key] -= 1

    def abandon_all(self) -> int:
        ended = sum(self.begun.values())
        for key, count in sorted(self.begun.items()):
            self.calls.extend([("abandon", key)] * count)
        self.begun = {key: 0 for key in self.begun}
        return ended

    def stats(self) -> FakeStats:
        self.ticks += 1
        return FakeStats(self.client_id, False, self.ticks)

    def close(self) -> None:
        self.closed = True
