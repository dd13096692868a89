"""Choosing what goes into the next PutRecords call: per shard lane, within Kinesis' limits and
each shard's pace, and, with ``ordering="key"``, never in a way that could land a partition key's
records out of ``put`` order. Pure: no I/O, time comes in as an argument.

**Why per-key order survives partial failures** (``ordering="key"``). A PutRecords call may
accept some entries and refuse others. The usual retry loop breaks order when a key has two
entries in one call (or in two concurrent calls), the first refused and the second accepted.
The rule here: *a key has at most one entry in flight, producer-wide*. :func:`fill_call` takes a
record only when its key is not ``busy`` (no entry of that key is in any call in flight, nor
already in the call being filled) and no earlier record of the key was passed over in this scan
(``passed``); the caller marks the call's keys busy until the call's answer is handled, and puts
a refused entry's records back at the *front* of their lane. Then, by induction over the records
of one key k in put order r1, r2, ...:

1. a lane holds k's unwritten records in put order (they are appended in put order; a record is
   only taken when it is the first unwritten record of k, because every earlier one is either
   written, failed for good, or still in the lane ahead of it and therefore taken first or
   ``passed``; a refused record returns to the front, ahead of every later record of k, which
   were all put after it and are all still queued, since k was busy);
2. r(i+1) is sent only after the call carrying ri was answered: ri's entry was accepted (so
   Kinesis gave ri a sequence number before r(i+1) was even sent, and sequence numbers grow per
   shard), or ri failed for good (its future holds the error: it is not written at all).

Hence k's written records carry increasing sequence numbers in put order on their shard. Across
a reshard, ri lands on the parent before r(i+1) is sent to a child, and readers (kinesumer among
them) finish a parent before its children; k never lands on two siblings, which readers read
side by side (an aggregate's keys stay where it landed: ``StreamWriter._pin``). With
``aggregate=True`` the unit is a KPL aggregate: several records of k may share one entry (one
entry is written or refused as a whole, in order inside), and the rule holds per entry. The
price: without aggregation a single hot key writes one record per round trip;
``aggregate=True`` lifts that (many records of the key per entry); ``ordering="none"`` drops
the rule.

**Large records** (over 1 MiB, up to a stream's raised maximum record size): one goes alone in
its call (AWS takes at most 10 MiB a call; the 5 MiB of ordinary calls would not hold it) and
never into a KPL aggregate. It waits until its shard's pace is full, first in a call, then goes
as a burst, as Kinesis takes it: the pacer's bytes go into debt by its size, and its shard's
later records wait until the shard is back under its pace. It is taken by the same rule as
any other record, so key order holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..kinesis.kpl_aggregate import Aggregate
from ..kinesis.lean import PutEntry
from .options import ProducerOptions
from .records import MAX_CALL_BYTES, MAX_CALL_RECORDS, MAX_RECORD_BYTES, PendingRecord
from .shards import ShardPacer

#: A lane is scanned this far per call, and no further than this many records past the last
#: one taken: a deep backlog of busy keys does not cost a scan of the whole buffer each call
#: (a record further back only waits for a later call; nothing is reordered).
SCAN_LIMIT = 4096
SKIP_LIMIT = 256


class Lane:
    """Unwritten records bound for one shard, in put order (refused ones back at the front)."""

    __slots__ = ("pacer", "queue", "shard_id")

    def __init__(self, shard_id: str, pacer: ShardPacer) -> None:
        self.shard_id = shard_id
        self.pacer = pacer
        self.queue: deque[PendingRecord] = deque()


class Entry:
    """One PutRecords entry: a record, or an aggregate of records of one lane."""

    __slots__ = (
        "data",
        "explicit_hash_key",
        "partition_key",
        "records",
        "shard_id",
        "size",
    )

    def __init__(
        self,
        records: list[PendingRecord],
        shard_id: str,
        aggregate: bool,
        packed: Aggregate | None = None,
    ) -> None:
        """``packed``: ``records`` already packed (as :func:`_scan` does while it sizes them)."""
        self.records = records
        self.shard_id = shard_id
        first = records[0]
        self.partition_key = first.key
        if aggregate and len(records) > 1:
            if packed is None:
                packed = Aggregate()
                for record in records:
                    packed.add(record.data, record.key, record.explicit_hash_key)
            self.data = packed.encode()
            # The aggregate goes where its first record would go: all of them, to its lane's
            # shard (a record pinned where its key landed carries that hash key).
            self.explicit_hash_key: str | None = first.explicit_hash_key or str(first.hash_key)
        else:
            self.data = first.data
            self.explicit_hash_key = first.explicit_hash_key
        self.size = len(self.data) + len(self.partition_key.encode("utf-8"))

    def wire(self) -> PutEntry:
        """The entry as it goes in a lean PutRecords body (:mod:`kinesumer.kinesis.lean`)."""
        return PutEntry(self.data, self.partition_key, self.explicit_hash_key)


def fill_call(
    lanes: Iterable[Lane],
    now: float,
    *,
    by_key: bool,
    busy: set[str],
    aggregate: bool,
    min_batch: float = 1.0,
) -> tuple[list[Entry], float]:
    """The entries of the next call, taken out of their lanes, and (when none could go) the
    seconds until one might (pacing or backoff; a busy key waits for a call's answer instead).

    ``busy`` gains the keys of the entries taken (``by_key`` only).
    """
    entries: list[Entry] = []
    call_bytes = 0
    wake = float("inf")
    for lane in lanes:
        if len(entries) >= MAX_CALL_RECORDS or call_bytes >= MAX_CALL_BYTES:
            break
        room_records, room_bytes = lane.pacer.room(now)
        # A large record may go only first in a call, with its shard's pace full (a burst).
        large_ok = not entries and lane.pacer.full()
        byte_budget = min(room_bytes, MAX_CALL_BYTES - call_bytes)
        if aggregate:
            record_budget = 1.0 if room_records >= 1 else 0.0
            byte_budget = min(byte_budget, MAX_RECORD_BYTES)
        else:
            record_budget = min(room_records, MAX_CALL_RECORDS - len(entries))
        # A paced lane with a backlog waits for a batch's worth of room (at most
        # ``min_batch``): a trickle of tiny calls costs a call's CPU for a few records each.
        need = 1.0 if aggregate else max(1.0, min(float(len(lane.queue)), min_batch))
        if record_budget < need:
            if lane.queue:
                wake = min(wake, lane.pacer.wait(int(need), 0, now))
            continue
        taken, passed_wake, starved, packed = _scan(
            lane, now, by_key, busy, aggregate, byte_budget, int(record_budget), large_ok
        )
        wake = min(wake, passed_wake)
        if starved is not None:
            wake = min(wake, lane.pacer.wait(1, starved, now))
        if not taken:
            continue
        if aggregate:
            lane_entries = [Entry(taken, lane.shard_id, True, packed)]
        else:
            lane_entries = [Entry([record], lane.shard_id, False) for record in taken]
        spent = sum(entry.size for entry in lane_entries)
        lane.pacer.take(len(lane_entries), spent)
        call_bytes += spent
        entries.extend(lane_entries)
        if by_key:
            busy.update(record.key for record in taken)
        if taken[0].size > MAX_RECORD_BYTES:
            break  # a large record goes alone
    return entries, (0.0 if entries else wake)


def hold_back(
    entries: list[Entry], lanes: dict[str, Lane], busy: set[str], options: ProducerOptions
) -> bool:
    """Undo :func:`fill_call` for a call too small to go while another is in flight (see
    ``ProducerOptions.min_call_entries``): its records back at the front of their lanes in the
    order they were taken, their pace given back, their keys no longer busy. True: held back.

    Per-key order holds: each record taken was the first unwritten record of its key in its
    lane (the rule above), so at the front it is still ahead of every later record of its key.
    """
    if not entries or len(entries) >= options.min_call_entries:
        return False
    if entries[0].size > MAX_RECORD_BYTES:
        return False  # a large record's call is alone by design: it never grows
    for entry in reversed(entries):
        lane = lanes[entry.shard_id]
        lane.pacer.take(-1, -entry.size)
        lane.queue.extendleft(reversed(entry.records))
        busy.difference_update(record.key for record in entry.records)
    return True


def _scan(
    lane: Lane,
    now: float,
    by_key: bool,
    busy: set[str],
    aggregate: bool,
    byte_budget: float,
    record_budget: int,
    large_ok: bool = False,
) -> tuple[list[PendingRecord], float, int | None, Aggregate | None]:
    """Take records from the front part of one lane; see the module docstring for the rule.
    Returns them, the seconds until a backed-off record may go, the size of the record the
    pace (or the call) had no room for, if any, and (``aggregate``) the records packed.
    ``large_ok``: a large record met before any other is taken, alone (``packed`` None)."""
    taken: list[PendingRecord] = []
    keep: list[PendingRecord] = []
    passed: set[str] = set()
    packed = Aggregate() if aggregate else None
    wake = float("inf")
    starved: int | None = None
    queue = lane.queue
    large = MAX_RECORD_BYTES
    scanned = 0
    skipped = 0
    for record in queue:
        if scanned >= SCAN_LIMIT or skipped >= SKIP_LIMIT:
            break
        scanned += 1
        skipped += 1
        if record.not_before > now:
            wake = min(wake, record.not_before - now)
            if by_key:
                passed.add(record.key)
            keep.append(record)
            continue
        if by_key and (record.key in busy or record.key in passed):
            keep.append(record)
            continue
        if packed is not None:
            packed_size = packed.size_with(record.data, record.key, record.explicit_hash_key)
            size = packed_size + len((packed.first_key or record.key).encode("utf-8"))
            if size > byte_budget:  # at most 1 MiB here: a large record always lands here
                if record.size > large and large_ok and not taken:
                    taken.append(record)  # alone, and plain
                    packed = None
                    break
                starved = size
                scanned -= 1
                break
            packed.add(record.data, record.key, record.explicit_hash_key, packed_size)
        else:
            size = record.size
            if size > byte_budget or len(taken) >= record_budget or size > large:
                if size > large and large_ok and not taken:
                    taken.append(record)  # alone
                    break
                # A large record waits for a call of its own, and a full pace.
                starved = size if size > byte_budget or size > large else None
                scanned -= 1
                break
            byte_budget -= size
            if by_key:
                passed.add(record.key)  # one entry per key per call
        taken.append(record)
        skipped = 0
    if taken:
        for _ in range(scanned):
            queue.popleft()
        queue.extendleft(reversed(keep))
    return taken, wake, starved, packed
