"""Each stream's maximum record size, learned from Kinesis, and the check a large record passes
at ``put()``.

Kinesis takes records of up to 1 MiB (data plus partition key) on every stream, and up to 10 MiB
on a stream whose maximum record size was raised (``MaxRecordSizeInKiB``: CreateStream,
UpdateMaxRecordSize; AWS's "Handle large records"). A record of at most 1 MiB needs no question
asked: the producer of such records never calls DescribeStreamSummary (nor needs the right to).
A larger one is checked against its stream's limit, which :class:`RecordSizeLimits` learns once
per stream and asks again for when a record would be refused by it (UpdateMaxRecordSize may have
raised it since) or when Kinesis refused a large record (it may have been lowered). A limit
that cannot be learned (DescribeStreamSummary denied, throttled past retries, the stream
missing) refuses nothing: Kinesis judges the record itself, and ``put()`` raises only what it
raised before (a missing stream fails the record's future, as it fails a small record's).
"""

from __future__ import annotations

import functools
import logging
import time

from botocore.exceptions import ClientError

from ..aws.accounting import RequestStats
from ..aws.retry import call_with_retry, error_code, is_denied
from ..errors import AccessDeniedError, KinesumerError, RecordTooLargeError, StreamNotFoundError
from ..kinesis.transport import AwsKinesisTransport, KinesisTransport
from .records import LARGEST_RECORD_BYTES, MAX_RECORD_BYTES

log = logging.getLogger("kinesumer.producer")

#: Seconds a learned limit refuses records before a refused record asks Kinesis again: a
#: raised limit is seen within this, and a producer refusing many records of one stream asks
#: at most once per interval (DescribeStreamSummary: 20 calls per second per account).
RELEARN_AFTER = 10.0


class RecordSizeLimits:
    """The maximum record size of each stream a producer put a large record to.

    Used on the producer's event loop only (by :meth:`ProducerCore.check_large
    <kinesumer.producer.core.ProducerCore.check_large>`, and by its ``failed`` when Kinesis
    refused a large record, which :meth:`forget` s the stream's limit).
    """

    def __init__(self) -> None:
        self._learned: dict[str, tuple[int, float]] = {}

    def known(self, stream: str) -> int | None:
        """The limit learned for ``stream`` (bytes), or None: not learned (or forgotten)."""
        entry = self._learned.get(stream)
        return None if entry is None else entry[0]

    async def limit_for(self, kinesis: KinesisTransport, stream: str, size: int) -> int:
        """``stream``'s maximum record size in bytes: the learned one, or Kinesis' answer when
        none is learned, or when the learned one refuses ``size`` and is older than
        :data:`RELEARN_AFTER`."""
        entry = self._learned.get(stream)
        now = time.monotonic()
        if entry is not None and (size <= entry[0] or now - entry[1] < RELEARN_AFTER):
            return entry[0]
        try:
            limit = await describe_max_record_bytes(kinesis, stream)
        except (KinesumerError, ClientError) as exc:
            # Kinesis judges the record: one it refuses fails its future and makes the next
            # large record ask again (forget); one it takes was never ours to refuse.
            log.warning(
                "the maximum record size of %s is unknown (%s): Kinesis judges records over "
                "1 MiB itself",
                stream,
                exc,
            )
            limit = LARGEST_RECORD_BYTES
        self._learned[stream] = (limit, time.monotonic())
        return limit

    def forget(self, stream: str) -> None:
        """Ask Kinesis again at the next large record (it refused one the limit admitted)."""
        self._learned.pop(stream, None)


async def describe_max_record_bytes(kinesis: KinesisTransport, stream: str) -> int:
    """``stream``'s ``MaxRecordSizeInKiB`` in bytes (DescribeStreamSummary); 1 MiB when the
    answer has none (a stream never raised, or a stand-in that does not know the field)."""
    try:
        answer = await call_with_retry(
            "kinesis.DescribeStreamSummary",
            functools.partial(kinesis.describe_stream_summary, stream),
            RequestStats(),
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise StreamNotFoundError(
                f"stream {stream!r} does not exist: create it before putting to it"
            ) from exc
        if is_denied(exc):
            raise AccessDeniedError(
                f"AWS denied kinesis:DescribeStreamSummary on {stream} ({error_code(exc)}): a "
                f"record over 1 MiB is checked against the stream's maximum record size; grant "
                f"the producer's role this call"
            ) from exc
        raise
    kib = answer.get("StreamDescriptionSummary", {}).get("MaxRecordSizeInKiB")
    if isinstance(kib, int) and not isinstance(kib, bool) and kib > 0:
        return min(kib * 1024, LARGEST_RECORD_BYTES)
    if not knows_max_record_size(kinesis):
        # botocore drops members its model does not know: an older botocore (aioboto3 13's
        # 1.34) never shows the field, also for a raised stream. Unknown: Kinesis judges.
        return LARGEST_RECORD_BYTES
    return MAX_RECORD_BYTES


def knows_max_record_size(kinesis: KinesisTransport) -> bool:
    """Whether ``kinesis`` would show DescribeStreamSummary's ``MaxRecordSizeInKiB``: an AWS
    transport only when its client's botocore model has the member (botocore parses only the
    members its model names); any other transport answers as Kinesis does."""
    if not isinstance(kinesis, AwsKinesisTransport):
        return True
    try:
        summary = kinesis.client.meta.service_model.operation_model("DescribeStreamSummary")
        members = summary.output_shape.members["StreamDescriptionSummary"].members
    except (AttributeError, KeyError, LookupError):
        return False
    return "MaxRecordSizeInKiB" in members


def refuse_over_limit(stream: str, size: int, limit: int) -> None:
    """Raise :class:`RecordTooLargeError` when a record of ``size`` bytes (data plus partition
    key) exceeds ``stream``'s maximum record size ``limit``."""
    if size <= limit:
        return
    raise RecordTooLargeError(
        f"put(data): {size} bytes of data and partition key, stream {stream!r} takes at most "
        f"{limit} bytes ({limit / MAX_RECORD_BYTES:g} MiB, its maximum record size) per record; "
        f"raise the stream's MaxRecordSizeInKiB (UpdateMaxRecordSize, up to 10 MiB), or split "
        f"the payload or store it elsewhere and put a reference",
        size=size,
        limit=limit,
        stream=stream,
    )
