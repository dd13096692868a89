"""Kinesis calls: stream checks, shard listing with lineage, iterators and GetRecords."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from functools import partial
from typing import Any, Generic, TypeVar

from botocore.exceptions import ClientError

from ..aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ..aws.retry import MalformedAnswer
from ..config import InitialPosition
from ..errors import CorruptStateError, KinesisError, StreamNotFoundError
from ..models import Position, Record, Shard
from . import lean
from .columns import EpochColumns, epoch_columns_of
from .kpl import epoch_records, records_of, to_records

log = logging.getLogger("kinesumer.kinesis")
T = TypeVar("T")
#: A lean GetRecords answer, in either form.
Answer = TypeVar(
    "Answer", lean.RecordsAnswer[lean.RawRecord], lean.RecordsAnswer[lean.EpochRawRecord]
)

#: How far before the ``Date`` of the answer that opened a ``LATEST`` iterator its start is put:
#: the header counts whole seconds, the position was fixed a little before the answer was
#: written (a retried call's latency included), and Kinesis's hosts' clocks differ by far less.
#: Earlier is safe: a reopening may deliver a few records from before the LATEST moment
#: (at-least-once), never skip one after it.
SERVER_CLOCK_MARGIN_MS = 5_000
#: The same from this host's clock, for an endpoint whose answers carry no ``Date``: a host
#: ahead of Kinesis by more than this could skip records on a reopening.
LOCAL_CLOCK_MARGIN_MS = 60_000


#: Set to ``1``: readers parse GetRecords with botocore alone (the lean path's reference; the
#: benchmarks' "before").
BOTOCORE_GET_RECORDS_ENV = "KINESUMER_BOTOCORE_GET_RECORDS"

#: Fresh iterators :meth:`KinesisReader.scan_since` probes with before an expiry is raised.
PROBE_ATTEMPTS = 5


class IteratorExpired(Exception):
    """The shard iterator is older than five minutes: get a new one from the last record read."""


#: A batch's records: a list of :class:`Record`, or the Spark executors' columns.
Rows = TypeVar("Rows", list[Record], EpochColumns)


@dataclass(frozen=True)
class ShardBatch(Generic[Rows]):
    """One GetRecords answer: records (aggregates unpacked; a list of :class:`Record`, or
    :class:`EpochColumns` from :meth:`KinesisReader.get_epoch_columns`), where to read next
    (None at SHARD_END), how far behind the tip the shard is, and how many Kinesis records
    came."""

    records: Rows
    next_iterator: str | None
    millis_behind: int | None
    raw_count: int


class KinesisReader:
    """Kinesis calls for one engine, with retries and errors named for the application.

    GetRecords goes the lean way (:mod:`.lean`: signed and sent by botocore, the answer decoded
    by msgspec) unless ``lean_get_records`` is False, or None (the default) and the environment
    sets :data:`BOTOCORE_GET_RECORDS_ENV` to ``1`` (the benchmarks' "before"), or the client is
    not a JSON client.

    Every GetRecords answer is checked before it is used, inside the retried call: one that is
    not a Kinesis answer (:func:`.lean.well_formed`), or that ends an open shard
    (:meth:`_confirm_end`), raises :class:`~kinesumer.aws.retry.MalformedAnswer`, retried with
    backoff like any transient error (counted in ``RequestStats.retries``, logged), with the
    same iterator: reading resumes exactly where it was."""

    def __init__(
        self,
        client: Any,
        stats: RequestStats,
        region: str | None,
        *,
        lean_get_records: bool | None = None,
    ) -> None:
        self._kinesis = client
        if lean_get_records is None:
            lean_get_records = os.environ.get(BOTOCORE_GET_RECORDS_ENV) != "1"
        self._lean = lean_get_records and lean.install(client)
        self._stats = stats
        self._region = region or "the configured region"

    async def _call(
        self, operation: str, stream: str, fn: Callable[[], Awaitable[T]], attempts: int = 6
    ) -> T:
        try:
            return await call_with_retry(
                f"kinesis.{operation}", fn, self._stats, attempts=attempts, initial=0.2, maximum=5
            )
        except ClientError as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException":
                raise StreamNotFoundError(
                    f"Kinesis stream {stream!r} does not exist in {self._region} (or was "
                    f"deleted): check the stream name, kinesis_region and role_arn"
                ) from exc
            if code == "ExpiredIteratorException":
                raise IteratorExpired(str(exc)) from exc
            if is_denied(exc):
                raise denied(exc, f"kinesis:{operation}", f"stream {stream!r}") from exc
            raise KinesisError(f"kinesis:{operation} on {stream!r} failed: {exc}") from exc

    async def check_stream(self, stream: str) -> None:
        """Raise StreamNotFoundError / AccessDeniedError now rather than from a background task."""
        await self._call(
            "DescribeStreamSummary",
            stream,
            lambda: self._kinesis.describe_stream_summary(StreamName=stream),
        )

    async def list_shards(self, stream: str) -> list[Shard]:
        """Every shard of the stream (all ListShards pages), with parents and closed flags. A
        page without ``Shards`` is not Kinesis's answer (it would list no shard): retried
        (:class:`MalformedAnswer`)."""
        shards: list[Shard] = []
        kwargs: dict[str, Any] = {"StreamName": stream}
        while True:
            response = await self._call("ListShards", stream, partial(self._page, kwargs))
            for s in response["Shards"]:
                shards.append(
                    Shard(
                        shard_id=s["ShardId"],
                        parent_shard_id=s.get("ParentShardId"),
                        adjacent_parent_shard_id=s.get("AdjacentParentShardId"),
                        closed="EndingSequenceNumber" in s.get("SequenceNumberRange", {}),
                    )
                )
            token = response.get("NextToken")
            if not token:
                break
            # With NextToken, ListShards refuses StreamName: the token carries the stream.
            kwargs = {"NextToken": token}
        return sorted(set(shards))

    async def _page(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = await self._kinesis.list_shards(**kwargs)
        if not isinstance(response.get("Shards"), list):
            raise MalformedAnswer("a ListShards answer without Shards")
        return response

    async def shard_iterator(
        self,
        stream: str,
        shard_id: str,
        after: Position | None,
        initial: InitialPosition,
    ) -> str:
        """An iterator at ``after`` (AT its sequence number: the caller skips what it already
        had, which also works inside a KPL aggregate), or at ``initial`` when there is none."""
        kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id}
        if after is not None:
            kwargs["ShardIteratorType"] = "AT_SEQUENCE_NUMBER"
            kwargs["StartingSequenceNumber"] = after.sequence_number
        elif isinstance(initial, datetime):
            kwargs["ShardIteratorType"] = "AT_TIMESTAMP"
            kwargs["Timestamp"] = initial
        else:
            kwargs["ShardIteratorType"] = initial
        try:
            response = await self._call(
                "GetShardIterator", stream, lambda: self._kinesis.get_shard_iterator(**kwargs)
            )
        except KinesisError as exc:
            cause = exc.__cause__
            if after is not None and error_code(cause or exc) == "InvalidArgumentException":
                raise CorruptStateError(
                    f"{stream}/{shard_id}: checkpoint sequence number {after.sequence_number} is "
                    f"not in this shard ({cause}); was the stream re-created? Reset the "
                    f"checkpoint with `kinesumer checkpoints reset`"
                ) from exc
            raise
        iterator: str = response["ShardIterator"]
        return iterator

    async def open_latest(self, stream: str, shard_id: str) -> tuple[str, int]:
        """An iterator at LATEST, and the instant (epoch ms) reading began by Kinesis's clock
        (the answer's ``Date`` header minus :data:`SERVER_CLOCK_MARGIN_MS`): at or before the
        iterator's position, so reading again from it (:meth:`iterator_since`) skips nothing."""
        kwargs = {"StreamName": stream, "ShardId": shard_id, "ShardIteratorType": "LATEST"}
        response = await self._call(
            "GetShardIterator", stream, lambda: self._kinesis.get_shard_iterator(**kwargs)
        )
        iterator: str = response["ShardIterator"]
        return iterator, start_instant_ms(response)

    async def iterator_since(
        self, stream: str, shard_id: str, since_ms: int
    ) -> tuple[str, datetime | None]:
        """An iterator at the first record that arrived at or after ``since_ms`` (what
        AT_TIMESTAMP gives), and the instant before which the caller skips the leading records
        (None: nothing to skip). See :meth:`scan_since`."""
        since = datetime.fromtimestamp(since_ms / 1000, timezone.utc)
        oldest = await self.scan_since(stream, shard_id, since)
        if oldest is not None:
            return oldest, since
        return await self.shard_iterator(stream, shard_id, None, since), None

    async def scan_since(self, stream: str, shard_id: str, since: datetime) -> str | None:
        """A TRIM_HORIZON iterator when reading from it, skipping the leading records that
        arrived before ``since``, is as cheap as AT_TIMESTAMP; None: use AT_TIMESTAMP.

        One probe read at TRIM_HORIZON decides: at the tip after it (the shard holds nothing
        past its oldest record, or nothing at all), or an oldest record recent enough, there is
        nothing to scan. kinesalite always takes this path (its MillisBehindLatest is always
        0), which is what it needs: its AT_TIMESTAMP never answers while no record arrived
        after the instant. AWS answers AT_TIMESTAMP at once: every other case uses it.

        The probe's iterator is fresh, but a stalled process (a paused VM, a long retry) can
        still see it expire: then a new one is probed (an expiry here must not stop the member:
        it is not one of the reads the fetcher renews)."""
        for attempt in range(PROBE_ATTEMPTS):
            oldest = await self.shard_iterator(stream, shard_id, None, "TRIM_HORIZON")
            try:
                probe = await self.get_records(stream, shard_id, oldest, 1, None)
                break
            except IteratorExpired:
                if attempt == PROBE_ATTEMPTS - 1:
                    raise
                log.info("%s/%s: the probe's iterator expired; probing again", stream, shard_id)
        first = probe.records[0].approximate_arrival_timestamp if probe.records else None
        if not probe.millis_behind or (first is not None and first >= since):
            return oldest
        return None

    async def get_records(
        self,
        stream: str,
        shard_id: str,
        iterator: str,
        limit: int,
        skip_through: Position | None,
    ) -> ShardBatch[list[Record]]:
        # Throttling on GetRecords is normal under load: retry patiently (up to ~1 minute of
        # backoff) before the fetcher reports it and starts over.
        if not self._lean:
            return await self._botocore_get_records(stream, shard_id, iterator, limit, skip_through)
        fetch = partial(lean.get_records, self._kinesis, iterator, limit)
        answer = await self._call(
            "GetRecords", stream, partial(self._answer, stream, shard_id, fetch), 15
        )
        return _batch(
            answer, records_of(stream, shard_id, answer.Records, skip_through, self._stats)
        )

    async def get_epoch_columns(
        self,
        stream: str,
        shard_id: str,
        iterator: str,
        limit: int,
        skip_through: Position | None,
    ) -> ShardBatch[EpochColumns]:
        """:meth:`get_records` as columns with arrival times as epoch seconds
        (:class:`EpochColumns`): the Spark executors', which build Arrow from them."""
        if not self._lean:
            batch = await self._botocore_get_records(
                stream, shard_id, iterator, limit, skip_through
            )
            columns = EpochColumns.from_records(stream, shard_id, epoch_records(batch.records))
            return ShardBatch(columns, batch.next_iterator, batch.millis_behind, batch.raw_count)
        fetch = partial(lean.get_epoch_records, self._kinesis, iterator, limit)
        answer = await self._call(
            "GetRecords", stream, partial(self._answer, stream, shard_id, fetch), 15
        )
        raw = answer.Records
        return _batch(answer, epoch_columns_of(stream, shard_id, raw, skip_through, self._stats))

    async def _botocore_get_records(
        self,
        stream: str,
        shard_id: str,
        iterator: str,
        limit: int,
        skip_through: Position | None,
    ) -> ShardBatch[list[Record]]:
        """GetRecords parsed by botocore alone: a client the lean path cannot serve, and the
        reference the lean path is tested against."""

        async def fetch() -> dict[str, Any]:
            got = await self._kinesis.get_records(ShardIterator=iterator, Limit=limit)
            response = lean.well_formed(got)
            if response.get("NextShardIterator") is None:
                await self._confirm_end(stream, shard_id, response.get("ChildShards"))
            return response

        response = await self._call("GetRecords", stream, fetch, attempts=15)
        raw = response["Records"]
        return ShardBatch(
            records=to_records(stream, shard_id, raw, skip_through, self._stats),
            next_iterator=response.get("NextShardIterator"),
            millis_behind=response.get("MillisBehindLatest"),
            raw_count=len(raw),
        )

    async def _answer(
        self, stream: str, shard_id: str, fetch: Callable[[], Awaitable[Answer]]
    ) -> Answer:
        """``fetch()``'s answer (a Kinesis answer: the lean decoder requires its members), the
        shard's end it says confirmed (:meth:`_confirm_end`)."""
        answer = await fetch()
        if answer.NextShardIterator is None:
            await self._confirm_end(stream, shard_id, answer.ChildShards)
        return answer

    async def _confirm_end(
        self, stream: str, shard_id: str, children: list[dict[str, Any]] | None
    ) -> None:
        """An answer without a next iterator ends the shard only if the shard is closed: the
        answer names its children (AWS, kinesis-local), or the stream's listing shows it with
        an EndingSequenceNumber (kinesalite sends no ChildShards), or no longer lists it (aged
        out). An open shard's "end" is not Kinesis's answer: :class:`MalformedAnswer`. Costs
        one ListShards call (a page per 1,000 shards) per shard end without ChildShards."""
        if children:
            return
        for shard in await self.list_shards(stream):
            if shard.shard_id == shard_id and not shard.closed:
                raise MalformedAnswer(
                    f"a GetRecords answer of {stream}/{shard_id} without a next iterator, but "
                    f"the shard is open by its listing"
                )


def _batch(
    answer: lean.RecordsAnswer[lean.RawRecord] | lean.RecordsAnswer[lean.EpochRawRecord],
    records: Rows,
) -> ShardBatch[Rows]:
    """The batch of a lean answer whose records are ``records``."""
    return ShardBatch(
        records, answer.NextShardIterator, answer.MillisBehindLatest, len(answer.Records)
    )


def start_instant_ms(response: dict[str, Any]) -> int:
    """When a read opened by ``response`` began, by Kinesis's clock (see
    :data:`SERVER_CLOCK_MARGIN_MS`), or by this host's (:data:`LOCAL_CLOCK_MARGIN_MS`)."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    date = headers.get("date") or headers.get("Date")
    if date:
        try:
            served = parsedate_to_datetime(date)
            if served.tzinfo is None:  # "-0000": UTC, with no zone said
                served = served.replace(tzinfo=timezone.utc)
            return int(served.timestamp() * 1000) - SERVER_CLOCK_MARGIN_MS
        except (TypeError, ValueError):
            log.debug("unreadable Date header %r: using this host's clock", date)
    return int(time.time() * 1000) - LOCAL_CLOCK_MARGIN_MS


def arrived_since(records: list[Record], since: datetime) -> tuple[list[Record], bool]:
    """``records`` without the leading ones that arrived before ``since`` (what AT_TIMESTAMP
    would not have returned), and whether one that did not was found (then stop skipping)."""
    for i, record in enumerate(records):
        arrival = record.approximate_arrival_timestamp
        if arrival is None or arrival >= since:
            return records[i:], True
    return [], False
