"""The retry policy and the error classification every AWS call of kinesumer goes through.

botocore's own retries are switched off (one attempt per call: :func:`~.clients.boto_config`) so
that there is one retry policy, this one: tenacity, exponential backoff with full jitter, every
retry logged and counted in the caller's :class:`~.accounting.RequestStats`. Errors are sorted into
throttling, transient (worth retrying), denied (a permission to grant) and the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from ..errors import AccessDeniedError, TransientAWSError

if TYPE_CHECKING:
    from .accounting import RequestStats

log = logging.getLogger("kinesumer.aws")
T = TypeVar("T")

#: Error codes AWS answers with when a caller goes faster than its limits allow.
THROTTLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "KMSThrottlingException",
        "TooManyRequestsException",
    }
)
_SERVER_CODES = frozenset(
    {
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "InternalFailureException",
        # DynamoDB (HTTP 400): a plain write met a transaction on the same item, such as a
        # checkpoint release or claim meeting an exactly-once sink's commit. Retry it.
        "TransactionConflictException",
    }
)
_DENIED_CODES = frozenset(
    {
        "AccessDeniedException",
        "AccessDenied",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
        "KMSAccessDeniedException",
    }
)


class MalformedAnswer(Exception):
    """A successful (HTTP 200) answer that is not the service's: a proxy's or gateway's page, a
    garbled body, or one that says what the service's cannot (a shard ended that its listing
    shows open). Transient: the same call again may reach the service itself."""


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def is_throttle(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) in THROTTLE_CODES


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: throttling, server-side failures, network trouble, timeouts,
    answers that are not the service's (:class:`MalformedAnswer`)."""
    if isinstance(exc, MalformedAnswer):
        return True
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in THROTTLE_CODES or code in _SERVER_CODES or int(status or 0) >= 500
    # Network trouble only: connection errors, resets and timeouts (botocore's
    # ConnectionError/HTTPClientError families, OSError that aiohttp did not wrap, asyncio
    # timeouts). Other BotoCoreErrors (no credentials, no region, bad parameters) will not heal
    # by retrying, and must reach the application at once.
    network = (
        BotoConnectionError,
        HTTPClientError,
        IncompleteReadError,
        OSError,
        asyncio.TimeoutError,
    )
    return isinstance(exc, network) or type(exc).__module__.startswith("aiohttp")


def is_denied(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) in _DENIED_CODES


def denied(exc: ClientError, call: str, resource: str) -> AccessDeniedError:
    return AccessDeniedError(
        f"AWS denied {call} on {resource} ({error_code(exc)}): "
        f"grant the consumer's role this call (see infra/modules/consumer-policy)"
    )


async def call_with_retry(
    operation: str,
    call: Callable[[], Awaitable[T]],
    stats: RequestStats,
    *,
    attempts: int = 6,
    initial: float = 0.05,
    maximum: float = 2.0,
) -> T:
    """Run ``call`` and retry transient errors with exponential backoff and jitter.

    After ``attempts`` tries the last error is raised as :class:`TransientAWSError`; anything not
    transient is raised at once, unchanged.
    """

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is None:
            return
        stats.retries[(operation, error_code(exc))] += 1
        stats.last_error = exc
        log.warning(
            "%s failed (%s: %s), retry %d in %.2fs",
            operation,
            error_code(exc),
            exc,
            state.attempt_number,
            state.upcoming_sleep,
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=initial, max=maximum),
        before_sleep=before_sleep,
        reraise=True,
    )

    async def attempt() -> T:
        # tenacity runs a plain callable without awaiting what it returns: give it a coroutine
        # function.
        return await call()

    try:
        return await retrying(attempt)
    except Exception as exc:
        if is_transient(exc):
            raise TransientAWSError(
                f"{operation} kept failing after {attempts} attempts: {error_code(exc)}: {exc}"
            ) from exc
        raise
