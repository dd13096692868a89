"""Registered stream consumers for enhanced fan-out: find a stream's ARN, register a consumer
(idempotently, racing members included) and wait until it is ACTIVE, deregister one.

These calls go through the engine's aiobotocore Kinesis client (they work over HTTP/1.1) and the
library's one retry policy (:func:`~kinesumer.aws.call_with_retry`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from ...aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ...errors import KinesisError, StreamNotFoundError, TransientAWSError

log = logging.getLogger("kinesumer.kinesis")
T = TypeVar("T")

#: How long :func:`register_consumer` waits for a consumer to become ACTIVE (AWS: seconds).
ACTIVE_TIMEOUT = 120.0


async def _call(
    operation: str, resource: str, fn: Callable[[], Awaitable[T]], stats: RequestStats
) -> T:
    try:
        return await call_with_retry(f"kinesis.{operation}", fn, stats, initial=0.2, maximum=5)
    except ClientError as exc:
        if is_denied(exc):
            raise denied(exc, f"kinesis:{operation}", resource) from exc
        raise


async def stream_arn(kinesis_client: Any, stream: str, *, stats: RequestStats) -> str:
    """The ARN of ``stream`` (DescribeStreamSummary): the consumer calls take ARNs, not names."""
    try:
        response = await _call(
            "DescribeStreamSummary",
            f"stream {stream!r}",
            lambda: kinesis_client.describe_stream_summary(StreamName=stream),
            stats,
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise StreamNotFoundError(f"Kinesis stream {stream!r} does not exist") from exc
        raise KinesisError(f"kinesis:DescribeStreamSummary on {stream!r} failed: {exc}") from exc
    arn: str = response["StreamDescriptionSummary"]["StreamARN"]
    return arn


async def _describe(
    kinesis_client: Any, stream_arn: str, name: str, stats: RequestStats
) -> dict[str, Any] | None:
    """The consumer's description, or None when no consumer of that name exists."""
    try:
        response = await _call(
            "DescribeStreamConsumer",
            f"consumer {name!r} of {stream_arn}",
            lambda: kinesis_client.describe_stream_consumer(
                StreamARN=stream_arn, ConsumerName=name
            ),
            stats,
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return None
        raise KinesisError(f"kinesis:DescribeStreamConsumer {name!r} failed: {exc}") from exc
    description: dict[str, Any] = response["ConsumerDescription"]
    return description


async def register_consumer(
    kinesis_client: Any,
    stream_arn: str,
    name: str,
    *,
    stats: RequestStats,
    timeout: float = ACTIVE_TIMEOUT,
) -> str:
    """Register the stream consumer ``name`` unless it exists, wait until it is ACTIVE, and
    return its ARN.

    Idempotent: a consumer that already exists (ResourceInUseException, from an earlier run or
    a member racing this one) is described instead, so every member of an app ends with the same
    ARN. A consumer being deleted (DELETING) is waited out and registered again. Raises
    :class:`~kinesumer.errors.TransientAWSError` when it is not ACTIVE within ``timeout``
    seconds, :class:`~kinesumer.errors.AccessDeniedError` without the permissions.
    """
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        description = await _describe(kinesis_client, stream_arn, name, stats)
        if description is None:
            try:
                response = await _call(
                    "RegisterStreamConsumer",
                    f"stream {stream_arn}",
                    lambda: kinesis_client.register_stream_consumer(
                        StreamARN=stream_arn, ConsumerName=name
                    ),
                    stats,
                )
                description = response["Consumer"]
                log.info("registered stream consumer %s on %s", name, stream_arn)
            except ClientError as exc:
                # Another member registered it first, or it is still being deleted: describe
                # it again on the next turn.
                if error_code(exc) != "ResourceInUseException":
                    raise KinesisError(
                        f"kinesis:RegisterStreamConsumer {name!r} failed: {exc}"
                    ) from exc
        if description is not None and description.get("ConsumerStatus") == "ACTIVE":
            arn: str = description["ConsumerARN"]
            return arn
        if time.monotonic() >= deadline:
            status = description.get("ConsumerStatus") if description else "absent"
            raise TransientAWSError(
                f"stream consumer {name!r} of {stream_arn} is not ACTIVE after {timeout:.0f}s "
                f"(it is {status})"
            )
        # DescribeStreamConsumer allows 20 calls a second per stream: back off with jitter so a
        # whole group waiting at once stays well under it.
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 2.0)


async def deregister_consumer(
    kinesis_client: Any, stream_arn: str, name: str, *, stats: RequestStats
) -> bool:
    """Deregister the stream consumer ``name``: True when a consumer was deregistered (AWS
    deletes it in the background), False when none of that name existed."""
    try:
        await _call(
            "DeregisterStreamConsumer",
            f"consumer {name!r} of {stream_arn}",
            lambda: kinesis_client.deregister_stream_consumer(
                StreamARN=stream_arn, ConsumerName=name
            ),
            stats,
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False
        raise KinesisError(f"kinesis:DeregisterStreamConsumer {name!r} failed: {exc}") from exc
    log.info("deregistered stream consumer %s of %s", name, stream_arn)
    return True
