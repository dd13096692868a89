"""Read-ahead: an executor reads a backlogged shard's next batch while Spark finishes this one.

A source batch reads, then Spark runs the batch, commits, and plans the next: nothing overlaps,
and the reads wait on Kinesis while the rest of the trigger waits on the reads. So when a task
took a full batch from a shard (more records are behind it), its worker goes on reading the
next batch's records in the background, from right after the end the ledger just recorded, and
leaves them in a file on this host. The next batch's task for that shard, in whichever Python
worker of this host Spark gives it to, takes the file instead of reading: the same records a
read from that start would have given first (a shard's records never change), so the batch it
forms is one a read could have formed, and the ledger still decides every batch as before.

Files, not memory: Spark hands a shard's tasks to any of the host's Python workers, so what one
worker read ahead must be found by the others. ``<name>.pending`` (created exclusively) says a
worker is reading ahead; ``<name>.data`` holds the result, written whole then renamed; a task
takes it by renaming it to a name of its own, so one task at most uses it. Records are stored
as the Arrow the task hands Spark (:mod:`.readahead_format`), in a directory only this user can
open.

The read-ahead goes on from batch to batch while records are behind, up to :data:`DEPTH`
batches ahead of the tasks, so reading runs on while Spark plans, commits and runs batches, as
a Kinesumer member's fetchers run on while the application handles what they fetched.

Misses cost reads: on a cluster the next task of a shard may run on another host, and what
this host read ahead is read again there. A task that finds this host's read-ahead of an
earlier start still untaken stops this host reading that shard ahead for :data:`COLD_SECONDS`,
so a shard hopping between hosts costs at most :data:`DEPTH` extra batches per host per
period; unless this host's own last batch of the shard ran through that start (its limit
changed: the batches end elsewhere now), which each task notes in ``<name>.ended``.
Option ``read_ahead=false`` turns it off (see docs/spark/source.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ....models import Position, Record
from ...arrow import table_to_records
from .readahead_format import LAYOUT, Header, UnreadableReadAhead, decode, write

#: How long a claim whose pid is not written yet counts as alive.
UNWRITTEN_CLAIM_SECONDS = 5.0
#: The age of a file that is not there: older than any bound the read-ahead uses.
NEVER_SECONDS = 10 * 24 * 3600.0

if TYPE_CHECKING:
    import pyarrow

log = logging.getLogger("kinesumer.spark.source")

#: A host that found its read-ahead of a shard untaken stops reading that shard ahead this long.
COLD_SECONDS = 600.0
#: Files older than this are removed when a worker reads ahead, and never taken (a stopped
#: query's leftovers).
STALE_SECONDS = 600.0
#: Batches a host reads ahead of a shard's tasks at most.
DEPTH = 2
#: How often a task looks again for the file of a read-ahead of its start under way, and how
#: often it also checks that the worker reading ahead still lives. A task waits for nearly every
#: read-ahead while reading is what holds a backlog back (0.1-0.45 s per batch, measured), and
#: looking every 5 ms, the worker checked each time, cost 0.02 CPU-s per second of waiting:
#: about 0.04 CPU-s per 100k records. The file alone every 10 ms costs a seventh of that; a
#: killed worker's claim is still seen within 0.1 s.
WAIT_STEP = 0.01
ALIVE_STEP = 0.1

#: How long a read-ahead's last iterator is used by the next read ahead of the shard (Kinesis
#: lets an iterator be used for 5 minutes; an expired one is replaced where it fails).
ITERATOR_SECONDS = 240.0

#: How often (at most) one process sweeps a root's stale files: a sweep stats every file of
#: every query's folder, and a worker reading ahead begins once per batch and shard.
SWEEP_EVERY = 60.0

#: Roots this process warned of (not private: read-ahead off).
_WARNED: set[Path] = set()
#: When this process last swept each root (monotonic seconds).
_SWEPT: dict[Path, float] = {}


@dataclass(frozen=True)
class ReadAheadBatch:
    """What a worker read ahead from right after ``after``: the first ``rows.num_rows`` records
    there, as Arrow in Spark's schema, and how that read ended (as ``ShardRangeReader.read_new``
    reports it)."""

    after: Position
    rows: pyarrow.Table
    caught_up: bool
    shard_end: bool
    millis_behind: int | None

    @property
    def records(self) -> list[Record]:
        """The rows as records (tests and diagnostics)."""
        return table_to_records(self.rows)


async def _wait_for(data: str, pending: Path, deadline: float) -> None:
    """Until ``data`` exists, the claim ``pending`` is gone or its worker dead, or ``deadline``
    (monotonic). Another process's file: no event to wait on across processes, so it looks."""
    alive_at = 0.0
    # A stat of a local file (microseconds): no thread hop, like the rest of :meth:`take`.
    while not os.path.exists(data):  # noqa: ASYNC240
        now = time.monotonic()
        if now >= deadline:
            return
        if now >= alive_at:
            if not claim_alive(pending):
                return
            alive_at = now + ALIVE_STEP
        await asyncio.sleep(WAIT_STEP)


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / f"kinesumer-read-ahead-{os.getuid()}"


class ReadAheadFiles:
    """This host's read-ahead files of one query (``query``) under ``root``."""

    def __init__(self, root: Path, app: str, query: str) -> None:
        self._root = root
        self._dir = root / digest(app, query)

    def _ready(self) -> bool:
        """Make the query's directory (the root too: a task marks its start even before any
        read-ahead was made here); False if the root is not this user's alone."""
        self._root.mkdir(exist_ok=True, mode=0o700)
        if not self._private():
            return False
        self._dir.mkdir(exist_ok=True, mode=0o700)
        return True

    def _private(self) -> bool:
        """Whether the root is this user's alone: files another user could write there would
        be taken for records. Anything else turns read-ahead off (logged)."""
        try:
            info = self._root.lstat()  # not followed: a link another user made is not ours
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            if self._root not in _WARNED:  # once per worker, not at every task of every shard
                _WARNED.add(self._root)
                log.warning("read-ahead off: %s is not this user's alone", self._root)
            return False
        return True

    def _shard_prefix(self, stream: str, shard_id: str) -> str:
        return digest(stream, shard_id)

    def _name(self, stream: str, shard_id: str, after: Position) -> Path:
        tail = f"{after.sequence_number}-{after.sub_sequence_number}"
        return self._dir / f"{self._shard_prefix(stream, shard_id)}-{tail}"

    # -- the task that needs a batch ------------------------------------------------------------
    async def take(
        self, stream: str, shard_id: str, after: Position, wait: float, run: str = ""
    ) -> ReadAheadBatch | None:
        """The read-ahead of ``stream/shard_id`` from right after ``after``, if this host has
        one read ahead in this run of the query (``run``, the driver's token for the run),
        waiting up to ``wait`` seconds for one under way; None otherwise."""
        if not self._ready():
            return None
        name = self._name(stream, shard_id, after)
        data, pending = name.with_suffix(".data"), name.with_suffix(".pending")
        self._started(stream, shard_id, after)
        await _wait_for(str(data), pending, time.monotonic() + wait)
        self._drop_passed(stream, shard_id, after)
        claimed = name.with_suffix(f".taken-{os.getpid()}")
        try:
            os.rename(data, claimed)
        except FileNotFoundError:
            return None  # none, or another attempt of this batch took it first
        try:
            if time.time() - claimed.stat().st_mtime > STALE_SECONDS:
                return None  # this host's own clock on both sides
            stored, rows = decode(claimed.read_bytes())
        except (OSError, UnreadableReadAhead) as error:
            # Another kinesumer version's layout (a query restarted with the same id finds the
            # files of its previous run), or a damaged file: the task reads for itself.
            log.warning("read-ahead %s unreadable, reading instead: %r", name.name, error)
            return None
        finally:
            claimed.unlink(missing_ok=True)
        if (stored.stream, stored.shard_id, tuple(stored.after)) != (
            stream,
            shard_id,
            (after.sequence_number, after.sub_sequence_number),
        ):
            return None  # not ours (a digest collision): read as if there were none
        if stored.run != run:
            # A previous run's, found by a restart (same query id): its records are still the
            # shard's, but its "caught up" is that of then, and a batch of caught-up shards
            # ends an availableNow run before what arrived since. Compared by the driver's
            # token, not by time: the driver's clock and this host's need not agree.
            return None
        return ReadAheadBatch(
            after=after,
            rows=rows,
            caught_up=stored.caught_up,
            shard_end=stored.shard_end,
            millis_behind=stored.millis_behind,
        )

    # -- the worker that reads ahead -------------------------------------------------------------
    def begin(self, stream: str, shard_id: str, after: Position) -> bool:
        """Claim the read-ahead of ``stream/shard_id`` from ``after`` for this worker: False if
        the shard is cold on this host or another worker claimed it first."""
        if not self._ready():
            return False
        prefix = self._shard_prefix(stream, shard_id)
        name = self._name(stream, shard_id, after)
        if age(self._dir / f"{prefix}.cold") < COLD_SECONDS:
            return False
        self._sweep_stale()
        ahead = [f for f in self._dir.iterdir() if f.name.startswith(prefix + "-")]
        # A killed worker's claim stays (until swept): it reads nothing ahead, so not counted.
        if (
            sum(f.suffix == ".data" or (f.suffix == ".pending" and claim_alive(f)) for f in ahead)
            >= DEPTH
        ):
            return False  # far enough ahead: the next tasks have not caught up yet
        pending = name.with_suffix(".pending")
        try:
            fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        # Checked after the claim, as :meth:`take` marks its start before it looks for one:
        # either the task sees this claim and waits for it, or this sees the task's mark.
        here = (int(after.sequence_number), after.sub_sequence_number)
        for path in self._dir.glob(f"{prefix}-*.start"):
            position = position_of(path.name, prefix)
            if position is not None and position >= here:
                pending.unlink(missing_ok=True)
                return False  # a task already started there: too late to read it ahead
        if name.with_suffix(".data").exists():
            # Read ahead already: the chain began it, then the task that took the batch before
            # it asked for it again.
            pending.unlink(missing_ok=True)
            return False
        return True

    def _started(self, stream: str, shard_id: str, after: Position) -> None:
        """Mark that a task of this host starts the shard at ``after`` (and forget its earlier
        marks): a read-ahead from there or before would come too late."""
        prefix = self._shard_prefix(stream, shard_id)
        here = (int(after.sequence_number), after.sub_sequence_number)
        self._name(stream, shard_id, after).with_suffix(".start").touch()
        for path in self._dir.glob(f"{prefix}-*"):
            position = position_of(path.name, prefix)
            ours = path.suffix in (".start", ".ended")
            if ours and position is not None and position < here:
                path.unlink(missing_ok=True)

    def ended(self, stream: str, shard_id: str, start: Position, end: Position) -> None:
        """Note that a task of this host read the shard from ``start`` through ``end``: the next
        task, from ``end``, tells by it a read-ahead this host's batch ran through (its limit
        changed) from one whose batch ran on another host. Never raises (a note, no more)."""
        with contextlib.suppress(OSError):
            if self._ready():
                path = self._name(stream, shard_id, end).with_suffix(".ended")
                path.write_text(f"{start.sequence_number}-{start.sub_sequence_number}")

    def finish(
        self,
        stream: str,
        shard_id: str,
        batch: ReadAheadBatch,
        run: str = "",
        next_after: Position | None = None,
        next_iterator: str | None = None,
    ) -> None:
        """Leave ``batch``, read ahead in run ``run`` of the query, for the next task, and drop
        the claim :meth:`begin` made. ``next_after``: where the read-ahead goes on from (records
        are behind ``batch``), and ``next_iterator`` an iterator right there if the read had
        one, for :meth:`read_past`."""
        name = self._name(stream, shard_id, batch.after)
        header = Header(
            layout=LAYOUT,
            stream=stream,
            shard_id=shard_id,
            after=(batch.after.sequence_number, batch.after.sub_sequence_number),
            caught_up=batch.caught_up,
            shard_end=batch.shard_end,
            millis_behind=batch.millis_behind,
            run=run,
        )
        partial = name.with_suffix(f".partial-{os.getpid()}")
        # ``.next`` whole or not at all: a killed worker must not leave half an iterator.
        partial_next = name.with_suffix(f".next-{os.getpid()}")
        try:
            if next_after is not None:  # before the data: whoever sees the data sees this
                tail = f"{next_after.sequence_number} {next_after.sub_sequence_number}"
                if next_iterator is not None:
                    tail += f" {next_iterator}"
                # The run on a line of its own: a restarted query (same id, same folder) must
                # not go on from where its previous run's reads ahead were.
                partial_next.write_text(f"{run}\n{tail}")
                os.replace(partial_next, name.with_suffix(".next"))
            write(partial, header, batch.rows)
            os.rename(partial, name.with_suffix(".data"))
        finally:
            partial.unlink(missing_ok=True)
            partial_next.unlink(missing_ok=True)
            name.with_suffix(".pending").unlink(missing_ok=True)

    def read_past(
        self, stream: str, shard_id: str, after: Position, run: str = ""
    ) -> tuple[Position, str | None] | None:
        """Where the read-ahead made from ``after`` in run ``run`` of the query goes on from, if
        it was made with records behind it: a worker that finds that start read ahead already
        goes on past it, so the read-ahead stays :data:`DEPTH` batches ahead instead of
        stopping there. With it, the iterator the read ended with, if it had one and is young
        enough to use (else None: the next read asks GetShardIterator). None for another run's
        (or another version's) file, as :meth:`take` treats its batches."""
        path = self._name(stream, shard_id, after).with_suffix(".next")
        try:
            written_run, line = path.read_text().split("\n", 1)
            sequence, sub, *rest = line.split()
            past = Position(sequence, int(sub))
        except (OSError, ValueError):
            return None
        if written_run != run:
            return None
        iterator = rest[0] if len(rest) == 1 and age(path) < ITERATOR_SECONDS else None
        return past, iterator

    def abandon(self, stream: str, shard_id: str, after: Position) -> None:
        """The read-ahead :meth:`begin` claimed failed: drop the claim, leave nothing. Never
        raises: it runs in the background task's error paths, where an exception would end the
        task with nobody to retrieve it (asyncio logs "Task exception was never retrieved")."""
        with contextlib.suppress(OSError):  # the folder broke: nothing left to drop here
            self._name(stream, shard_id, after).with_suffix(".pending").unlink(missing_ok=True)

    def _drop_passed(self, stream: str, shard_id: str, after: Position) -> None:
        """Remove this shard's read-ahead from before ``after``, never taken: its batch ran on
        another host (or its start moved). A miss costs reads: the shard goes cold here. Not
        when this host's batch that ended at ``after`` began before it: that batch ran through
        it (its limit changed since it was read ahead), no other host is reading the shard."""
        prefix = self._shard_prefix(stream, shard_id)
        here = (int(after.sequence_number), after.sub_sequence_number)
        ended = self._name(stream, shard_id, after).with_suffix(".ended")
        began = position_of(f"{prefix}-{text_of(ended)}", prefix)
        ended.unlink(missing_ok=True)
        try:
            files = list(self._dir.iterdir())
        except FileNotFoundError:
            return
        for path in files:
            position = position_of(path.name, prefix)
            if position is None or position >= here:
                continue
            if path.suffix == ".pending" and not claim_alive(path):
                # A killed worker's claim (a worker not reused by Spark leaves one per batch):
                # gone now, not left to the sweep, or the folder fills with them.
                path.unlink(missing_ok=True)
            elif path.suffix == ".next":
                path.unlink(missing_ok=True)
            elif path.suffix == ".data":
                path.unlink(missing_ok=True)
                if began is not None and began < position:
                    continue  # run through here: not a miss
                log.info("read-ahead %s was never taken: not reading this shard ahead", path.name)
                (self._dir / f"{prefix}.cold").touch()

    def _sweep_stale(self) -> None:
        """Remove files older than :data:`STALE_SECONDS` in the folders of all this user's
        queries on this host (a killed worker's claim, a stopped query's read-ahead), and the
        folders of stopped queries once empty. A query stopped for good never comes back to
        remove its own: up to :data:`DEPTH` batches per shard would stay in /tmp. At most once
        per :data:`SWEEP_EVERY` in a process: files are stale after minutes, not seconds."""
        last = _SWEPT.get(self._root)
        if last is not None and time.monotonic() - last < SWEEP_EVERY:
            return
        _SWEPT[self._root] = time.monotonic()
        now = time.time()
        for folder in self._root.iterdir():
            idle = now - mtime(folder, now) > STALE_SECONDS  # before removals touch it
            try:
                files = list(folder.iterdir())
            except (NotADirectoryError, FileNotFoundError):
                continue
            for path in files:
                if now - mtime(path, now) > STALE_SECONDS:
                    path.unlink(missing_ok=True)
            if idle and folder != self._dir:
                with contextlib.suppress(OSError):  # not empty: a file came meanwhile
                    folder.rmdir()


# -- the read-ahead files' names and states (this host's clock against this host's files) --


def position_of(name: str, prefix: str) -> tuple[int, int] | None:
    """The start position in a file name ``<prefix>-<sequence>-<sub>.<kind>``, if it is one of
    the shard's."""
    if not name.startswith(prefix + "-"):
        return None
    parts = name[len(prefix) + 1 :].split(".", 1)[0].split("-")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def text_of(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def claim_alive(pending: Path) -> bool:
    """Whether a read-ahead claimed by ``pending`` may still come: its file is there and its
    worker lives (a worker killed while reading ahead leaves the file behind)."""
    try:
        pid = int(pending.read_text() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        # Made but its pid not written yet, or never (a worker killed between the two): alive
        # for a moment only. ``os.kill(0, 0)`` would signal this process's group and succeed.
        return age(pending) < UNWRITTEN_CLAIM_SECONDS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def age(path: Path) -> float:
    """Seconds since ``path`` was last written, on this host's clock (very old if it is gone)."""
    now = time.time()
    return now - mtime(path, now - NEVER_SECONDS)


def mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default
