"""The Kinesis reads an operator's rewind makes (:func:`kinesumer.admin.rewind_group`): Kinesis's
clock, whether a closed shard holds a record at or after an instant, and the last record of an
open shard. Read-only; each read counts against the 5 GetRecords a second per shard that every
reader of the stream shares (a rewind is rare: a few calls per shard, once).

Reads from an instant go through :meth:`KinesisReader.iterator_since`, as the members' own
reopenings do: on kinesalite, whose ``AT_TIMESTAMP`` never answers on a shard without a record
after the instant, it scans from the oldest record and skips the earlier ones instead.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ..models import Position
from .reader import IteratorExpired, KinesisReader, arrived_since

#: GetRecords pages a probe reads before it gives up and answers "not known".
MAX_PAGES = 50

#: Records asked for per page (GetRecords' maximum).
PAGE_LIMIT = 10_000


async def kinesis_now_ms(reader: KinesisReader, stream: str, shard_id: str) -> tuple[int, bool]:
    """Kinesis's clock (epoch ms), from the ``Date`` of a GetShardIterator answer (whole
    seconds: the true instant is up to a second later); and whether it really is Kinesis's
    (False: the endpoint sent no ``Date``, and this host's clock stands in)."""
    answer = await reader.open_shard_iterator(stream, shard_id, None, "LATEST")
    if answer.served_at is None:
        return int(time.time() * 1000), False
    return int(answer.served_at.timestamp() * 1000), True


async def has_record_since(
    reader: KinesisReader, stream: str, shard_id: str, since_ms: int, max_pages: int = MAX_PAGES
) -> bool | None:
    """Whether a closed shard holds a record that arrived at or after ``since_ms`` (what a
    member resuming there would read). None: not decided within ``max_pages`` pages (or the
    iterator expired): the caller then lets the shard be read from the instant, and its reader
    finds the end itself."""
    iterator, skip_before = await reader.iterator_since(stream, shard_id, since_ms)
    for _ in range(max_pages):
        try:
            batch = await reader.get_records(stream, shard_id, iterator, PAGE_LIMIT, None)
        except IteratorExpired:
            return None
        records = batch.records
        if skip_before is not None and records:
            records, _ = arrived_since(records, skip_before)
        if records:
            return True
        if batch.next_iterator is None:
            return False
        iterator = batch.next_iterator
    return None


async def last_record(
    reader: KinesisReader, stream: str, shard_id: str, max_pages: int = MAX_PAGES
) -> tuple[Position | None, int]:
    """An open shard's last record now, and the instant (epoch ms, Kinesis's clock less the
    reader's margin: see :meth:`KinesisReader.open_latest`) the search began from.

    The search reads from that instant to the tip (an empty page not behind it). The position
    is None when no record arrived since the instant (resuming at the instant then reads only
    records put after the command), or when the tip was not reached within ``max_pages`` (the
    caller resumes at the instant: the records since it are delivered again, none skipped)."""
    _, since_ms = await reader.open_latest(stream, shard_id)
    iterator, skip_before = await reader.iterator_since(stream, shard_id, since_ms)
    last: Position | None = None
    for _ in range(max_pages):
        try:
            batch = await reader.get_records(stream, shard_id, iterator, PAGE_LIMIT, None)
        except IteratorExpired:
            return None, since_ms
        records = batch.records
        if skip_before is not None and records:
            records, reached = arrived_since(records, skip_before)
            if reached:
                skip_before = None
        if records:
            tail = records[-1]
            last = Position(tail.sequence_number, tail.sub_sequence_number)
        at_tip = not batch.raw_count and not batch.millis_behind
        if at_tip or batch.next_iterator is None:
            return last, since_ms
        iterator = batch.next_iterator
    return None, since_ms


def instant_of(when: datetime) -> int:
    """``when`` as epoch milliseconds (a naive time is UTC, as on the command line)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)
