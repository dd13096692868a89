"""AsyncKinesumer: the consumer group as an async iterator (aioboto3 underneath)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from types import TracebackType

from ..config import Config, check_streams
from ..engine.engine import ConsumerStats, Engine
from ..engine.hooks import Hook, RebalanceHooks
from ..errors import ConsumerClosedError
from ..models import Record


class AsyncKinesumer:
    """A member of a consumer group, for asyncio applications.

    ::

        async with AsyncKinesumer(config) as consumer:
            async for record in consumer.consume(["orders"]):
                await handle(record)

    With ``auto_commit=True`` (the default) a record counts as processed when the application
    asks for the next one; with ``auto_commit=False`` when it calls :meth:`commit`.
    """

    def __init__(
        self,
        config: Config,
        *,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"AsyncKinesumer needs a kinesumer.Config, got {type(config).__name__}")
        self._engine = Engine(config, RebalanceHooks(on_assigned, on_revoked))
        self._consuming_task: asyncio.Task[object] | None = None

    @property
    def client_id(self) -> str:
        return self._engine.client_id

    async def consume(self, streams: Iterable[str]) -> AsyncIterator[Record]:
        """Join the group (or change streams), then yield records from this member's shards
        until :meth:`aclose`. Errors from the engine are raised here."""
        names = check_streams(streams)
        engine = self._engine
        await engine.start(names)
        self._consuming_task = asyncio.current_task()
        cursor = engine.cursor
        while True:
            record = cursor.next_local()
            if record is None:
                try:
                    lease, records = await engine.next_batch()
                except ConsumerClosedError:
                    return
                cursor.set_batch(lease, records)
                continue
            yield record

    async def subscribe(self, streams: Iterable[str]) -> None:
        """Join the group for ``streams`` (or change them) without iterating: for :meth:`poll`."""
        await self._engine.start(check_streams(streams))

    async def poll(self, max_records: int = 1000, timeout: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records from this member's shards, waiting at most ``timeout``
        seconds; after :meth:`subscribe`. In auto-commit mode a poll's records count as processed
        at the next poll; otherwise at :meth:`commit`."""
        if not self._engine.started:
            raise RuntimeError("call subscribe(streams) before poll()")
        return await self._engine.poll(max_records, timeout)

    async def commit(self) -> None:
        """Mark every record delivered so far as processed and write the checkpoints now."""
        await self._engine.commit()

    async def refresh(self, streams: Iterable[str]) -> None:
        """Consume a different set of streams from now on."""
        await self._engine.start(check_streams(streams))

    def lag(self) -> dict[tuple[str, str], int | None]:
        """``(stream, shard_id)`` -> MillisBehindLatest of each shard this member reads."""
        return self._engine.lag()

    def stats(self) -> ConsumerStats:
        return self._engine.snapshot()

    async def aclose(self, *, discard: bool = False) -> None:
        """Hand every shard off gracefully and leave the group.

        Called from the task that iterates (in auto-commit mode), the record it holds counts as
        processed; from elsewhere, the handoff waits up to ``handoff_timeout`` for it. With
        ``discard=True`` (the application failed on what it holds) only what was processed or
        committed is checkpointed and nothing is waited for; the rest is delivered again.
        """
        same_task = self._consuming_task is asyncio.current_task()
        await self._engine.close(
            in_hand_done=same_task and self._engine.config.auto_commit, discard=discard
        )

    async def __aenter__(self) -> AsyncKinesumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving on an exception: the record in hand was not processed; do not checkpoint it.
        await self.aclose(discard=exc_type is not None)
