"""Records done above a checkpoint: what a handler run finished out of order, stored with the
checkpoint so the next owner of the shard does not handle them again.

With several calls in flight on one shard (``run(ordering="key")``) records finish out of
order, and the checkpoint (the low-water mark) stays below the first one not done. Records done
above it would be delivered again by the next owner. As Confluent's parallel consumer does with
Kafka offsets, the owner stores with the checkpoint the runs of done records above it, and the
next owner skips any record inside a run.

A run ``(first, last)`` says: every record of the shard from ``first`` to ``last`` (positions,
inclusive) is done. The writer knows this because it admitted every record of the shard in
order (a run is a stretch of consecutive admitted records, all done). Runs are stored with the
position they were written with (``base``): a reader honours them only when the checkpoint still
holds exactly that position. Any writer that moves the position without knowing about runs (an
older member, an exactly-once sink, an operator) thereby voids them, and the shard falls back to
plain at-least-once from the checkpoint. Nothing is ever skipped that was not done.

Encoding (the ``done`` binary attribute of the checkpoint item): a version byte, then zlib of
the ASCII text ``base_seq,base_sub;`` followed by ``d1,s1,d2,s2;`` per run, where ``d1`` is the
run's first sequence number minus the previous run's last (the base for the first run) and ``d2``
its last minus its first. Sequence numbers of one shard share their leading digits, so the
deltas are short. The encoding is bounded (:data:`DONE_BUDGET` bytes): beyond it the runs
furthest from the base are left out (those records are delivered again: at-least-once, as
without runs) and the caller counts it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from ..models import Position

#: Most bytes the encoded runs may take in a checkpoint item. A checkpoint item is about 150
#: bytes (one write unit, 1 KB); every KB of runs costs one more write unit per flush, and the
#: item limit is 400 KB. 4 KB holds a few hundred runs after compression: more than
#: ``max_in_flight`` gaps rarely happen.
DONE_BUDGET = 4096

_VERSION = b"\x01"
_SAMPLE = 256

Key = tuple[int, int]
Run = tuple[Key, Key]


def key_of(position: Position) -> Key:
    """A position as something that compares in shard order (sequence numbers are decimal
    strings of different lengths: never compare them as text)."""
    return int(position.sequence_number), position.sub_sequence_number


def position_of(key: Key) -> Position:
    return Position(str(key[0]), key[1])


def runs_of(done: Iterable[tuple[Position, bool]]) -> list[Run]:
    """The runs of consecutive done records in ``done`` (records in shard order, each with its
    done flag)."""
    runs: list[Run] = []
    first: Position | None = None
    last: Position | None = None
    for position, is_done in done:
        if is_done:
            if first is None:
                first = position
            last = position
        elif first is not None and last is not None:
            runs.append((key_of(first), key_of(last)))
            first = last = None
    if first is not None and last is not None:
        runs.append((key_of(first), key_of(last)))
    return runs


def above(runs: Iterable[Run], position: Position | None) -> list[Run]:
    """The runs that end after ``position`` (all of them when None), sorted, overlaps merged.
    A run that starts at or below ``position`` is cut to start at it (the encoding counts from
    the position; every record up to it is done anyway): a new owner's mark can stop inside a
    run it inherited, when only part of that run was fetched yet."""
    floor = key_of(position) if position is not None else None
    kept = sorted(
        run if floor is None or run[0] >= floor else (floor, run[1])
        for run in runs
        if floor is None or run[1] > floor
    )
    merged: list[Run] = []
    for first, last in kept:
        if merged and first <= merged[-1][1]:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
            continue
        merged.append((first, last))
    return merged


def encode(
    base: Position | None, runs: Sequence[Run], budget: int = DONE_BUDGET
) -> tuple[bytes, int]:
    """The ``done`` attribute for ``runs`` above ``base`` (b"" when there are none), and how
    many runs it holds: runs that do not fit in ``budget`` bytes are left out from the end."""
    count = len(runs)
    if count > _SAMPLE:
        # Many runs: judge from the first few how many can fit before compressing them all
        # (each try compresses again; a flush of a badly gapped shard must stay cheap).
        sample = len(_encode(base, runs[:_SAMPLE]))
        count = min(count, max(_SAMPLE * budget // sample, 1) * 17 // 16)
    while count:
        blob = _encode(base, runs[:count])
        if len(blob) <= budget:
            return blob, count
        # Shrink in proportion to the excess, aiming a little below the budget so that a
        # second try nearly always fits (each try compresses again).
        count = min(count - 1, count * budget * 15 // (len(blob) * 16))
    return b"", 0


def _encode(base: Position | None, runs: Sequence[Run]) -> bytes:
    if base is None:
        parts = [",0;"]
        previous = 0
    else:
        parts = [f"{base.sequence_number},{base.sub_sequence_number};"]
        previous = int(base.sequence_number)
    for (first_seq, first_sub), (last_seq, last_sub) in runs:
        parts.append(f"{first_seq - previous},{first_sub},{last_seq - first_seq},{last_sub};")
        previous = last_seq
    return _VERSION + zlib.compress("".join(parts).encode("ascii"), 6)


def decode(blob: bytes) -> tuple[Position | None, list[Run]]:
    """(base, runs) of a ``done`` attribute. ValueError when it is not one (a newer version's
    encoding, or corruption): the caller then ignores it (at-least-once from the checkpoint)."""
    if not blob.startswith(_VERSION):
        raise ValueError(f"unknown done-runs encoding {blob[:1]!r}")
    try:
        text = zlib.decompress(blob[1:], bufsize=4 * DONE_BUDGET).decode("ascii")
    except (zlib.error, UnicodeDecodeError) as exc:
        raise ValueError(f"done runs do not decompress: {exc}") from exc
    head, _, body = text.partition(";")
    base_seq, _, base_sub = head.partition(",")
    base = Position(base_seq, int(base_sub)) if base_seq else None
    previous = int(base_seq) if base_seq else 0
    runs: list[Run] = []
    for part in body.split(";"):
        if not part:
            continue
        gap, first_sub, length, last_sub = (int(n) for n in part.split(","))
        if gap < 0 or length < 0:
            raise ValueError("done runs out of order")
        first = (previous + gap, first_sub)
        last = (first[0] + length, last_sub)
        if last < first or (runs and first <= runs[-1][1]):
            raise ValueError("done runs out of order")
        runs.append((first, last))
        previous = last[0]
    return base, runs


class DoneRuns:
    """The runs a new owner inherited, checked record by record in shard order.

    :meth:`contains` is called with the shard's records in increasing order: it walks the runs
    once, and says :attr:`exhausted` once a record passed the last run (no more checks needed).
    """

    __slots__ = ("_index", "runs")

    def __init__(self, runs: Sequence[Run]) -> None:
        self.runs = tuple(runs)
        self._index = 0

    @property
    def exhausted(self) -> bool:
        return self._index >= len(self.runs)

    def contains(self, position: Position) -> bool:
        """Whether the record at ``position`` is inside a run (it was done: skip it)."""
        key = key_of(position)
        runs = self.runs
        index = self._index
        while index < len(runs) and runs[index][1] < key:
            index += 1
        self._index = index
        return index < len(runs) and runs[index][0] <= key
