"""Reading one shard's range for one Spark batch: a new read up to the batch's limit or the
shard's tip, a replay of exactly a recorded range, or the batch formed from a read-ahead. The
ledger, which decides which of these a task does, is the caller's (:mod:`.executor`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from ....errors import KinesumerError
from ....kinesis import KinesisReader, ShardBatch
from ....kinesis.columns import EpochColumns
from ....kinesis.reader import IteratorExpired
from ....models import Position
from ...deps import require_pyarrow
from ..ledger import LedgerEntry
from ..offsets import Start
from ..partition import ShardPartition
from .readahead import ReadAheadBatch

if TYPE_CHECKING:
    import pyarrow


class ReplayMismatchError(KinesumerError):
    """A replayed batch could not read the records its ledger recorded (trimmed by retention,
    or the stream was re-created): the batch cannot be reproduced exactly."""


def _reached_tip(batch: ShardBatch[EpochColumns], asked: int) -> bool:
    """Whether an answer that gave records ended at the shard's tip: nothing behind it
    (``MillisBehindLatest`` 0) and fewer records than asked for. The second half keeps a
    stand-in that always reports 0 (kinesalite) from ending a backlog's read after one full
    answer; on AWS an answer cut short by size says how far behind it is. An answer whose only
    record was the resume point (skipped) gave nothing: that case stays with the empty-answer
    rule, which asks once more so a drained closed shard can say SHARD_END."""
    return len(batch.records) > 0 and batch.millis_behind == 0 and batch.raw_count < asked


def _latest_arrival_ms(records: EpochColumns) -> int | None:
    """The latest arrival time of ``records`` in epoch milliseconds (None if none has one)."""
    latest = records.latest_arrival()
    return None if latest is None else epoch_micros(latest) // 1000


def epoch_micros(seconds: float) -> int:
    """Epoch seconds as whole microseconds, rounded as msgspec's decoder rounds them (and
    :func:`kinesumer.spark.arrow.epoch_to_timestamp`, so a batch's recorded arrival is the same
    whether it was read or taken from a read-ahead's Arrow): the fraction's microseconds, half
    up (exact: the product is under 2**20, the half adds no digit)."""
    whole = math.floor(seconds)
    return int(whole) * 1_000_000 + math.floor((seconds - whole) * 1e6 + 0.5)


def _position(records: EpochColumns, index: int) -> tuple[int, int]:
    return int(records.sequence_numbers[index]), records.sub_sequence_numbers[index]


class ShardRangeReader:
    """GetRecords on one shard for one partition, paced at ``scan_interval``."""

    def __init__(
        self, reader: KinesisReader, p: ShardPartition, iterator: str | None = None
    ) -> None:
        self._reader = reader
        self._p = p
        self._next_call = 0.0
        self.asked = p.config.scan_limit  # the Limit of the last GetRecords
        # An iterator right after the partition's start (``start.after``), from the read that
        # ended there, used instead of asking GetShardIterator (once: a replay asks anew).
        self._start_iterator = iterator if p.start.after is not None else None
        #: After :meth:`read_new`: an iterator right after the batch's last record, when the
        #: batch took all of its last answer (None otherwise: then the next read must ask).
        self.next_iterator: str | None = None

    @property
    def partition(self) -> ShardPartition:
        return self._p

    def paced_after(self, other: ShardRangeReader) -> None:
        """Make this reader's first GetRecords wait as ``other``'s next would (same shard)."""
        self._next_call = max(self._next_call, other._next_call)

    def from_read_ahead(self, ahead: ReadAheadBatch) -> tuple[pyarrow.Table, LedgerEntry]:
        """The batch a read from the partition's start would have formed from what was read
        ahead: its first ``limit`` records, as the Arrow they were stored as. Caught up and
        SHARD_END hold only if all of them fit (records past the limit mean more is behind)."""
        rows = ahead.rows.slice(0, self._p.limit)
        count = rows.num_rows
        whole = count == ahead.rows.num_rows
        caught_up, shard_end = ahead.caught_up and whole, ahead.shard_end and whole
        end = None
        if count:
            sequence, sub = rows.column("sequence_number"), rows.column("sub_sequence_number")
            end = Position(sequence[count - 1].as_py(), sub[count - 1].as_py())
        require_pyarrow()
        import pyarrow.compute  # the spark extra's, there by now

        latest = pyarrow.compute.max(rows.column("approximate_arrival_timestamp"))
        arrival = latest.value // 1000 if latest.is_valid else None  # microseconds -> ms
        return rows, self._entry_of(end, count, caught_up, shard_end, ahead.millis_behind, arrival)

    async def _iterator(self, start: Start, after: Position | None) -> tuple[str, int | None]:
        """An iterator, and the instant before which leading records are skipped (see
        :meth:`Start.open`)."""
        return await start.open(self._reader, self._p.stream, self._p.shard_id, after)

    async def _records(
        self, deadline: float, wanted: Callable[[], int]
    ) -> AsyncGenerator[ShardBatch[EpochColumns], None]:
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
        iterator, self._start_iterator = self._start_iterator, None
        skip = last = after
        since: int | None = None  # AT_TIMESTAMP: leading records before this are skipped
        if iterator is None:
            iterator, since = await self._iterator(p.start, after)
        else:
            skip = None  # right after the start already: no resume record in the answer
        loop = asyncio.get_running_loop()
        while True:
            delay = self._next_call - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._next_call = loop.time() + p.config.scan_interval
            self.asked = min(p.config.scan_limit, max(1, wanted()) + (1 if skip else 0))
            try:
                batch = await self._reader.get_epoch_columns(
                    p.stream, p.shard_id, iterator, self.asked, skip
                )
            except IteratorExpired:
                # Resume after the last record read (AT it, skipping through it), or from the
                # start again when none was (its instant skipped anew).
                iterator, since = await self._iterator(p.start, last)
                skip = last
                continue
            if batch.raw_count:
                skip = None  # the resume point has been passed
            if since is not None and batch.raw_count:
                kept, reached = batch.records.arrived_since(since)
                if reached:
                    since = None
                batch = dataclasses.replace(batch, records=kept)
            if len(batch.records):
                last = batch.records.position(-1)
            yield batch
            if batch.next_iterator is None or time.monotonic() >= deadline:
                return
            iterator = batch.next_iterator

    async def read_new(self) -> tuple[EpochColumns, LedgerEntry]:
        p = self._p
        out = EpochColumns(p.stream, p.shard_id)
        caught_up = shard_end = False
        empty = 0
        behind: int | None = None  # the last answer's MillisBehindLatest (for progress)
        deadline = time.monotonic() + p.max_read_seconds
        answers = self._records(deadline, lambda: p.limit - len(out))
        # Closed on leaving: a generator left at a ``break`` would hold its caller's
        # records (``wanted`` reads them) until the loop finalized it.
        async with contextlib.aclosing(answers):
            async for batch in answers:
                behind = batch.millis_behind
                out.extend(batch.records)
                if len(out) > p.limit:
                    out.truncate(p.limit)  # the rest of this answer belongs to the next batch
                    self.next_iterator = None
                    break
                self.next_iterator = batch.next_iterator  # right after ``out``'s last record
                if batch.next_iterator is None:
                    shard_end = True
                    break
                if len(out) == p.limit:
                    break
                if batch.raw_count == 0 and not batch.millis_behind:
                    # At the tip. With nothing read yet, ask once more: a drained closed shard may
                    # answer empty once before it says SHARD_END (kinesalite does).
                    empty += 1
                    if len(out) or empty >= 2:
                        caught_up = True
                        break
                elif _reached_tip(batch, self.asked):
                    # A steady trickle never answers empty: stop where the answer reached the tip,
                    # so a batch lasts about one GetRecords, not ``max_read_seconds``.
                    caught_up = True
                    break
        if not len(out):
            self.next_iterator = None  # no end to key it by
        return out, self._entry(out, caught_up, shard_end, behind)

    def _entry(
        self, out: EpochColumns, caught_up: bool, shard_end: bool, behind: int | None
    ) -> LedgerEntry:
        end = out.position(-1) if len(out) else None
        arrival = _latest_arrival_ms(out)
        return self._entry_of(end, len(out), caught_up, shard_end, behind, arrival)

    def _entry_of(
        self,
        end: Position | None,
        count: int,
        caught_up: bool,
        shard_end: bool,
        behind: int | None,
        last_arrival_ms: int | None,
    ) -> LedgerEntry:
        p = self._p
        return LedgerEntry(
            batch=p.batch,
            stream=p.stream,
            shard_id=p.shard_id,
            end=end,
            count=count,
            caught_up=caught_up,
            shard_end=shard_end,
            last_arrival_ms=last_arrival_ms,
            owner=p.owner,
            lease=p.start.lease,
            millis_behind=behind,
        )

    async def replay(self, entry: LedgerEntry) -> EpochColumns:
        """Exactly the ``entry.count`` records from the start through ``entry.end``."""
        p = self._p
        out = EpochColumns(p.stream, p.shard_id)
        if entry.end is None or entry.count == 0:
            return out
        end = (int(entry.end.sequence_number), entry.end.sub_sequence_number)
        deadline = time.monotonic() + max(60.0, 3 * p.max_read_seconds)
        reached = False
        empty = 0
        answers = self._records(deadline, lambda: entry.count - len(out))
        # Closed on leaving: a generator left at a ``break`` would hold its caller's
        # records (``wanted`` reads them) until the loop finalized it.
        async with contextlib.aclosing(answers):
            async for batch in answers:
                got = batch.records
                upto = 0
                while upto < len(got) and _position(got, upto) <= end:
                    upto += 1
                out.extend(got.head(upto))
                if (len(out) and _position(out, -1) >= end) or len(out) >= entry.count:
                    reached = True
                    break
                if len(got) and _position(got, -1) > end:
                    break
                tip = batch.raw_count == 0 and not batch.millis_behind
                empty = empty + 1 if tip else 0
                if empty >= 3:
                    break  # at the shard's tip, and the recorded end never came: it is not there
        if not reached or len(out) != entry.count or _position(out, -1) != end:
            raise ReplayMismatchError(
                f"{p.describe()}: the ledger recorded {entry.count} records ending at "
                f"{entry.end.sequence_number}/{entry.end.sub_sequence_number}, but the shard now "
                f"gives {len(out)} records to that point: trimmed by retention, or the stream "
                f"was re-created; the batch cannot be replayed exactly"
            )
        return out
