"""``read(partition)`` on an executor: GetRecords for one shard of one batch, as Arrow.

Runs in executor Python workers, with the library's own reader (:class:`KinesisReader`: retries,
KPL unpacking, epoch timestamps) inside ``asyncio.run``. The ledger decides the range:

1. The (batch, shard) item exists: a replay (task retry, speculative copy, restart). Read from
   the start up to and including the recorded end: exactly the recorded records, or
   :class:`ReplayMismatchError` if the stream no longer holds them (trimmed, re-created).
2. It does not: read from the start until the partition's record limit, the shard's tip (an
   empty answer with nothing behind, or an answer that reached it: ``MillisBehindLatest`` 0 with
   fewer records than asked for, so a steady trickle ends a batch after one answer instead of at
   ``max_read_seconds``), SHARD_END or ``max_read_seconds``; then write the item conditionally.
   Whatever stopped the read, the item records the end it reached. If another attempt won
   meanwhile, return exactly *its* range instead.

Records are handed to Spark only after the ledger holds their range, so no attempt ever yields
what a concurrent attempt might not agree on.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...aws import AwsClients, RequestStats
from ...config import Config
from ...engine.loop_thread import LoopThread
from ...errors import KinesumerError
from ...kinesis import KinesisReader, ShardBatch
from ...kinesis.reader import IteratorExpired
from ...models import Position, Record
from ..arrow import records_to_batches
from .ledger import Ledger, LedgerEntry
from .offsets import Start
from .outage import ride_out
from .partition import ShardPartition

log = logging.getLogger("kinesumer.spark.source")

#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 10_000


class ReplayMismatchError(KinesumerError):
    """A replayed batch could not read the records its ledger recorded (trimmed by retention,
    or the stream was re-created): the batch cannot be reproduced exactly."""


class InjectedReadFailure(RuntimeError):
    """TEST ONLY: raised once per (batch, shard) when ``test_fail_first_read_dir`` is set."""


def read_partition(partition: ShardPartition) -> Iterator[Any]:
    """The partition's records as ``pyarrow.RecordBatch``es in Spark's exact schema
    (:func:`kinesumer.spark.arrow.arrow_schema`, which equals what Spark expects for
    :data:`~kinesumer.spark.arrow.SCHEMA_DDL`)."""
    clients = worker_clients()
    records = ride_out(
        lambda: clients.read(partition), partition.outage_timeout, f"read of {partition.describe()}"
    )
    return records_to_batches(records, ARROW_BATCH_ROWS)


class WorkerClients:
    """What one executor Python worker keeps between tasks (Spark reuses workers): an event
    loop thread and, per Config, the AWS clients, opened once. Opening clients costs about
    0.1-0.2 s of CPU (service models, sessions): once per worker, not once per shard and batch.

    Once clients are open, the worker's objects so far (modules, service models, clients: about
    120k objects, all long-lived) are moved out of the cyclic garbage collector's sight
    (``gc.freeze()``). A reused PySpark worker runs a full ``gc.collect()`` after every task,
    which walked them all: about 0.07 s of CPU per task, more than a task that reads a quiet
    shard costs itself. Frozen objects are still freed by reference counting; what the freeze
    gives up is collecting a reference cycle among them, should one become garbage (the
    garbage of the moment is collected just before freezing, or it would never be freed).
    """

    def __init__(self) -> None:
        self._loop = LoopThread("kinesumer-spark-executor")
        self._clients: dict[Config, tuple[AwsClients, RequestStats]] = {}

    def read(self, p: ShardPartition) -> list[Record]:
        return self._loop.run(self._read(p))

    async def _read(self, p: ShardPartition) -> list[Record]:
        opened = self._clients.get(p.config)
        if opened is None:
            stats = RequestStats()
            clients = AwsClients(p.config, stats)
            await clients.open()
            opened = self._clients[p.config] = (clients, stats)
            # Collected first: a reference cycle frozen while garbage is never freed (about 900
            # objects are, here, the garbage of opening the clients). Once per Config.
            gc.collect()
            gc.freeze()
        return await read_with(opened[0], opened[1], p)


_WORKER: WorkerClients | None = None
_WORKER_LOCK = threading.Lock()


def worker_clients() -> WorkerClients:
    """This process's :class:`WorkerClients` (made on first use)."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = WorkerClients()
        return _WORKER


async def read_records(p: ShardPartition) -> list[Record]:
    """:func:`read_with` on clients of its own (opened and closed here)."""
    stats = RequestStats()
    clients = AwsClients(p.config, stats)
    await clients.open()
    try:
        return await read_with(clients, stats, p)
    finally:
        await clients.close()


async def read_with(clients: AwsClients, stats: RequestStats, p: ShardPartition) -> list[Record]:
    """The partition's records, as the ledger decides (see the module docstring)."""
    ledger = Ledger(
        clients.dynamodb, p.config.dynamodb_table, p.config.app, p.query, stats, p.ledger_ttl
    )
    shard = _ShardReader(KinesisReader(clients.kinesis, stats, p.config.region), p)
    entry = await ledger.get(p.batch, p.stream, p.shard_id)
    if entry is not None:
        log.info("%s: replay of %d records", p.describe(), entry.count)
        return await shard.replay(entry)
    records, entry = await shard.read_new()
    held = await ledger.record(entry)
    _maybe_fail(p)
    if held != entry:
        log.info("%s: another attempt won; replaying its %d records", p.describe(), held.count)
        return await shard.replay(held)
    log.info("%s: %d records%s", p.describe(), len(records), _how(entry))
    return records


def _how(entry: LedgerEntry) -> str:
    if entry.shard_end:
        return ", SHARD_END"
    return ", caught up" if entry.caught_up else ""


def _maybe_fail(p: ShardPartition) -> None:
    """TEST ONLY seam: fail the first attempt of (batch, shard) once, after its ledger write."""
    if not p.fail_first_read_dir:
        return
    marker = Path(p.fail_first_read_dir) / f"{p.query}-{p.batch}-{p.stream}-{p.shard_id}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedReadFailure(f"test seam: first read of {p.describe()} fails once")


def _reached_tip(batch: ShardBatch, asked: int) -> bool:
    """Whether an answer that gave records ended at the shard's tip: nothing behind it
    (``MillisBehindLatest`` 0) and fewer records than asked for. The second half keeps a
    stand-in that always reports 0 (kinesalite) from ending a backlog's read after one full
    answer; on AWS an answer cut short by size says how far behind it is. An answer whose only
    record was the resume point (skipped) gave nothing: that case stays with the empty-answer
    rule, which asks once more so a drained closed shard can say SHARD_END."""
    return bool(batch.records) and batch.millis_behind == 0 and batch.raw_count < asked


def _position(record: Record) -> tuple[int, int]:
    return int(record.sequence_number), record.sub_sequence_number


class _ShardReader:
    """GetRecords on one shard for one partition, paced at ``scan_interval``."""

    def __init__(self, reader: KinesisReader, p: ShardPartition) -> None:
        self._reader = reader
        self._p = p
        self._next_call = 0.0
        self.asked = p.config.scan_limit  # the Limit of the last GetRecords

    async def _iterator(self, start: Start, after: Position | None) -> str:
        return await self._reader.shard_iterator(
            self._p.stream,
            self._p.shard_id,
            after,
            start.initial,  # type: ignore[arg-type]
        )

    async def _records(self, deadline: float, wanted: Callable[[], int]) -> Any:
        """Yield GetRecords answers from the partition's start (an async generator), each asked
        for no more records than the caller still ``wanted()`` (at most ``scan_limit``).

        Asking for what the batch still needs, not ``scan_limit``: a batch of 5,000 records per
        shard once read 10,000 and dropped half, twice the bytes against the shard's 2 MB/s of
        reads (and, on on-demand streams, its bill) and twice the time. A Kinesis record holds
        one or more of the user records ``wanted`` counts (KPL aggregates hold several), so
        that many Kinesis records are always enough; one more when the answer starts with the
        resume record, whose user records up to the resume point are skipped."""
        p = self._p
        after = p.start.after
        iterator = await self._iterator(p.start, after)
        skip = last = after
        loop = asyncio.get_running_loop()
        while True:
            delay = self._next_call - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._next_call = loop.time() + p.config.scan_interval
            self.asked = min(p.config.scan_limit, max(1, wanted()) + (1 if skip else 0))
            try:
                batch = await self._reader.get_records(
                    p.stream, p.shard_id, iterator, self.asked, skip
                )
            except IteratorExpired:
                # Resume after the last record read (AT it, skipping through it).
                iterator = await self._iterator(p.start, last)
                skip = last
                continue
            if batch.raw_count:
                skip = None  # the resume point has been passed
            if batch.records:
                tail = batch.records[-1]
                last = Position(tail.sequence_number, tail.sub_sequence_number)
            yield batch
            if batch.next_iterator is None or time.monotonic() >= deadline:
                return
            iterator = batch.next_iterator

    async def read_new(self) -> tuple[list[Record], LedgerEntry]:
        p = self._p
        out: list[Record] = []
        caught_up = shard_end = False
        empty = 0
        behind: int | None = None  # the last answer's MillisBehindLatest (for progress)
        deadline = time.monotonic() + p.max_read_seconds
        async for batch in self._records(deadline, lambda: p.limit - len(out)):
            behind = batch.millis_behind
            out.extend(batch.records)
            if len(out) > p.limit:
                del out[p.limit :]  # the rest of this answer belongs to the next batch
                break
            if batch.next_iterator is None:
                shard_end = True
                break
            if len(out) == p.limit:
                break
            if batch.raw_count == 0 and not batch.millis_behind:
                # At the tip. With nothing read yet, ask once more: a drained closed shard may
                # answer empty once before it says SHARD_END (kinesalite does).
                empty += 1
                if out or empty >= 2:
                    caught_up = True
                    break
            elif _reached_tip(batch, self.asked):
                # A steady trickle never answers empty: stop where the answer reached the tip,
                # so a batch lasts about one GetRecords, not ``max_read_seconds``.
                caught_up = True
                break
        arrivals = [r.approximate_arrival_timestamp for r in out]
        last_arrival = max((int(a.timestamp() * 1000) for a in arrivals if a), default=None)
        end = Position(out[-1].sequence_number, out[-1].sub_sequence_number) if out else None
        entry = LedgerEntry(
            batch=p.batch,
            stream=p.stream,
            shard_id=p.shard_id,
            end=end,
            count=len(out),
            caught_up=caught_up,
            shard_end=shard_end,
            last_arrival_ms=last_arrival,
            owner=p.owner,
            lease=p.start.lease,
            millis_behind=behind,
        )
        return out, entry

    async def replay(self, entry: LedgerEntry) -> list[Record]:
        """Exactly the ``entry.count`` records from the start through ``entry.end``."""
        p = self._p
        if entry.end is None or entry.count == 0:
            return []
        end = (int(entry.end.sequence_number), entry.end.sub_sequence_number)
        out: list[Record] = []
        deadline = time.monotonic() + max(60.0, 3 * p.max_read_seconds)
        reached = False
        empty = 0
        async for batch in self._records(deadline, lambda: entry.count - len(out)):
            for record in batch.records:
                if _position(record) > end:
                    break
                out.append(record)
            if (out and _position(out[-1]) >= end) or len(out) >= entry.count:
                reached = True
                break
            if batch.records and _position(batch.records[-1]) > end:
                break
            tip = batch.raw_count == 0 and not batch.millis_behind
            empty = empty + 1 if tip else 0
            if empty >= 3:
                break  # at the shard's tip, and the recorded end never came: it is not there
        if not reached or len(out) != entry.count or _position(out[-1]) != end:
            raise ReplayMismatchError(
                f"{p.describe()}: the ledger recorded {entry.count} records ending at "
                f"{entry.end.sequence_number}/{entry.end.sub_sequence_number}, but the shard now "
                f"gives {len(out)} records to that point: trimmed by retention, or the stream "
                f"was re-created; the batch cannot be replayed exactly"
            )
        return out
