"""AWS plumbing shared by the state store and the Kinesis reader: clients, credentials for a
cross-account role, error classification and the retry policy.

botocore's own retries are switched off (one attempt per call) so that there is one retry policy,
ours: tenacity, exponential backoff with full jitter, every retry logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

import aioboto3
from aiobotocore.credentials import AioDeferredRefreshableCredentials
from aiobotocore.session import AioSession
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.utils import parse_timestamp as botocore_parse_timestamp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from ..config import Config
from ..errors import AccessDeniedError, TransientAWSError
from ..metrics import Metrics

log = logging.getLogger("kinesumer.aws")
T = TypeVar("T")

_THROTTLE_CODES = frozenset(
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
    {"InternalServerError", "InternalFailure", "ServiceUnavailable", "InternalFailureException"}
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


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def is_throttle(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) in _THROTTLE_CODES


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: throttling, server-side failures, network trouble, timeouts."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in _THROTTLE_CODES or code in _SERVER_CODES or int(status or 0) >= 500
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


class RetryStats:
    """What an engine's AWS clients did, shared across the engine and readable through
    ``consumer.stats()``: retried errors by (operation, error code), every request by
    ``service:Operation`` (each attempt: the engine's clients do not retry inside botocore; the
    heartbeat thread's client makes one quick retry of its own, counted with its call),
    throttled requests, DynamoDB capacity consumed. Also forwards each
    request to the engine's :class:`~kinesumer._metrics.Metrics`."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.retries: Counter[tuple[str, str]] = Counter()
        self.last_error: BaseException | None = None
        self.requests: Counter[str] = Counter()
        self.throttles: Counter[str] = Counter()
        self.capacity: dict[str, float] = {}  # DynamoDB capacity units by operation
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()  # the heartbeat thread's client reports here too

    def counts(self) -> dict[str, Any]:
        """Copies of the request, throttle and capacity counts (another thread adds to them)."""
        with self._lock:
            return {
                "requests": dict(self.requests),
                "throttles": dict(self.throttles),
                "dynamodb_capacity": dict(self.capacity),
            }

    def request(
        self, service: str, operation: str, seconds: float, error: str | None, capacity: float
    ) -> None:
        key = f"{service}:{operation}"
        with self._lock:
            self.requests[key] += 1
            if capacity:
                self.capacity[operation] = self.capacity.get(operation, 0.0) + capacity
            if error in _THROTTLE_CODES:
                self.throttles[key] += 1
        self.metrics.aws_call(service, operation, seconds, error, capacity)
        if error in _THROTTLE_CODES:
            self.metrics.throttled(service, operation)


#: DynamoDB operations that can report the capacity they consumed.
_CAPACITY_OPERATIONS = frozenset(
    {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem"}
    | {"BatchWriteItem", "TransactGetItems", "TransactWriteItems"}
)


def _consumed(parsed: dict[str, Any]) -> float:
    consumed = parsed.get("ConsumedCapacity")
    if isinstance(consumed, dict):
        consumed = [consumed]
    return float(sum(c.get("CapacityUnits", 0) or 0 for c in consumed or ()))


def instrument(client: Any, stats: RetryStats) -> Any:
    """Account every request ``client`` makes (boto3 or aiobotocore: the same events) in
    ``stats``: count, latency, error code and, for DynamoDB, the capacity it consumed (asked for
    with ``ReturnConsumedCapacity=TOTAL``, which costs nothing). Returns ``client``."""
    service = client.meta.service_model.service_id.hyphenize()  # "dynamodb", "kinesis", "sts"
    events = client.meta.events
    key = "kinesumer_call"

    def before_parameter_build(params: dict[str, Any], model: Any, context: Any, **_: Any) -> None:
        if service == "dynamodb" and model.name in _CAPACITY_OPERATIONS:
            params.setdefault("ReturnConsumedCapacity", "TOTAL")
        context[key] = (model.name, time.perf_counter())

    def after_call(http_response: Any, parsed: Any, context: Any, **_: Any) -> None:
        operation, started = context.get(key, ("unknown", time.perf_counter()))
        failed = http_response.status_code >= 300
        error = str(parsed.get("Error", {}).get("Code", "") or "HTTP") if failed else None
        seconds = time.perf_counter() - started
        stats.request(service, operation, seconds, error, _consumed(parsed))

    def after_call_error(exception: BaseException, context: Any, **_: Any) -> None:
        operation, started = context.get(key, ("unknown", time.perf_counter()))
        seconds = time.perf_counter() - started
        stats.request(service, operation, seconds, type(exception).__name__, 0.0)

    events.register(f"before-parameter-build.{service}", before_parameter_build)
    events.register(f"after-call.{service}", after_call)
    events.register(f"after-call-error.{service}", after_call_error)
    return client


async def call_with_retry(
    operation: str,
    call: Callable[[], Awaitable[T]],
    stats: RetryStats,
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


def boto_config(read_timeout: float = 10.0) -> BotoConfig:
    return BotoConfig(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=read_timeout,
        max_pool_connections=64,
    )


def parse_timestamp(value: Any) -> datetime:
    """botocore's timestamp parser, with a fast path for the epoch numbers Kinesis returns.

    botocore turns every ``ApproximateArrivalTimestamp`` into a datetime in dateutil's
    ``tzlocal()``, which costs more CPU than the rest of parsing a record put together. Epoch
    numbers become UTC datetimes here: the same instants, several times cheaper.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, timezone.utc)
        except (OverflowError, OSError, ValueError):
            pass
    parsed: datetime = botocore_parse_timestamp(value)
    return parsed


def _botocore_session() -> AioSession:
    session = AioSession()
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp
    )
    return session


def session_for(config: Config) -> aioboto3.Session:
    return aioboto3.Session(botocore_session=_botocore_session(), region_name=config.region)


def assumed_role_session(config: Config, stats: RetryStats) -> aioboto3.Session:
    """A session whose credentials come from ``sts:AssumeRole`` on ``config.role_arn`` and are
    renewed by botocore before they expire (it refreshes 15 minutes ahead, and insists at 10).

    The STS call itself uses the caller's own credentials (the default chain), the same ones
    DynamoDB uses: the state table stays in the caller's account.
    """
    assert config.role_arn is not None
    base = session_for(config)
    session_name = f"kinesumer-{config.app}"[:64]

    async def fetch() -> dict[str, Any]:
        kwargs: dict[str, Any] = {"RoleArn": config.role_arn, "RoleSessionName": session_name}
        if config.external_id:
            kwargs["ExternalId"] = config.external_id
        region = config.effective_kinesis_region
        async with base.client(
            "sts", region_name=region, endpoint_url=config.sts_endpoint, config=boto_config()
        ) as sts:
            response = await call_with_retry(
                "sts.AssumeRole", lambda: sts.assume_role(**kwargs), stats
            )
        creds = response["Credentials"]
        expiry = creds["Expiration"]
        if isinstance(expiry, datetime):
            expiry = expiry.astimezone(timezone.utc).isoformat()
        log.info("assumed role %s (credentials valid until %s)", config.role_arn, expiry)
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": expiry,
        }

    botocore_session = _botocore_session()
    botocore_session._credentials = AioDeferredRefreshableCredentials(
        refresh_using=fetch, method="sts-assume-role"
    )
    return aioboto3.Session(botocore_session=botocore_session, region_name=config.region)


class AwsClients:
    """The two low-level aiobotocore clients an engine uses, opened and closed together."""

    def __init__(self, config: Config, stats: RetryStats) -> None:
        self._config = config
        self._stats = stats
        self._stack = contextlib.AsyncExitStack()
        self.dynamodb: Any = None
        self.kinesis: Any = None

    async def open(self) -> None:
        config = self._config
        caller = session_for(config)
        kinesis_session = assumed_role_session(config, self._stats) if config.role_arn else caller
        # A DynamoDB call hanging longer than a member's timeout is as good as failed: give up on
        # it early and retry, rather than wait out a long socket timeout.
        self.dynamodb = instrument(
            await self._stack.enter_async_context(
                caller.client(
                    "dynamodb",
                    region_name=config.effective_dynamodb_region,
                    endpoint_url=config.dynamodb_endpoint,
                    config=boto_config(read_timeout=max(1.0, config.client_timeout)),
                )
            ),
            self._stats,
        )
        self.kinesis = instrument(
            await self._stack.enter_async_context(
                kinesis_session.client(
                    "kinesis",
                    region_name=config.effective_kinesis_region,
                    endpoint_url=config.kinesis_endpoint,
                    config=boto_config(),
                )
            ),
            self._stats,
        )

    async def close(self) -> None:
        await self._stack.aclose()
