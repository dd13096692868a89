"""What a failed SubscribeToShard becomes: a retryable :class:`SubscribeRetryable` (a
:class:`~kinesumer.errors.TransientAWSError` that carries the AWS error code) or one of the
library's final errors.

AWS answers SubscribeToShard errors either as the HTTP response (before any event) or as an
exception event inside the stream; both end here.
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from ...aws import denied, error_code, is_denied, is_transient
from ...errors import KinesisError, KinesumerError, TransientAWSError


class SubscribeRetryable(TransientAWSError):
    """A SubscribeToShard failure that heals by waiting: back off (the library's policy,
    :mod:`kinesumer.aws.retry`) and subscribe again from the last event received. ``code``: the
    AWS error code, or the name of the network error."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class SubscriptionInUse(SubscribeRetryable):
    """ResourceInUseException: another subscription to the shard is still open (AWS lets a new
    one take over 5 seconds after the last call), or the consumer is not ACTIVE yet."""


class SubscribeThrottled(SubscribeRetryable):
    """LimitExceededException: more than one SubscribeToShard a second for the shard and
    consumer."""


class SubscriptionReset(SubscribeRetryable):
    """The connection or stream failed (reset, timeout, a broken frame) or the server failed
    (InternalFailure, 5xx): subscribe again."""


class SubscribeTargetNotFound(KinesisError):
    """ResourceNotFoundException: the stream consumer is gone (``kinesumer deregister-consumer``,
    or another app's operator), or the stream itself. The fetcher looks both up again: a stream
    that still exists gets its consumer registered again and reading resumes where it was; a
    stream that is gone raises :class:`~kinesumer.errors.StreamNotFoundError` from the look-up.
    ``code``: the AWS error code."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def error_for(exc: ClientError, where: str) -> KinesumerError:
    """The library's error for a SubscribeToShard ClientError (HTTP response or exception
    event)."""
    code = error_code(exc)
    message = f"SubscribeToShard {where}: {code}: {exc}"
    if code == "ResourceInUseException":
        return SubscriptionInUse(code, message)
    if code == "LimitExceededException":
        return SubscribeThrottled(code, message)
    if is_transient(exc):
        return SubscriptionReset(code, message)
    if code == "ResourceNotFoundException":
        return SubscribeTargetNotFound(code, message)
    if is_denied(exc):
        return denied(exc, "kinesis:SubscribeToShard", where)
    return KinesisError(message)


def reset_error(exc: BaseException, where: str) -> SubscriptionReset:
    """A network or framing failure as a retryable reset."""
    code = type(exc).__name__
    return SubscriptionReset(code, f"SubscribeToShard {where}: {code}: {exc}")
