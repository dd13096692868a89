"""Kinesis calls: stream checks, shard listing with lineage, iterators and GetRecords."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any, Generic, TypeVar

from botocore.exceptions import ClientError

from ..aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ..aws.retry import MalformedAnswer
from ..config import InitialPosition
from ..errors import CorruptStateError, KinesisError, StreamNotFoundError
from ..models import Position, Record, Shard
from ..stream_refs import is_dynamodb_stream
from . import lean
from .columns import EpochColumns, epoch_columns_of
from .kpl import records_of
from .transport import (
    BOTOCORE_GET_RECORDS_ENV,
    IteratorAnswer,
    IteratorType,
    KinesisTransport,
    ShardPage,
    transport_of,
)

#: The IAM actions of DynamoDB Streams behind the Kinesis operations a reader makes on a
#: table's stream (:mod:`.dynamodb_streams`), for AccessDeniedError's message.
_DYNAMODB_STREAMS_ACTIONS = {
    "DescribeStreamSummary": "DescribeStream",
    "ListShards": "DescribeStream",
}

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


__all__ = ["BOTOCORE_GET_RECORDS_ENV", "IteratorExpired", "KinesisReader", "ShardBatch"]

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
    """Kinesis calls for one engine, with retries and errors named for the application, over a
    :class:`~.transport.KinesisTransport` (which makes each call once).

    Over AWS (:class:`~.transport.AwsKinesisTransport`), GetRecords goes the lean way
    (:mod:`.lean`: signed and sent by botocore, the answer decoded by msgspec) unless
    ``lean_get_records`` is False, or None (the default) and the environment sets
    :data:`BOTOCORE_GET_RECORDS_ENV` to ``1`` (the benchmarks' "before"), or the client is not
    a JSON client.

    Every GetRecords answer is checked before it is used, inside the retried call: one that is
    not a Kinesis answer (:func:`.lean.well_formed`), or that ends an open shard
    (:meth:`_confirm_end`), raises :class:`~kinesumer.aws.retry.MalformedAnswer`, retried with
    backoff like any transient error (counted in ``RequestStats.retries``, logged), with the
    same iterator: reading resumes exactly where it was."""

    def __init__(
        self,
        kinesis: KinesisTransport | Any,
        stats: RequestStats,
        region: str | None,
        *,
        lean_get_records: bool | None = None,
    ) -> None:
        """``kinesis``: a :class:`~.transport.KinesisTransport`, or an aiobotocore Kinesis
        client (then called through an :class:`~.transport.AwsKinesisTransport`, lean as
        ``lean_get_records`` says)."""
        self._kinesis = transport_of(kinesis, lean=lean_get_records)
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
            table_stream = is_dynamodb_stream(stream)
            if code == "ResourceNotFoundException":
                raise StreamNotFoundError(self._not_found(stream, table_stream)) from exc
            if code == "ExpiredIteratorException":
                raise IteratorExpired(str(exc)) from exc
            if is_denied(exc):
                action = (
                    f"dynamodb:{_DYNAMODB_STREAMS_ACTIONS.get(operation, operation)}"
                    if table_stream
                    else f"kinesis:{operation}"
                )
                raise denied(exc, action, f"stream {stream!r}") from exc
            raise KinesisError(f"kinesis:{operation} on {stream!r} failed: {exc}") from exc

    def _not_found(self, stream: str, table_stream: bool) -> str:
        if table_stream:
            return (
                f"DynamoDB table stream {stream!r} does not exist (its table was deleted, or "
                f"its stream disabled: enabling it again makes a new ARN): check the table's "
                f"LatestStreamArn (DescribeTable), the ARN's region and account, and "
                f"dynamodb_streams_endpoint (or dynamodb_endpoint) where set"
            )
        if stream.startswith("arn:"):
            return (
                f"Kinesis stream {stream!r} does not exist (or was deleted): check the ARN, and "
                f"Config.accounts for its account"
            )
        return (
            f"Kinesis stream {stream!r} does not exist in {self._region} (or was "
            f"deleted): check the stream name, kinesis_region and role_arn"
        )

    async def check_stream(self, stream: str) -> None:
        """Raise StreamNotFoundError / AccessDeniedError now rather than from a background task."""
        await self._call(
            "DescribeStreamSummary",
            stream,
            partial(self._kinesis.describe_stream_summary, stream),
        )

    async def list_shards(self, stream: str) -> list[Shard]:
        """Every shard of the stream (all ListShards pages), with parents and closed flags. A
        page without ``Shards`` is not Kinesis's answer (it would list no shard): retried
        (:class:`MalformedAnswer`)."""
        shards: list[Shard] = []
        token: str | None = None
        while True:
            response = await self._call("ListShards", stream, partial(self._page, stream, token))
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
        return sorted(set(shards))

    async def _page(self, stream: str, token: str | None) -> ShardPage:
        # With NextToken, ListShards refuses StreamName: the token carries the stream.
        response = await (
            self._kinesis.list_shards(next_token=token)
            if token
            else self._kinesis.list_shards(stream)
        )
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
        answer = await self.open_shard_iterator(stream, shard_id, after, initial)
        return answer.iterator

    async def open_shard_iterator(
        self,
        stream: str,
        shard_id: str,
        after: Position | None,
        initial: InitialPosition,
    ) -> IteratorAnswer:
        """:meth:`shard_iterator`'s answer whole: the iterator, and when Kinesis answered by its
        own clock (its ``Date``), for a caller that measures on Kinesis's clock (the lag
        probe, :mod:`.lag_probe`)."""
        start: IteratorType
        sequence_number: str | None = None
        timestamp: datetime | None = None
        if after is not None:
            start, sequence_number = "AT_SEQUENCE_NUMBER", after.sequence_number
        elif isinstance(initial, datetime):
            start, timestamp = "AT_TIMESTAMP", initial
        else:
            start = initial
        get_iterator = partial(
            self._kinesis.get_shard_iterator,
            stream,
            shard_id,
            start,
            sequence_number=sequence_number,
            timestamp=timestamp,
        )
        try:
            answer = await self._call("GetShardIterator", stream, get_iterator)
        except KinesisError as exc:
            cause = exc.__cause__
            if after is not None and error_code(cause or exc) == "InvalidArgumentException":
                raise CorruptStateError(
                    f"{stream}/{shard_id}: checkpoint sequence number {after.sequence_number} is "
                    f"not in this shard ({cause}); was the stream re-created? Reset the "
                    f"checkpoint with `kinesumer checkpoints reset`"
                ) from exc
            raise
        return answer

    async def open_latest(self, stream: str, shard_id: str) -> tuple[str, int]:
        """An iterator at LATEST, and the instant (epoch ms) reading began by Kinesis's clock
        (the answer's ``Date`` header minus :data:`SERVER_CLOCK_MARGIN_MS`): at or before the
        iterator's position, so reading again from it (:meth:`iterator_since`) skips nothing."""
        answer = await self._call(
            "GetShardIterator",
            stream,
            partial(self._kinesis.get_shard_iterator, stream, shard_id, "LATEST"),
        )
        return answer.iterator, start_instant_ms(answer.served_at)

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
        fetch = partial(self._kinesis.get_records, iterator, limit)
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
        fetch = partial(self._kinesis.get_epoch_records, iterator, limit)
        answer = await self._call(
            "GetRecords", stream, partial(self._answer, stream, shard_id, fetch), 15
        )
        raw = answer.Records
        return _batch(answer, epoch_columns_of(stream, shard_id, raw, skip_through, self._stats))

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


def start_instant_ms(served: datetime | None) -> int:
    """When a read opened by an answer Kinesis ``served`` (its ``Date``) began, by Kinesis's
    clock (see :data:`SERVER_CLOCK_MARGIN_MS`), or, without one, by this host's
    (:data:`LOCAL_CLOCK_MARGIN_MS`)."""
    if served is not None:
        return int(served.timestamp() * 1000) - SERVER_CLOCK_MARGIN_MS
    return int(time.time() * 1000) - LOCAL_CLOCK_MARGIN_MS


def arrived_since(records: list[Record], since: datetime) -> tuple[list[Record], bool]:
    """``records`` without the leading ones that arrived before ``since`` (what AT_TIMESTAMP
    would not have returned), and whether one that did not was found (then stop skipping)."""
    for i, record in enumerate(records):
        arrival = record.approximate_arrival_timestamp
        if arrival is None or arrival >= since:
            return records[i:], True
    return [], False
