"""A consumer group's AWS in memory: one :class:`~kinesumer.testing.MemoryKinesis` and one
:class:`~kinesumer.testing.MemoryState` that every member of a test shares, as processes share
AWS's stream and table. What the group's behaviour tests run on when their point is the
protocol (claims, handoffs, checkpoints, hooks), not a server: the contract suite
(``tests/contract/``) holds the two to the real stand-ins' behaviour.

The members are :class:`support.group.Member`, with the :data:`support.group.FAST` timings of
:func:`support.group.make_config`: the group's timers run on the real clock here too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from kinesumer import AsyncKinesumer, Config, Record
from kinesumer.testing import MemoryKinesis, MemoryState
from support.group import Member, make_config, numbered


class MemoryGroup:
    """Group ``app``'s Kinesis and state table (named ``table`` in its members' configs, as a
    ``kinesumer checkpoints reset`` command they print names it), both in memory."""

    def __init__(self, app: str, table: str) -> None:
        self.app, self.table = app, table
        self.kinesis = MemoryKinesis()
        self.state = MemoryState()

    def config(self, **overrides: Any) -> Config:
        """A member's config: :func:`support.group.make_config`'s, with no endpoint."""
        return make_config(None, None, self.app, self.table, **overrides)

    def create_stream(self, name: str, shards: int) -> None:
        self.kinesis.create_stream(name, shards)

    def put(
        self, stream: str, start: int, count: int, key: Callable[[int], str] = str
    ) -> list[bytes]:
        """:func:`support.group.put` into the memory stream: records numbered
        start..start+count-1 (data b"<n>"); returns the data."""
        records = numbered(start, count, key)
        for data, partition_key in records:
            self.kinesis.put(stream, data, partition_key)
        return [data for data, _ in records]

    def consumer(self, config: Config, **hooks: Any) -> AsyncKinesumer:
        """A consumer of the group (``hooks``: ``on_assigned``, ``on_revoked``)."""
        return AsyncKinesumer(config, kinesis=self.kinesis, state=self.state, **hooks)

    def member(
        self, config: Config, streams: Iterable[str], sink: list[tuple[str, Record]]
    ) -> Member:
        """A member of the group, not started."""
        return Member(config, streams, sink, consumer=self.consumer(config))

    @contextlib.asynccontextmanager
    async def state_store(self) -> AsyncIterator[MemoryState]:
        """The group's state table as another process sees it (:func:`support.group.
        state_store`'s role): to read what members wrote, or to write as an intruder."""
        yield self.state.for_app(self.app)
