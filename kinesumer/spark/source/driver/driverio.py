"""The driver side's own AWS calls: ledger reads and clean-up, and idle probes.

The planner's methods are plain blocking calls from Spark's long-lived source worker; the
library's clients are asyncio ones. :class:`DriverIO` runs one event loop on a daemon thread,
opens the clients there once, and runs each call on it. The group member
(:class:`~kinesumer.group.external.ExternalReadMember`) keeps its own loop and clients.

A probe is how an idle query finds new records without planning empty batches: for each shard
(every one caught up), one GetShardIterator plus one GetRecords of two records at most, from
where the next batch would start. Its records are dropped unseen: only "is there any?" leaves.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from ....aws import AwsClients, RequestStats
from ....config import Config
from ....kinesis import KinesisReader
from ....kinesis.places import places_for
from ....kinesis.reader import arrived_since
from ....kinesis.routing import routing_over
from ....models import ClientInfo
from ....statestore.dynamodb import DynamoDBStateStore
from ..ledger import Ledger, LedgerEntry
from ..offsets import Start, ms_datetime
from ..outage import ride_out
from .pins import LatestPins

T = TypeVar("T")

#: Answers a probe from an instant reads past records that arrived before it (a scan from the
#: oldest record, where that costs no more than AT_TIMESTAMP) before it lets a batch look on.
PROBE_SCAN_CALLS = 20


class DriverIO:
    """Clients and a loop thread for the planner; :meth:`close` ends both (idempotent)."""

    def __init__(
        self, config: Config, query: str, ledger_ttl: int, group: str, outage_timeout: float = 300.0
    ) -> None:
        """``group``: the app name of the query's consumer group (:mod:`.groups`): the pins and
        client items it reads live there; the ledger lives under ``config.app``.
        ``outage_timeout``: how long each call rides out an outage (:mod:`.outage`)."""
        self._config = config
        self._group = group
        self._outage_timeout = outage_timeout
        self._stats = RequestStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kinesumer-spark-io", daemon=True
        )
        self._thread.start()
        self._clients = AwsClients(config, self._stats)
        self._run(self._clients.open())
        table = config.dynamodb_table
        app_store = DynamoDBStateStore(self._clients.dynamodb, table, config.app, self._stats)
        self.ledger = Ledger(app_store, query, ledger_ttl)
        #: The query's consumer group's items: its pins and client items.
        self._group_store = DynamoDBStateStore(self._clients.dynamodb, table, group, self._stats)
        self._pins = LatestPins(self._group_store)
        routing = routing_over(self._clients, places_for(config, self._clients))
        self._reader = KinesisReader(routing, self._stats, config.region)
        self._closed = False

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    def _call(self, what: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``make()``'s coroutine run on the loop, riding out an outage (:mod:`.outage`)."""
        return ride_out(lambda: self._run(make()), self._outage_timeout, what)

    def batch(self, batch: int) -> dict[tuple[str, str], LedgerEntry]:
        return self._call(f"ledger read of batch {batch}", lambda: self.ledger.batch(batch))

    def delete_before(self, batch: int) -> int:
        return self._call("ledger clean-up", lambda: self.ledger.delete_before(batch))

    def latest_pin(self, key: tuple[str, str], now_ms: int) -> int:
        """Where reading ``key`` at LATEST began: if nowhere yet, where a LATEST read opened
        now begins by Kinesis's clock (:mod:`.pins`); ``now_ms``: this host's clock."""
        return self._call("LATEST pin", lambda: self._pins.pin(key, self._opened(key), now_ms))

    def _opened(self, key: tuple[str, str]) -> Callable[[], Coroutine[Any, Any, int]]:
        async def instant() -> int:
            _, since = await self._reader.open_latest(*key)
            return since

        return instant

    def remove_member(self, client_id: str) -> bool:
        """Delete ``client_id``'s client item (the member is believed dead), on condition that
        its ``last_update`` is still what was read just before: a member that heartbeats (it
        was alive after all) keeps its item. True when the item was deleted."""
        seen = self.member_last_update(client_id)
        return seen is not None and self.delete_member(client_id, seen)

    def member_last_update(self, client_id: str) -> int | None:
        """``client_id``'s ``last_update`` (epoch ms), or None when it has no client item."""
        return self._call("member read", lambda: self._last_update(client_id))

    def delete_member(self, client_id: str, seen: int) -> bool:
        """Delete ``client_id``'s client item if its ``last_update`` is still ``seen``."""
        return self._call("member removal", lambda: self._delete(client_id, seen))

    async def _last_update(self, client_id: str) -> int | None:
        client = await self._group_store.get_client(client_id)
        return None if client is None else client.last_update_ms

    async def _delete(self, client_id: str, seen: int) -> bool:
        # The leader's prune, by ``last_update`` alone (no beat: the stamp is all that was
        # read): deleted only if it did not heartbeat since ``seen``.
        return await self._group_store.prune_client(ClientInfo(client_id, seen))

    def closed_shards(self, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of ``keys`` are closed shards (split or merged: they end at SHARD_END)."""
        wanted = set(keys)
        return self._call("shard list", lambda: self._list_closed(wanted)) if wanted else set()

    async def _list_closed(self, wanted: set[tuple[str, str]]) -> set[tuple[str, str]]:
        closed: set[tuple[str, str]] = set()
        for stream in sorted({stream for stream, _ in wanted}):
            for shard in await self._reader.list_shards(stream):
                if shard.closed and (stream, shard.shard_id) in wanted:
                    closed.add((stream, shard.shard_id))
        return closed

    def any_new(self, starts: Mapping[tuple[str, str], Start]) -> bool:
        """Whether any shard holds a record past its start (probes run concurrently)."""
        return bool(starts) and self._call("probe", lambda: self._any_new(starts))

    async def _any_new(self, starts: Mapping[tuple[str, str], Start]) -> bool:
        found = await asyncio.gather(*(self._probe(k, s) for k, s in starts.items()))
        return any(found)

    async def _probe(self, key: tuple[str, str], start: Start) -> bool:
        stream, shard_id = key
        reader = self._reader
        iterator, since = await start.open(reader, stream, shard_id, start.after)
        # An iterator AT the start's sequence number returns that record first (skipped as
        # already read). A drained closed shard may need a further empty answer before it
        # says SHARD_END (kinesalite does), and it must be read to its end once more so that
        # its children follow: up to three calls. From an instant, records that arrived
        # before it are passed over (a scan from the oldest, see Start.open) without counting
        # against those three, up to PROBE_SCAN_CALLS answers.
        skip = start.after
        empty = scans = 0
        while empty < 3 and scans < PROBE_SCAN_CALLS:
            limit = 2 if since is None else self._config.scan_limit
            batch = await reader.get_records(stream, shard_id, iterator, limit, skip)
            records = batch.records
            if since is not None and records:
                records, reached = arrived_since(records, ms_datetime(since))
                since = None if reached else since
            if records or batch.next_iterator is None:
                return True
            if batch.raw_count and since is not None:
                scans += 1  # all before the instant: look further
            elif batch.millis_behind:
                return True
            else:
                empty += 1
            iterator, skip = batch.next_iterator, None
            await asyncio.sleep(self._config.scan_interval)
        return scans >= PROBE_SCAN_CALLS  # still scanning: let a batch read on

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._clients.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
