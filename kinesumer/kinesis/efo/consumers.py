"""Registered stream consumers for enhanced fan-out: find a stream's ARN, register a consumer
(idempotently, racing members included) and wait until it is ACTIVE, deregister one; and an
app's consumer of a stream given by name or ARN deregistered in the stream's own account and
region (:func:`deregister_stream_consumer`, behind ``kinesumer.admin.deregister_consumer``).

These calls go through a Kinesis transport (:mod:`..transport`; the engine's aiobotocore client
is wrapped in one: they work over HTTP/1.1) and the library's one retry policy
(:func:`~kinesumer.aws.call_with_retry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from ...aws import RequestStats, call_with_retry, denied, error_code, is_denied
from ...aws.clients import AwsClients
from ...config import Config
from ...errors import ConfigError, KinesisError, StreamNotFoundError, TransientAWSError
from ...stream_refs import parse_stream
from ..places import AccountPlaces, home_of
from ..routing import routing_over
from ..transport import ConsumerDescription, KinesisTransport, transport_of

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


async def stream_arn(
    kinesis_client: KinesisTransport | Any, stream: str, *, stats: RequestStats
) -> str:
    """The ARN of ``stream`` (DescribeStreamSummary): the consumer calls take ARNs, not names."""
    try:
        response = await _call(
            "DescribeStreamSummary",
            f"stream {stream!r}",
            lambda: transport_of(kinesis_client).describe_stream_summary(stream),
            stats,
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise StreamNotFoundError(f"Kinesis stream {stream!r} does not exist") from exc
        raise KinesisError(f"kinesis:DescribeStreamSummary on {stream!r} failed: {exc}") from exc
    arn: str = response["StreamDescriptionSummary"]["StreamARN"]
    return arn


async def _describe(
    kinesis_client: KinesisTransport | Any, stream_arn: str, name: str, stats: RequestStats
) -> ConsumerDescription | None:
    """The consumer's description, or None when no consumer of that name exists."""
    try:
        response = await _call(
            "DescribeStreamConsumer",
            f"consumer {name!r} of {stream_arn}",
            lambda: transport_of(kinesis_client).describe_stream_consumer(stream_arn, name),
            stats,
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return None
        raise KinesisError(f"kinesis:DescribeStreamConsumer {name!r} failed: {exc}") from exc
    return response


async def register_consumer(
    kinesis_client: KinesisTransport | Any,
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
                    lambda: transport_of(kinesis_client).register_stream_consumer(stream_arn, name),
                    stats,
                )
                description = response
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
    kinesis_client: KinesisTransport | Any, stream_arn: str, name: str, *, stats: RequestStats
) -> bool:
    """Deregister the stream consumer ``name``: True when a consumer was deregistered (AWS
    deletes it in the background), False when none of that name existed, or it was being
    deleted already."""
    # Described first: a role without DescribeStreamConsumer (AWS's transport deregisters by
    # the ConsumerARN it describes) is told that action, not DeregisterStreamConsumer.
    description = await _describe(kinesis_client, stream_arn, name, stats)
    if description is None or description.get("ConsumerStatus") == "DELETING":
        return False
    try:
        await _call(
            "DeregisterStreamConsumer",
            f"consumer {name!r} of {stream_arn}",
            lambda: transport_of(kinesis_client).deregister_stream_consumer(stream_arn, name),
            stats,
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False
        raise KinesisError(f"kinesis:DeregisterStreamConsumer {name!r} failed: {exc}") from exc
    log.info("deregistered stream consumer %s of %s", name, stream_arn)
    return True


async def deregister_stream_consumer(
    config: Config, stream: str, *, kinesis: KinesisTransport | None = None
) -> bool:
    """Deregister the app's enhanced fan-out stream consumer (``config.effective_consumer_name``:
    ``consumer_name``, else the app's name, as members register it) of ``stream``: a name (the
    config's own account and region) or a Kinesis stream ARN, whose consumer is deregistered in
    the stream's own account and region, through ``Config.accounts``' role for that account.
    True when one was deregistered (AWS deletes it in the background), False when the stream
    has none of that name. Members never deregister it on close; members still reading through
    it lose their subscriptions and register it again. ``kinesis``: a Kinesis transport to call
    through (``kinesumer.testing.MemoryKinesis``, or a routing transport over several, in a
    test; default: AWS as ``config`` says). Blocking twin: ``kinesumer.admin.deregister_consumer``.

    Raises :class:`~kinesumer.errors.ConfigError` for a DynamoDB table's stream (it has no stream
    consumers), :class:`~kinesumer.errors.StreamNotFoundError`,
    :class:`~kinesumer.errors.AccountAccessError` for an account it cannot reach, and
    :class:`~kinesumer.errors.AccessDeniedError` naming the action the role lacks.
    """
    if parse_stream(stream).is_dynamodb_stream:
        raise ConfigError(
            "stream",
            f"DynamoDB Streams has no stream consumers ({stream!r}): nothing to deregister",
            "deregister_consumer",
        )
    stats = RequestStats()
    async with contextlib.AsyncExitStack() as stack:
        if kinesis is None:
            aws = AwsClients(config, stats)
            stack.push_async_callback(aws.close)
            await aws.open(dynamodb=False)
            kinesis = routing_over(aws, AccountPlaces(config, aws, home_of(config)))
        arn = await stream_arn(kinesis, stream, stats=stats)
        return await deregister_consumer(kinesis, arn, config.effective_consumer_name, stats=stats)
