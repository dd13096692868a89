"""Writing one stream: its shard map, a lane per shard, and the task that turns lanes into
PutRecords calls (at most ``max_in_flight`` at once) and handles each answer entry by entry.

Who calls what: the core calls :meth:`StreamWriter.add` per record (on the loop) and reads
:attr:`StreamWriter.failure` after :meth:`StreamWriter.run`; each record's outcome goes to the
core through :class:`Outcomes`, once. What a call holds, and why key order holds: :mod:`.batching`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Sequence
from operator import attrgetter
from typing import NamedTuple, Protocol

from botocore.exceptions import ClientError

from ..aws.accounting import RequestStats
from ..aws.retry import call_with_retry, error_code, is_denied, is_transient
from ..errors import (
    AccessDeniedError,
    DeliveryTimeoutError,
    RecordRejectedError,
    StreamNotFoundError,
    TransientAWSError,
)
from ..kinesis.transport import KinesisTransport, PutResultEntry, ShardDescription
from ..runtime.aio_timeout import await_within
from .batching import Entry, Lane, fill_call, hold_back
from .options import ProducerOptions
from .records import MAX_CALL_BYTES, MAX_CALL_RECORDS, PendingRecord, PutResult, key_hash
from .shards import ShardMap, ShardPacer

log = logging.getLogger("kinesumer.producer")

#: Entry error codes worth sending again; any other refusal is for good.
RETRYABLE_ENTRY_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "InternalFailure",
        "ServiceUnavailable",
        "KMSThrottlingException",
    }
)
_EXPIRY_CHECK = 0.2
#: Seconds before the shards are listed again after a listing failed past its retries, doubled
#: per failure in a row up to the maximum (the writer keeps writing meanwhile: see _pin).
LIST_AGAIN_AFTER = 0.5
LIST_AGAIN_MAX = 5.0


class _Pin(NamedTuple):
    """Where a key's records went when they left the map's routing (``ordering="key"`` with
    ``aggregate=True``): the shard they landed on, a hash key that landed there (as sent), and
    the key's own hash key (its records' ``hash_key``, which routing never changes)."""

    shard_id: str
    hash_key: int
    text: str
    own: int


class Outcomes(Protocol):
    """What the core does with a record's outcome (resolves its future, counts it)."""

    flushing: bool

    def succeeded(self, written: list[tuple[PendingRecord, PutResult]]) -> None: ...

    def failed(self, record: PendingRecord, error: BaseException) -> None: ...

    def retried(self, stream: str, entries: int, throttled: int) -> None: ...

    def called(self, stream: str, seconds: float, error: str | None) -> None: ...


class StreamWriter:
    def __init__(
        self, stream: str, kinesis: KinesisTransport, options: ProducerOptions, outcomes: Outcomes
    ) -> None:
        self.stream = stream
        self._kinesis = kinesis
        self._options = options
        self._outcomes = outcomes
        self._lanes: dict[str, Lane] = {}
        self._map: ShardMap | None = None
        self._unrouted: list[PendingRecord] = []
        self._busy: set[str] = set()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._stale = False
        # Answers that named a shard the map does not route to (a reshard since the listing).
        self._stale_answers = 0
        self._listing: asyncio.Task[None] | None = None
        self._list_failures = 0
        self._list_after = 0.0
        # Keys whose records landed off the map's routing, and where (see _pin).
        self._pinned: dict[str, _Pin] = {}
        self._rotation = 0
        self._last_expiry = 0.0
        self.pending = 0
        self.pending_bytes = 0
        self.wake = asyncio.Event()
        self.closing = False
        #: Why the writer stopped for good (the stream is missing, access denied), else None.
        self.failure: BaseException | None = None

    # -- called by the core --

    def add(self, record: PendingRecord) -> None:
        if self._map is None:
            self._unrouted.append(record)
        else:
            self._lane_for(record).queue.append(record)
        self.pending += 1
        self.pending_bytes += record.size
        if self.pending == 1 or self.pending % MAX_CALL_RECORDS == 0:
            self.wake.set()

    async def run(self) -> None:
        """Write until closed with nothing left; fails every record it holds if the stream
        cannot be written at all."""
        try:
            self._apply_map(await self._list_shards())
            while not (self.closing and self.pending == 0 and not self._in_flight):
                await self._step()
        except (StreamNotFoundError, AccessDeniedError) as exc:  # AccountAccessError too
            self.failure = exc
        except Exception as exc:  # a bug or AWS past retries: every record learns of it
            log.exception("writer of %s failed", self.stream)
            self.failure = exc
        finally:
            if self._listing is not None:
                self._listing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._listing
        if self.failure is not None:
            self._fail_all(self.failure)

    async def _step(self) -> None:
        now = time.monotonic()
        if now - self._last_expiry >= _EXPIRY_CHECK:
            self._expire(now)
            self._last_expiry = now
        listing = self._listing
        if listing is not None and listing.done():
            self._listing = None
            listing.result()  # a missing stream or a denied listing stops the writer
        if self._stale and self._listing is None and now >= self._list_after:
            # Beside the writes, which need no listing: Kinesis places each record by its hash
            # key whatever the map says, and keys stay where they landed (_pin).
            self._listing = asyncio.get_running_loop().create_task(self._list_again())
        wait: float | None = None
        if self.pending and len(self._in_flight) < self._options.max_in_flight:
            linger_left = self._linger_left(now)
            if linger_left <= 0:
                lanes = list(self._lanes.values())
                self._rotation = (self._rotation + 1) % max(1, len(lanes))
                lanes = lanes[self._rotation :] + lanes[: self._rotation]
                entries, wait = fill_call(
                    lanes,
                    now,
                    by_key=self._options.ordering == "key",
                    busy=self._busy,
                    aggregate=self._options.aggregate,
                    min_batch=self._options.min_batch,
                )
                if self._in_flight and hold_back(entries, self._lanes, self._busy, self._options):
                    wait = None  # too small to go yet: an answer in flight wakes the writer
                elif entries:
                    self._start_call(entries)
                    return
            else:
                wait = linger_left
        if self.pending:
            wait = _EXPIRY_CHECK if wait is None else min(wait, _EXPIRY_CHECK)
        if self._stale and self._listing is None:
            list_in = max(0.0, self._list_after - now)
            wait = list_in if wait is None else min(wait, list_in)
        with contextlib.suppress(asyncio.TimeoutError):
            await await_within(self.wake.wait(), wait)
        self.wake.clear()

    def _linger_left(self, now: float) -> float:
        if (
            self.closing
            or self._outcomes.flushing
            or self.pending_bytes >= MAX_CALL_BYTES
            or (not self._options.aggregate and self.pending >= MAX_CALL_RECORDS)
        ):
            return 0.0
        oldest = min(
            (lane.queue[0].put_time for lane in self._lanes.values() if lane.queue), default=now
        )
        return oldest + self._options.linger - now

    # -- calls --

    def _start_call(self, entries: list[Entry]) -> None:
        for entry in entries:
            for record in entry.records:
                self.pending -= 1
                self.pending_bytes -= record.size
        task = asyncio.get_running_loop().create_task(self._call(entries))
        self._in_flight.add(task)

    async def _call(self, entries: list[Entry]) -> None:
        started = time.monotonic()
        try:
            response = await self._kinesis.put_records(
                self.stream, [entry.wire() for entry in entries]
            )
        except Exception as exc:
            self._call_failed(entries, exc)
            self._outcomes.called(self.stream, time.monotonic() - started, error_code(exc))
        else:
            self._answered(entries, response["Records"])
            self._outcomes.called(self.stream, time.monotonic() - started, None)
        finally:
            if self._options.ordering == "key":
                for entry in entries:
                    self._busy.difference_update(record.key for record in entry.records)
            # Here, not in a done callback: the loop must see the call gone when it wakes.
            self._in_flight.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]
            self.wake.set()

    def _answered(self, entries: list[Entry], results: Sequence[PutResultEntry]) -> None:
        refused: list[Entry] = []
        written: list[tuple[PendingRecord, PutResult]] = []
        landings: dict[str, _Pin] = {}
        throttled = 0
        for entry, result in zip(entries, results, strict=True):
            code = result.get("ErrorCode")
            if code is None:
                shard_id, sequence_number = result["ShardId"], result["SequenceNumber"]
                if shard_id != entry.shard_id:
                    self._landed_elsewhere(entry, shard_id, landings)
                if len(entry.records) == 1:
                    written.append((entry.records[0], PutResult(shard_id, sequence_number, 0)))
                else:
                    written.extend(
                        (record, PutResult(shard_id, sequence_number, index))
                        for index, record in enumerate(entry.records)
                    )
            elif code in RETRYABLE_ENTRY_CODES:
                refused.append(entry)
                throttled += code == "ProvisionedThroughputExceededException"
            else:
                message = result.get("ErrorMessage", "")
                error: BaseException = (
                    AccessDeniedError(
                        f"Kinesis denied a record on {self.stream}: {code}: {message}"
                    )
                    if "AccessDenied" in code
                    else RecordRejectedError(self.stream, code, message)
                )
                for record in entry.records:
                    self._outcomes.failed(record, error)
        if landings:
            self._pin(landings)
        self._outcomes.succeeded(written)
        if refused:
            self._requeue(refused)
            self._outcomes.retried(self.stream, len(refused), throttled)

    def _call_failed(self, entries: list[Entry], exc: Exception) -> None:
        code = error_code(exc)
        if is_transient(exc):
            log.warning("PutRecords on %s failed (%s), retrying its entries", self.stream, code)
            self._requeue(entries)
            self._outcomes.retried(self.stream, len(entries), len(entries) * ("Throughput" in code))
            return
        if isinstance(exc, ClientError) and code == "ResourceNotFoundException":
            error: BaseException = StreamNotFoundError(
                f"stream {self.stream!r} does not exist (PutRecords): create it first"
            )
        elif is_denied(exc):
            error = AccessDeniedError(
                f"AWS denied kinesis:PutRecords on {self.stream} ({code}): grant the producer's "
                f"role this call"
            )
        else:
            error = (
                RecordRejectedError(self.stream, code, str(exc))
                if isinstance(exc, ClientError)
                else exc
            )
        for entry in entries:
            for record in entry.records:
                self._outcomes.failed(record, error)
        if isinstance(error, (StreamNotFoundError, AccessDeniedError)):
            self.failure = error
            self._fail_all(error)

    def _requeue(self, entries: list[Entry]) -> None:
        """Put refused entries' records back at the front of their lanes, in put order, with
        a backoff before they may go again: exponential in their attempts, full jitter, drawn
        once per call so that a call's refusals go out again together (one call, not one call
        each)."""
        now = time.monotonic()
        records = sorted((r for entry in entries for r in entry.records), key=lambda r: r.seq)
        attempts = max(record.attempts for record in records) + 1
        cap = min(
            self._options.max_retry_backoff, self._options.retry_backoff * 2 ** (attempts - 1)
        )
        not_before = now + random.uniform(0, cap)
        for record in reversed(records):
            record.attempts += 1
            record.not_before = not_before
            self._reroute(record).queue.appendleft(record)
            self.pending += 1
            self.pending_bytes += record.size

    # -- shard map --

    async def _list_shards(self) -> list[ShardDescription]:
        shards: list[ShardDescription] = []
        token: str | None = None
        stats = RequestStats()
        while True:
            # With NextToken, ListShards refuses StreamName: the token carries the stream.
            page_call = (
                functools.partial(self._kinesis.list_shards, next_token=token)
                if token
                else functools.partial(self._kinesis.list_shards, self.stream)
            )
            try:
                page = await call_with_retry("kinesis.ListShards", page_call, stats)
            except ClientError as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    raise StreamNotFoundError(
                        f"stream {self.stream!r} does not exist: create it before putting to it"
                    ) from exc
                if is_denied(exc):
                    raise AccessDeniedError(
                        f"AWS denied kinesis:ListShards on {self.stream} ({error_code(exc)}): "
                        f"grant the producer's role this call"
                    ) from exc
                raise
            shards.extend(page["Shards"])
            token = page.get("NextToken")
            if not token:
                return shards

    async def _list_again(self) -> None:
        """List a stale map again, as a task beside the writes."""
        stale_answers = self._stale_answers
        try:
            shards = await self._list_shards()
        except TransientAWSError as exc:
            self._list_failures += 1
            pause = min(LIST_AGAIN_MAX, LIST_AGAIN_AFTER * 2 ** (self._list_failures - 1))
            self._list_after = time.monotonic() + pause
            log.warning(
                "listing the shards of %s again failed (%s); writing on by the old map and "
                "where keys landed, listing again in %.1fs",
                self.stream,
                exc,
                pause,
            )
        else:
            self._list_failures = 0
            self._apply_map(shards)
            # An answer that named another shard while this listing ran may be newer than it.
            self._stale = self._stale_answers != stale_answers
        finally:
            self.wake.set()

    def _apply_map(self, shards: list[ShardDescription]) -> None:
        """Route by a new listing: every held record to its lane again, in put order.

        A pin to a shard the listing does not name at all (not even closed) is newer than the
        listing (an answer landed there while it ran): it stays, with its lane, or the old
        map's lane would send the key's next aggregate wherever its first record goes."""
        self._map = ShardMap(shards)
        self._stale = False
        listed = {str(shard["ShardId"]) for shard in shards}
        for key, pin in list(self._pinned.items()):
            if pin.shard_id not in listed:
                continue
            home = self._map.shard_for(pin.hash_key)
            if self._map.shard_for(pin.own) == home:
                del self._pinned[key]  # the key's own hash key routes there now
            elif home != pin.shard_id:
                self._pinned[key] = pin._replace(shard_id=home)  # that shard closed since
        held = [r for lane in self._lanes.values() for r in lane.queue] + self._unrouted
        held.sort(key=lambda r: r.seq)  # per-key order survives the move (see .batching)
        lanes, self._lanes = self._lanes, {}
        newer = {pin.shard_id for pin in self._pinned.values()} - listed
        for shard_id in [*self._map.shard_ids, *sorted(newer)]:
            self._lanes[shard_id] = lanes.get(shard_id) or self._new_lane(shard_id)
            self._lanes[shard_id].queue.clear()
        self._unrouted = []
        for record in held:
            self._reroute(record).queue.append(record)

    def _new_lane(self, shard_id: str) -> Lane:
        return Lane(
            shard_id,
            ShardPacer(
                self._options.shard_records_per_second,
                self._options.shard_bytes_per_second,
                time.monotonic(),
            ),
        )

    def _landed_elsewhere(self, entry: Entry, shard_id: str, landings: dict[str, _Pin]) -> None:
        """An entry landed on another shard than its lane's: note a stale map, and (aggregating
        with ``ordering="key"``) where the entry's keys are now."""
        assert self._map is not None
        text = entry.explicit_hash_key or str(entry.records[0].hash_key)
        hash_key = int(text)
        if self._map.shard_for(hash_key) != shard_id:
            self._stale = True  # resharded since the map was listed
            self._stale_answers += 1
        if self._options.aggregate and self._options.ordering == "key":
            for record in entry.records:
                old = self._pinned.get(record.key)
                own = record.hash_key if old is None else old.own
                landings[record.key] = _Pin(shard_id, hash_key, text, own)

    def _pin(self, landings: dict[str, _Pin]) -> None:
        """Keep each key whose records just landed off the map's routing on that shard.

        The rule (``ordering="key"``, ``aggregate=True``): once a key's entry landed on a shard,
        its later records go to that same shard until it closes; then to the shard that took
        over the hash key they carry (a child, or a merge's shard: the key's next entry lands
        there, and this runs again). An aggregate goes where the hash key it
        carries goes, so after a split the producer has not listed, its keys land together on
        the child of that hash key, which need not be theirs. Their later records carry the
        hash key that landed (an explicit hash key): they follow it there, and no aggregate
        of the old map's lane can take them to a sibling, where no reader would keep their
        order. Known from the PutRecords answer alone: no listing needed, none waited for.
        A key whose own hash key routes to that shard (by the map) needs no pin.

        Runs before the answered keys are free again (``ordering="key"``: none of their
        records is in flight); their held records move to their new lane, in put order.
        """
        assert self._map is not None
        for key, pin in landings.items():
            if self._map.shard_for(pin.own) == pin.shard_id:
                self._pinned.pop(key, None)
            else:
                self._pinned[key] = pin
                if pin.shard_id not in self._lanes:
                    self._lanes[pin.shard_id] = self._new_lane(pin.shard_id)
        moving: list[PendingRecord] = []
        for lane in self._lanes.values():
            if any(record.key in landings for record in lane.queue):
                kept = [record for record in lane.queue if record.key not in landings]
                moving.extend(record for record in lane.queue if record.key in landings)
                lane.queue.clear()
                lane.queue.extend(kept)
        if not moving:
            return
        joined: dict[str, Lane] = {}
        for record in moving:
            lane = self._reroute(record)
            lane.queue.append(record)
            joined[lane.shard_id] = lane
        for lane in joined.values():
            ordered = sorted(lane.queue, key=attrgetter("seq"))
            lane.queue.clear()
            lane.queue.extend(ordered)

    def _lane_for(self, record: PendingRecord) -> Lane:
        """A new record's lane: its pin's, else the map's for its hash key."""
        assert self._map is not None
        pin = self._pinned.get(record.key)
        if pin is None:
            return self._lanes[self._map.shard_for(record.hash_key)]
        record.explicit_hash_key = pin.text
        return self._lanes[pin.shard_id]

    def _reroute(self, record: PendingRecord) -> Lane:
        """:meth:`_lane_for` for a held record, which may carry a pin its key no longer has:
        it goes by its own hash key again."""
        text = record.explicit_hash_key
        if text is not None and record.key not in self._pinned and int(text) != record.hash_key:
            own = record.hash_key
            record.explicit_hash_key = None if own == key_hash(record.key) else str(own)
        return self._lane_for(record)

    # -- failing records --

    def _expire(self, now: float) -> None:
        for lane in self._lanes.values():
            if not lane.queue or min(map(attrgetter("deadline"), lane.queue)) > now:
                continue
            kept = [record for record in lane.queue if record.deadline > now]
            for record in lane.queue:
                if record.deadline <= now:
                    self._drop(
                        record,
                        DeliveryTimeoutError(
                            f"record for {self.stream} (key {record.key!r}) not written within "
                            f"delivery_timeout={self._options.delivery_timeout}s after "
                            f"{record.attempts} attempt(s)"
                        ),
                    )
            lane.queue.clear()
            lane.queue.extend(kept)

    def _fail_all(self, error: BaseException) -> None:
        for lane in self._lanes.values():
            for record in lane.queue:
                self._drop(record, error)
            lane.queue.clear()
        for record in self._unrouted:
            self._drop(record, error)
        self._unrouted = []

    def _drop(self, record: PendingRecord, error: BaseException) -> None:
        self.pending -= 1
        self.pending_bytes -= record.size
        self._outcomes.failed(record, error)
