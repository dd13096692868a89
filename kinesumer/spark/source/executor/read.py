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

The first attempt of a batch this run planned, in the first job that reads it
(``ShardPartition.planned_here``: not a batch taken from the offset log after a restart, nor a
further job reading the batch again), does not look the item up: there is none unless a
concurrent attempt wrote it, and the conditional write finds that one anyway (case 2's last
step). One DynamoDB read less per shard and batch; a retry or a speculative copy (Spark's
attempt number above 0) looks first, as does any read outside a Spark task.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import gc
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ....aws import AwsClients, RequestStats
from ....config import Config
from ....kinesis import KinesisReader
from ....kinesis.places import places_for
from ....kinesis.routing import routing_over
from ....models import Position, Record
from ....runtime.loop_thread import LoopThread
from ....statestore.dynamodb import DynamoDBStateStore
from ...arrow import epoch_columns_to_arrow, table_to_records
from ..ledger import Ledger, LedgerEntry
from ..offsets import Start
from ..outage import ride_out
from ..partition import ShardPartition
from .readahead import DEPTH, ReadAheadBatch, ReadAheadFiles, default_root
from .shard_read import ShardRangeReader

if TYPE_CHECKING:
    import pyarrow

log = logging.getLogger("kinesumer.spark.source")

#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 10_000


def read_partition(partition: ShardPartition) -> Iterator[Any]:
    """The partition's records as ``pyarrow.RecordBatch``es in Spark's exact schema
    (:func:`kinesumer.spark.arrow.arrow_schema`, which equals what Spark expects for
    :data:`~kinesumer.spark.arrow.SCHEMA_DDL`)."""
    clients = worker_clients()
    rows = ride_out(
        lambda: clients.read(partition), partition.outage_timeout, f"read of {partition.describe()}"
    )
    return iter(rows.to_batches(max_chunksize=ARROW_BATCH_ROWS))


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

    def read(self, p: ShardPartition) -> pyarrow.Table:
        return self._loop.run(self._read(p))

    async def _read(self, p: ShardPartition) -> pyarrow.Table:
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
        files = ReadAheadFiles(default_root(), p.config.app, p.query) if p.read_ahead else None
        return await read_with(opened[0], opened[1], p, files)


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
    """:func:`read_with` on clients of its own (opened and closed here), as records (tests and
    diagnostics)."""
    stats = RequestStats()
    clients = AwsClients(p.config, stats)
    await clients.open()
    try:
        return table_to_records(await read_with(clients, stats, p))
    finally:
        await clients.close()


async def read_with(
    clients: AwsClients,
    stats: RequestStats,
    p: ShardPartition,
    read_ahead: ReadAheadFiles | None = None,
) -> pyarrow.Table:
    """The partition's records as an Arrow table in Spark's schema, as the ledger decides (see
    the module docstring), taken from this host's read-ahead of the shard when there is one
    (see :mod:`.readahead`): then as the table it was stored as."""
    store = DynamoDBStateStore(clients.dynamodb, p.config.dynamodb_table, p.config.app, stats)
    ledger = Ledger(store, p.query, p.ledger_ttl)
    # A table's stream ARN goes to DynamoDB Streams, in the ARN's region.
    reader = KinesisReader(
        routing_over(clients, places_for(p.config, clients)), stats, p.config.region
    )
    shard = ShardRangeReader(reader, p)
    entry = None if first_attempt(p) else await ledger.get(p.batch, p.stream, p.shard_id)
    if entry is not None:
        log.info("%s: replay of %d records", p.describe(), entry.count)
        return epoch_columns_to_arrow(await shard.replay(entry))
    ahead = None
    if read_ahead is not None and p.start.after is not None:
        wait = p.max_read_seconds + READ_AHEAD_GRACE
        try:
            ahead = await read_ahead.take(p.stream, p.shard_id, p.start.after, wait, p.run)
        except OSError as error:  # the folder, not the shard: read as if there were none
            log.warning("%s: read-ahead not taken: %r", p.describe(), error)
    rows: pyarrow.Table | None = None
    if ahead is not None and ahead.rows.num_rows:
        rows, entry = shard.from_read_ahead(ahead)
    else:
        records, entry = await shard.read_new()
    held = await ledger.record(entry)
    if held != entry:
        log.info("%s: another attempt won; replaying its %d records", p.describe(), held.count)
        return epoch_columns_to_arrow(await shard.replay(held))
    if rows is None:
        rows = epoch_columns_to_arrow(records)
        del records
    log.info("%s: %d records%s", p.describe(), rows.num_rows, _how(entry))
    if read_ahead is not None and p.start.after is not None and entry.end is not None:
        read_ahead.ended(p.stream, p.shard_id, p.start.after, entry.end)
    if read_ahead is not None and _more_behind(entry, p):
        start_in_background(
            _read_ahead(read_ahead, reader, _next_of(p, entry), shard, shard.next_iterator)
        )
    return rows


def first_attempt(p: ShardPartition) -> bool:
    """Whether this is Spark's first attempt at this task of a batch planned in this run. A
    stage run again (a shuffle's output lost) starts its attempts at 0 again: such a task reads
    anew, then finds the earlier attempt's item at the write and replays it (correct, one read
    more; rare)."""
    if not p.planned_here:
        return False
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the source needs pyspark
        return False
    context = TaskContext.get()
    return context is not None and context.attemptNumber() == 0


#: How long past ``max_read_seconds`` a task waits for a read-ahead of its start under way
#: before reading itself (GetShardIterator and retries come on top of the read's own bound).
READ_AHEAD_GRACE = 5.0

_BACKGROUND: set[asyncio.Task[None]] = set()


def start_in_background(coro: Any) -> None:
    """Run ``coro`` on the worker's loop after the task returns (a reference is kept), in a
    context of its own: the task's outage clock (``aws.retry.outage_clock``) is the task's, and
    a read ahead answering must not reset it."""
    task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _more_behind(entry: LedgerEntry, p: ShardPartition) -> bool:
    """Whether the batch stopped at its limit with the shard not caught up: records are behind
    it, worth reading ahead. An idle or closed shard is never read ahead (a batch may fill its
    limit with a closed shard's last records and SHARD_END in the same answer)."""
    return (
        entry.end is not None
        and entry.count >= p.limit
        and not entry.caught_up
        and not entry.shard_end
    )


def _next_of(p: ShardPartition, entry: LedgerEntry) -> ShardPartition:
    """The partition the next batch of this shard will most likely be: from right after this
    batch's recorded end, under the same claim and limit."""
    assert entry.end is not None
    return _from(p, entry.end)


def _from(p: ShardPartition, after: Position) -> ShardPartition:
    start = Start(after=after, lease=p.start.lease)
    return dataclasses.replace(p, batch=p.batch + 1, start=start)


async def _read_ahead(
    files: ReadAheadFiles,
    reader: KinesisReader,
    p: ShardPartition,
    done: ShardRangeReader,
    iterator: str | None = None,
) -> None:
    """Read the shard's next batches ahead, from ``p``'s start, while records are behind and
    up to the read-ahead's depth, and leave them for their tasks. A failure leaves nothing:
    the next task reads for itself, and meets the error there if it lasts.

    Each read starts from the iterator the read before it ended with, when there is one
    (``iterator`` for the first: the task's own read), passed on in the read-ahead's files
    between workers: no GetShardIterator per batch (a call Kinesis allows 5 times a second per
    shard, for all its readers)."""
    for _ in range(DEPTH + 2):  # each step moves on; DEPTH stops it sooner
        after = p.start.after
        assert after is not None
        try:
            if not files.begin(p.stream, p.shard_id, after):
                past = files.read_past(p.stream, p.shard_id, after, p.run)
                if past is None:
                    return
                p, iterator = _from(p, past[0]), past[1]  # read ahead already: go on past it
                continue
        except OSError as error:
            log.warning("%s: no read-ahead: %r", p.describe(), error)
            return
        ahead = ShardRangeReader(reader, p, iterator)
        ahead.paced_after(done)  # the shard's reads stay ``scan_interval`` apart
        try:
            records, entry = await ahead.read_new()
            if not records:
                files.abandon(p.stream, p.shard_id, after)
                return
            # Built here, in the background, as the task would have: it hands a slice to Spark.
            rows = epoch_columns_to_arrow(records)
            batch = ReadAheadBatch(
                after, rows, entry.caught_up, entry.shard_end, entry.millis_behind
            )
            more = _more_behind(entry, p)
            iterator = ahead.next_iterator if more else None
            files.finish(p.stream, p.shard_id, batch, p.run, entry.end if more else None, iterator)
            # In its file now: not held (twice: records and Arrow) while the next is read.
            del records, rows, batch
        except asyncio.CancelledError:
            files.abandon(p.stream, p.shard_id, after)
            raise
        except Exception as error:  # the next task reads for itself
            files.abandon(p.stream, p.shard_id, after)
            log.warning("%s: read-ahead failed, the task will read: %r", p.describe(), error)
            return
        if not more:
            return
        p, done = _next_of(p, entry), ahead


def _how(entry: LedgerEntry) -> str:
    if entry.shard_end:
        return ", SHARD_END"
    return ", caught up" if entry.caught_up else ""
