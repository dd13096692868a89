"""The retry policy and the error classification every AWS call of kinesumer goes through.

botocore's own retries are switched off (one attempt per call: :func:`~.clients.boto_config`) so
that there is one retry policy, this one: tenacity, exponential backoff with full jitter, every
retry logged and counted in the caller's :class:`~.accounting.RequestStats`. Errors are sorted into
throttling, transient (worth retrying), denied (a permission to grant) and the rest.

A hung endpoint (the connection is accepted, no answer comes) costs a call no more than quick
failures do. Without a bound each try would wait out botocore's read timeout, and six tries
make a minute before the caller hears of the trouble. So a call's tries end, at the latest,
:func:`retry_window` after its first failed try was *sent* (a try still waiting then is cut):
about the time its backoff alone takes, plus one read timeout. A caller that rides out outages
for a bounded time (the Spark source's ``outage_timeout``: :mod:`kinesumer.spark.source.outage`)
sets an :class:`OutageClock` around its calls (:func:`outage_clock`): every call then also ends
once the outage is ``timeout`` old, counted from the first failed try of the outage, and a
first try that hangs longer than the whole budget is cut there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
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
from tenacity.stop import stop_base

from ..errors import AccessDeniedError, TransientAWSError
from ..runtime.aio_timeout import await_within
from .accounting import THROTTLE_CODES

if TYPE_CHECKING:
    from .accounting import RequestStats

log = logging.getLogger("kinesumer.aws")
T = TypeVar("T")

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


#: The least time a try is given when a deadline is near or past (capped by an outage clock's
#: whole budget). A step retried at the end of its outage budget calls other services too: a
#: healthy one answers well within this, so a cut try names the service that is really down,
#: never one whose call merely came last.
MIN_TRY = 1.0

#: botocore's read timeout for kinesumer's clients (:func:`~.clients.boto_config`): how long one
#: try may wait for its answer, which a call's :func:`retry_window` leaves room for once.
CALL_TIMEOUT = 10.0


def retry_window(attempts: int, initial: float, maximum: float) -> float:
    """How long after its first failed try was sent a call's tries may go on: the longest its
    backoff can sleep in all (tenacity's exponential wait with up to 1 s of jitter, each pause
    at most ``maximum``), plus :data:`CALL_TIMEOUT` for the try in flight."""
    sleeps = sum(min(initial * 2.0**n + 1.0, maximum) for n in range(attempts - 1))
    return float(sleeps) + CALL_TIMEOUT


class OutageClock:
    """When the outage a caller is riding out began, shared by every call it makes while the
    clock is set (:func:`outage_clock`), from any thread: a call's tries end by
    :meth:`deadline`, and the caller reads :attr:`since` to know how long it has lasted.

    ``since`` is the monotonic moment the first failed try of the outage was sent (a hung try
    counts from its send, not from when it was given up); an answered call ends the outage
    (None again). Set by :func:`call_with_retry` (and by the caller, for failures of its own).
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.since: float | None = None

    def failed(self, sent: float) -> None:
        """A try sent at ``sent`` (monotonic) failed: the outage began then, or earlier."""
        since = self.since
        if since is None or sent < since:
            self.since = sent

    def answered(self) -> None:
        self.since = None

    def deadline(self, sent: float) -> float:
        """When a call whose first failed try (or, before any, whose try) was sent at ``sent``
        must give up: ``timeout`` after the outage began."""
        since = self.since
        return (sent if since is None else min(since, sent)) + self.timeout


_clock: ContextVar[OutageClock | None] = ContextVar("kinesumer_outage_clock", default=None)


def current_outage_clock() -> OutageClock | None:
    """The clock bounding calls made in this context, if any (:func:`outage_clock`)."""
    return _clock.get()


@contextlib.contextmanager
def outage_clock(clock: OutageClock) -> Iterator[OutageClock]:
    """Bound every call made in this context by ``clock`` (see :class:`OutageClock`).

    The context travels with the calls: into tasks created here, and onto another thread's
    loop through ``asyncio.run_coroutine_threadsafe`` (which runs the coroutine in a copy of
    the submitting thread's context)."""
    token = _clock.set(clock)
    try:
        yield clock
    finally:
        _clock.reset(token)


class _StopWhen(stop_base):
    """A tenacity stop condition from a predicate on the retry state."""

    def __init__(self, predicate: Callable[[RetryCallState], bool]) -> None:
        self._predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._predicate(retry_state)


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

    After ``attempts`` tries, or once the tries ran for :func:`retry_window` since the first
    failed one was sent (a hung try is cut then), or once the :class:`OutageClock` set around
    the call says the outage is over its budget, the last error is raised as
    :class:`TransientAWSError`; anything not transient is raised at once, unchanged.
    """
    clock = _clock.get()
    window = retry_window(attempts, initial, maximum)
    floor = MIN_TRY if clock is None else min(MIN_TRY, clock.timeout)
    first_failed: float | None = None  # monotonic send of this call's first failed try
    tries = 0

    def deadline(sent: float) -> float | None:
        """When a try sent at ``sent`` must be answered. The window counts from a failure
        only: a call's first try keeps its read timeout (a member's DynamoDB one is its
        ``client_timeout``), unless an outage clock allows less."""
        if first_failed is None:
            return None if clock is None else clock.deadline(sent)
        ends = first_failed + window
        return ends if clock is None else min(ends, clock.deadline(first_failed))

    def out_of_time(state: RetryCallState) -> bool:
        # Checked before each pause: no point sleeping into a deadline and trying with no time.
        ends = None if first_failed is None else deadline(first_failed)
        return ends is not None and time.monotonic() + (state.upcoming_sleep or 0.0) >= ends

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
        stop=stop_after_attempt(attempts) | _StopWhen(out_of_time),
        wait=wait_exponential_jitter(multiplier=initial, max=maximum),
        before_sleep=before_sleep,
        reraise=True,
    )

    async def attempt() -> T:
        # tenacity runs a plain callable without awaiting what it returns: give it a coroutine
        # function.
        nonlocal first_failed, tries
        tries += 1
        sent = time.monotonic()
        ends = deadline(sent)
        bound = None if ends is None else max(floor, ends - sent)
        try:
            result = await await_within(call(), bound)
        except BaseException as exc:
            if not is_transient(exc):
                raise
            if first_failed is None:
                first_failed = sent
            if clock is not None:
                clock.failed(sent)
            ours = bound is not None and time.monotonic() - sent >= bound
            if ours and isinstance(exc, asyncio.TimeoutError):  # our cut, not botocore's
                raise asyncio.TimeoutError(f"no answer within {bound:.1f} s") from exc
            raise
        if clock is not None:
            clock.answered()
        return result

    try:
        return await retrying(attempt)
    except Exception as exc:
        if is_transient(exc):
            raise TransientAWSError(
                f"{operation} kept failing after {tries} attempt{'s' * (tries != 1)}: "
                f"{error_code(exc)}: {exc}"
            ) from exc
        raise
