"""The lag probe's reads of one shard: how old its oldest unread record is, by Kinesis's clock,
read from the stream itself (no member needs to run). The rules are pure and live in
:mod:`kinesumer.core.lag`; this module makes the calls, through the readers' own
:class:`~.reader.KinesisReader` (its retries, its named errors, its KPL unpacking and skipping),
so it works on every :class:`~.transport.KinesisTransport`: AWS, a local stand-in,
``kinesumer.testing.MemoryKinesis``.

One probe of a shard is:

1. GetShardIterator where the shard's next reader would start
   (:func:`~kinesumer.core.lag.probe_start`): AT the checkpointed sequence number (the
   checkpointed record itself is skipped, with the sub-records of a KPL aggregate it covers,
   as the readers resume), else TRIM_HORIZON. Its answer's ``Date`` header is Kinesis's "now"
   for the probe (:func:`~kinesumer.core.lag.server_now_ms`): this host's clock is never
   compared with Kinesis's stamps.
2. GetRecords with a small ``Limit``, and the age of the first unread record on the page
   (:func:`~kinesumer.core.lag.record_lag`); further pages only while a page shows none and
   more may follow (:func:`~kinesumer.core.lag.judge_page`), at most ``max_pages``.

From a recorded ``LATEST`` start the probe reads from TRIM_HORIZON and skips the records that
arrived before it, as the readers' :meth:`~.reader.KinesisReader.scan_since` does; when the
first page shows more records behind the tip (AWS), it opens AT_TIMESTAMP instead (a second
GetShardIterator). kinesalite's AT_TIMESTAMP never answers on a shard without a record after
the instant, and its MillisBehindLatest is always 0, so there it scans (``SCAN_LIMIT`` records a
page).

A DynamoDB table's stream (read through :mod:`.dynamodb_streams`) has no MillisBehindLatest
and no AT_TIMESTAMP: its lag is the ``Date``'s second, taken at its end, minus the oldest unread
change's ``ApproximateCreationDateTime``, which AWS rounds down to the second. The figure is
never below the true age and at most about 2 s above it (1 s of each rounding). An empty page
with a next iterator is taken as the tip (no MillisBehindLatest says otherwise), and a recorded
``LATEST`` start is always scanned for from the oldest record.

Cost: 1 GetShardIterator (2 from a LATEST start on AWS) and usually 1 GetRecords per shard, at
most ``max_pages``; they count against the 5 GetShardIterator and 5 GetRecords calls a second
per shard that every reader of the stream shares.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone

from ..core.lag import (
    PageVerdict,
    ProbeStart,
    StartKind,
    judge_page,
    record_lag,
    server_now_ms,
)
from ..errors import KinesisError
from ..models import Position
from .reader import IteratorExpired, KinesisReader, arrived_since

log = logging.getLogger("kinesumer.lag")

#: GetRecords pages a probe reads at most per shard.
MAX_PAGES = 5
#: Kinesis records asked per page after a checkpoint: the checkpointed record (the iterator is
#: AT it) and the first after it.
AFTER_CHECKPOINT_LIMIT = 2
#: Records asked on the first page from TRIM_HORIZON: the oldest record.
FIRST_LIMIT = 1
#: Records asked per page while skipping the records that arrived before a LATEST start.
SCAN_LIMIT = 1000


@dataclass(frozen=True)
class ShardProbe:
    """One shard's probe: its lag (ms), how it was found, and the calls it cost.

    ``verdict``: :attr:`~PageVerdict.FOUND` (the age of the oldest unread record),
    :attr:`~PageVerdict.CAUGHT_UP` (nothing unread: 0), or :attr:`~PageVerdict.READ_ON` when
    ``max_pages`` were read without finding either: then the last page's MillisBehindLatest,
    how far behind the tip the probe got (an upper bound of the unread records' age)."""

    millis_behind: int
    verdict: PageVerdict
    get_shard_iterator_calls: int
    get_records_calls: int


async def probe_shard(
    reader: KinesisReader,
    stream: str,
    shard_id: str,
    start: ProbeStart,
    *,
    max_pages: int = MAX_PAGES,
) -> ShardProbe:
    """How far behind its next reader ``stream``/``shard_id`` is (module docstring). Raises
    the reader's named errors (:class:`~kinesumer.errors.StreamNotFoundError`,
    :class:`~kinesumer.errors.AccessDeniedError`, :class:`~kinesumer.errors.CorruptStateError`
    for a checkpoint not in the shard, :class:`~kinesumer.errors.KinesisError`)."""
    if max_pages < 1:
        raise ValueError(f"max_pages must be at least 1, got {max_pages}")
    try:
        return await _probe(reader, stream, shard_id, start, max_pages)
    except IteratorExpired:
        # A fresh iterator expires only in a process stalled for minutes: probe once more.
        log.info("%s/%s: the probe's iterator expired; probing again", stream, shard_id)
    try:
        return await _probe(reader, stream, shard_id, start, max_pages)
    except IteratorExpired as exc:
        raise KinesisError(f"{stream}/{shard_id}: the probe's fresh iterators expired") from exc


async def _probe(
    reader: KinesisReader, stream: str, shard_id: str, start: ProbeStart, max_pages: int
) -> ShardProbe:
    skip: Position | None = None
    since: datetime | None = None
    limit = FIRST_LIMIT
    if start.kind is StartKind.AFTER_CHECKPOINT:
        skip, limit = start.position, AFTER_CHECKPOINT_LIMIT
    elif start.kind is StartKind.SINCE and start.since_ms is not None:
        since = datetime.fromtimestamp(start.since_ms / 1000, timezone.utc)
    answer = await reader.open_shard_iterator(stream, shard_id, skip, "TRIM_HORIZON")
    iterators, pages = 1, 0
    now_ms = _date_ms(answer.served_at)
    iterator: str | None = answer.iterator
    behind: int | None = None
    while iterator is not None and pages < max_pages:
        batch = await reader.get_records(stream, shard_id, iterator, limit, skip)
        pages += 1
        behind = batch.millis_behind
        records = batch.records if since is None else arrived_since(batch.records, since)[0]
        arrival = records[0].approximate_arrival_timestamp if records else None
        verdict = judge_page(
            unread=len(records),
            raw_count=batch.raw_count,
            limit=limit,
            has_next=batch.next_iterator is not None,
            millis_behind_latest=behind,
        )
        if verdict is PageVerdict.FOUND:
            lag = behind or 0
            if arrival is not None:
                lag = record_lag(now_ms, int(arrival.timestamp() * 1000), behind)
            return ShardProbe(lag, verdict, iterators, pages)
        if verdict is PageVerdict.CAUGHT_UP:
            return ShardProbe(0, verdict, iterators, pages)
        iterator = batch.next_iterator
        if since is not None and pages == 1 and behind and batch.raw_count:
            # Records before the LATEST start, and more behind the tip (AWS: kinesalite always
            # says 0): AT_TIMESTAMP goes straight there, and AWS answers it at once.
            answer = await reader.open_shard_iterator(stream, shard_id, None, since)
            iterators += 1
            iterator = answer.iterator
        if since is not None:
            limit = SCAN_LIMIT
    log.info(
        "%s/%s: no unread record within %d pages; its lag is taken as the last page's "
        "MillisBehindLatest (%s)",
        stream,
        shard_id,
        pages,
        behind,
    )
    return ShardProbe(max(behind or 0, 0), PageVerdict.READ_ON, iterators, pages)


def _date_ms(served: datetime | None) -> int | None:
    """Kinesis's now from an answer's ``Date``; None without one (then MillisBehindLatest
    alone measures: this host's clock is not compared with Kinesis's stamps)."""
    return None if served is None else server_now_ms(int(served.timestamp() * 1000))
