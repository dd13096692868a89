"""The one place kinesumer builds AWS clients: DynamoDB (async for the engine and the command
line, blocking boto3 for the heartbeat thread and table creation), Kinesis (async, through a
cross-account role when ``Config.role_arn`` is set), and the sessions behind them.

Every client made here has botocore's retries off (one attempt: :mod:`.retry` is the only retry
policy) unless a caller asks for attempts, and parses timestamps with a fast path for the epoch
numbers Kinesis returns. DynamoDB always uses the caller's own credentials: the state table stays
in the caller's account even when Kinesis is read in another.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from typing import Any

import aioboto3
import boto3
import botocore.session
from aiobotocore.credentials import AioDeferredRefreshableCredentials
from aiobotocore.session import AioSession
from botocore.config import Config as BotoConfig
from botocore.credentials import DeferredRefreshableCredentials
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    MetadataRetrievalError,
    NoRegionError,
)
from botocore.parsers import ResponseParserError
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from ..accounts import role_account
from ..config import Config
from ..errors import AccountAccessError, ConfigError, KinesumerError, TransientAWSError
from .accounting import RequestStats, instrument
from .retry import CALL_TIMEOUT, MalformedAnswer, call_with_retry, error_code, is_transient

log = logging.getLogger("kinesumer.aws")


def boto_config(read_timeout: float = CALL_TIMEOUT) -> BotoConfig:
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


#: The region variable most AWS SDKs and runtimes (Lambda, ECS, the Java and JavaScript SDKs)
#: set and read. botocore reads only ``AWS_DEFAULT_REGION`` and the profile's: a session whose
#: chain finds no region takes this one.
REGION_ENV = "AWS_REGION"


def region_of(session: botocore.session.Session) -> str | None:
    """The region a client of ``session`` made without one uses: botocore's chain (read now:
    the environment may have changed since the session was made), else :data:`REGION_ENV`."""
    try:
        region: str | None = session.get_config_variable("region")
    except BotoCoreError:  # a profile that does not exist: creating a client says so
        return None
    return region or os.environ.get(REGION_ENV, "").strip() or None


def with_region_env(session: botocore.session.Session) -> botocore.session.Session:
    """A new ``session``, with the region of :data:`REGION_ENV` where botocore's chain has
    none."""
    region = region_of(session)
    if region is not None:
        session.set_config_variable("region", region)
    return session


def default_region() -> str | None:
    """The region a client made without one would use: botocore's chain, then
    :data:`REGION_ENV`."""
    return region_of(botocore.session.Session())


@contextlib.contextmanager
def region_required(service: str, field: str) -> Iterator[None]:
    """Turns botocore's bare ``NoRegionError`` (raised as a client is made) into a
    :class:`~kinesumer.errors.ConfigError` that says where a region comes from."""
    try:
        yield
    except NoRegionError as exc:
        raise ConfigError(
            field,
            f"no AWS region for {service}: set Config({field}=...) (or region), or "
            f"{REGION_ENV} or AWS_DEFAULT_REGION, or a region in the AWS profile",
        ) from exc


def moto_loaded() -> bool:
    """Whether moto's mock (``mock_aws``) is imported in this process: checked without importing
    moto, which is not a dependency of the library."""
    return "moto.core.models" in sys.modules


#: The first session's botocore data loader, shared by every later one: a loader caches the
#: service models and endpoint rules it read, and a fresh one per session re-reads and re-parses
#: them (about 30 ms of CPU per client: the bulk of a Producer's start).
_data_loader: Any = None
_data_loader_lock = threading.Lock()


def _share_data_loader(session: AioSession) -> None:
    global _data_loader
    with _data_loader_lock:
        if _data_loader is None:
            _data_loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _data_loader)


def botocore_session() -> AioSession:
    """A fresh aiobotocore session whose responses parse timestamps with :func:`parse_timestamp`.

    With moto's mock loaded, its in-process answers are made awaitable for aiobotocore
    (:mod:`.moto_adapter`, imported only then); without, nothing changes."""
    session = AioSession()
    with_region_env(session)
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp
    )
    _share_data_loader(session)
    if moto_loaded():
        from .moto_adapter import adapt_session

        adapt_session(session)
    return session


#: One boto3 session for every blocking client of the process, so service models are loaded once
#: (a new session per client re-reads them: about 0.1-0.2 s before a member's first heartbeat).
#: boto3 sessions are not safe for concurrent client creation: the lock serialises it; the clients
#: themselves are thread-safe.
_blocking_botocore: botocore.session.Session | None = None
_blocking_session: boto3.session.Session | None = None
_blocking_lock = threading.Lock()


def blocking_client(service: str, **options: Any) -> Any:
    """A blocking boto3 client of ``service`` from the process's shared session."""
    global _blocking_botocore, _blocking_session
    with _blocking_lock:
        if _blocking_botocore is None or _blocking_session is None:
            _blocking_botocore = botocore.session.Session()
            _blocking_session = boto3.session.Session(botocore_session=_blocking_botocore)
        if options.get("region_name") is None:
            options["region_name"] = region_of(_blocking_botocore)
        return _blocking_session.client(service, **options)


#: What STS accepts in a RoleSessionName: 2-64 of these.
_SESSION_NAME_CHARS = re.compile(r"[^\w+=,.@-]", re.ASCII)


def role_session_name(config: Config, client_id: str | None = None) -> str:
    """The RoleSessionName of this process's ``sts:AssumeRole`` calls: the member's client id,
    so CloudTrail's ``assumed-role/<role>/<session>`` names which member made each Kinesis call.

    Without a member (the command line, a Spark executor): ``config.client_id``, else the app,
    host and process id. Characters STS refuses become ``-``; a name over 64 characters keeps
    its first 55 and a digest of the whole (two long ids that share a prefix stay apart).
    """
    name = client_id or config.client_id or f"{config.app}-{socket.gethostname()}-{os.getpid()}"
    name = _SESSION_NAME_CHARS.sub("-", name)
    if len(name) > 64:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[:55]}-{digest}"
    return name if len(name) >= 2 else f"kinesumer-{name}"


def session_for(config: Config) -> aioboto3.Session:
    """A session with the caller's own credentials (boto3's default chain)."""
    return aioboto3.Session(botocore_session=botocore_session(), region_name=config.region)


def assumed_role_session(
    config: Config,
    stats: RequestStats,
    client_id: str | None = None,
    role: tuple[str, str | None] | None = None,
) -> aioboto3.Session:
    """A session whose credentials come from ``sts:AssumeRole`` on ``config.role_arn`` and are
    renewed by botocore before they expire (it refreshes 15 minutes ahead, and insists at 10).

    The STS call itself uses the caller's own credentials (the default chain), the same ones
    DynamoDB uses: the state table stays in the caller's account. The session is named after
    the member (:func:`role_session_name`). ``role``: (role ARN, external id) to assume
    instead of ``config``'s (an account of ``Config.accounts``).
    """
    role_arn, external_id = role or (config.role_arn, config.external_id)
    assert role_arn is not None
    base = session_for(config)
    session_name = role_session_name(config, client_id)

    async def fetch() -> dict[str, Any]:
        kwargs: dict[str, Any] = {"RoleArn": role_arn, "RoleSessionName": session_name}
        if external_id:
            kwargs["ExternalId"] = external_id
        region = config.effective_kinesis_region
        try:
            async with base.client(
                "sts", region_name=region, endpoint_url=config.sts_endpoint, config=boto_config()
            ) as sts:
                with not_sts_answer():
                    response = await call_with_retry(
                        "sts.AssumeRole", lambda: sts.assume_role(**kwargs), stats
                    )
            creds = answered_credentials(response)
        except (
            ClientError,
            BotoCoreError,
            TransientAWSError,
            ResponseParserError,
            MalformedAnswer,
        ) as exc:
            # botocore calls this at the first signing and before expiry (a mandatory refresh
            # raises what it raises into the Kinesis call being signed): name the role here,
            # or a role refused mid-run reads as a Kinesis permission missing.
            raise role_not_assumed(config, role_arn, exc) from exc
        expiry = creds["Expiration"]
        if isinstance(expiry, datetime):
            expiry = expiry.astimezone(timezone.utc).isoformat()
        log.info("assumed role %s (credentials valid until %s)", role_arn, expiry)
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": expiry,
        }

    role_session = botocore_session()
    role_session._credentials = AioDeferredRefreshableCredentials(
        refresh_using=fetch, method="sts-assume-role"
    )
    return aioboto3.Session(botocore_session=role_session, region_name=config.region)


def blocking_role_session(config: Config, client_id: str | None = None) -> boto3.session.Session:
    """The blocking twin of :func:`assumed_role_session`: a boto3 session whose credentials come
    from ``sts:AssumeRole`` on ``config.role_arn``, fetched when first needed and renewed by
    botocore before they expire. The STS call uses the caller's own credentials."""
    role_arn = config.role_arn
    assert role_arn is not None
    session_name = role_session_name(config, client_id)
    sts = blocking_client(
        "sts", region_name=config.effective_kinesis_region, endpoint_url=config.sts_endpoint
    )

    def fetch() -> dict[str, Any]:
        kwargs: dict[str, Any] = {"RoleArn": role_arn, "RoleSessionName": session_name}
        if config.external_id:
            kwargs["ExternalId"] = config.external_id
        try:
            with not_sts_answer():
                response = sts.assume_role(**kwargs)
            creds = answered_credentials(response)
        except (ClientError, BotoCoreError, ResponseParserError, MalformedAnswer) as exc:
            if isinstance(exc, (ClientError, BotoCoreError)) and is_transient(exc):
                raise  # its caller's retries handle STS trouble as they handle Kinesis's
            raise role_not_assumed(config, role_arn, exc) from exc
        expiry = creds["Expiration"]
        if isinstance(expiry, datetime):
            expiry = expiry.astimezone(timezone.utc).isoformat()
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": expiry,
        }

    role_session = with_region_env(botocore.session.Session())
    role_session._credentials = DeferredRefreshableCredentials(
        refresh_using=fetch, method="sts-assume-role"
    )
    return boto3.session.Session(botocore_session=role_session, region_name=config.region)


class ClientFactory:
    """Every AWS client kinesumer makes for one :class:`~kinesumer.Config`.

    With ``stats``, each client is instrumented (:func:`~.accounting.instrument`): its requests
    are counted there. The async clients are async context managers (closed on exit); the
    blocking ones are plain boto3 clients (nothing to close). ``client_id``: the member the
    clients work for, which names the role session (:func:`role_session_name`).
    """

    def __init__(
        self, config: Config, stats: RequestStats | None = None, client_id: str | None = None
    ) -> None:
        self.config = config
        self.stats = stats
        self.client_id = client_id

    @contextlib.asynccontextmanager
    async def dynamodb(self, *, read_timeout: float = CALL_TIMEOUT) -> AsyncIterator[Any]:
        """An aiobotocore DynamoDB client on the state table's region and endpoint."""
        config = self.config
        async with contextlib.AsyncExitStack() as stack:
            with region_required("DynamoDB", "dynamodb_region"):  # making the client only
                client = await stack.enter_async_context(
                    session_for(config).client(
                        "dynamodb",
                        region_name=config.effective_dynamodb_region,
                        endpoint_url=config.dynamodb_endpoint,
                        config=boto_config(read_timeout=read_timeout),
                    )
                )
            yield self._instrumented(client)

    @contextlib.asynccontextmanager
    async def kinesis(self) -> AsyncIterator[Any]:
        """An aiobotocore Kinesis client; through ``config.role_arn`` (STS, self-refreshing
        credentials) when it is set."""
        config = self.config
        if config.role_arn:
            session = assumed_role_session(
                config, self.stats if self.stats is not None else RequestStats(), self.client_id
            )
        else:
            session = session_for(config)
        async with contextlib.AsyncExitStack() as stack:
            with region_required("Kinesis", "kinesis_region"):  # making the client only
                client = await stack.enter_async_context(
                    session.client(
                        "kinesis",
                        region_name=config.effective_kinesis_region,
                        endpoint_url=config.kinesis_endpoint,
                        config=boto_config(),
                    )
                )
            yield self._instrumented(client)

    def account_session(self, role: tuple[str, str | None] | None) -> aioboto3.Session:
        """A session for the Kinesis streams of one account: through ``role`` (role ARN,
        external id; assumed with the caller's credentials, renewed before expiry), or with the
        caller's own credentials (None)."""
        if role is None:
            return session_for(self.config)
        stats = self.stats if self.stats is not None else RequestStats()
        return assumed_role_session(self.config, stats, self.client_id, role)

    @contextlib.asynccontextmanager
    async def regional_kinesis(self, session: aioboto3.Session, region: str) -> AsyncIterator[Any]:
        """An aiobotocore Kinesis client of ``session`` signed for ``region``, at that region's
        endpoint (:meth:`~kinesumer.Config.kinesis_endpoint_of`)."""
        async with session.client(
            "kinesis",
            region_name=region,
            endpoint_url=self.config.kinesis_endpoint_of(region),
            config=boto_config(),
        ) as client:
            yield self._instrumented(client)

    async def caller_account(self) -> str:
        """The account of the caller's own credentials (STS GetCallerIdentity, through
        ``config.sts_endpoint`` when set)."""
        config = self.config
        stats = self.stats if self.stats is not None else RequestStats()
        async with session_for(config).client(
            "sts",
            region_name=config.effective_kinesis_region or config.effective_dynamodb_region,
            endpoint_url=config.sts_endpoint,
            config=boto_config(),
        ) as sts:
            answer = await call_with_retry(
                "sts.GetCallerIdentity", lambda: sts.get_caller_identity(), stats
            )
        return str(answer["Account"])

    @contextlib.asynccontextmanager
    async def dynamodb_streams(self, region: str) -> AsyncIterator[Any]:
        """An aiobotocore DynamoDB Streams client of ``region`` (a stream ARN's), at
        ``config.effective_dynamodb_streams_endpoint``. The member's own credentials, as its
        DynamoDB client's: ``role_arn`` is for Kinesis."""
        async with session_for(self.config).client(
            "dynamodbstreams",
            region_name=region,
            endpoint_url=self.config.effective_dynamodb_streams_endpoint,
            config=boto_config(),
        ) as client:
            yield self._instrumented(client)

    def sync_dynamodb(self, *, attempts: int | None = None, timeout: float | None = None) -> Any:
        """A blocking boto3 DynamoDB client, for threads without an event loop (the heartbeat)
        and one-off calls (table creation). ``attempts``/``timeout``: botocore's own retries
        and connect/read timeouts; None keeps botocore's defaults."""
        options: dict[str, Any] = {}
        if attempts is not None:
            options["retries"] = {"total_max_attempts": attempts, "mode": "standard"}
        if timeout is not None:
            options.update(connect_timeout=timeout, read_timeout=timeout)
        config = self.config
        with region_required("DynamoDB", "dynamodb_region"):
            client = blocking_client(
                "dynamodb",
                region_name=config.effective_dynamodb_region,
                endpoint_url=config.dynamodb_endpoint,
                config=BotoConfig(**options) if options else None,
            )
        return self._instrumented(client)

    def sync_kinesis(self, *, attempts: int | None = None) -> Any:
        """A blocking boto3 Kinesis client (local tools: the demo's producer; dead-letter writes
        from handler threads; the engine reads through :meth:`kinesis`). Through
        ``config.role_arn`` when it is set, as the engine's reads: a dead-letter or retry-later
        stream lives beside the streams read, and the group consumes the retry stream again.
        ``attempts``: botocore's own retries; None keeps botocore's defaults."""
        config = self.config
        retries = {"total_max_attempts": attempts, "mode": "standard"} if attempts else None
        options: dict[str, Any] = {
            "region_name": config.effective_kinesis_region,
            "endpoint_url": config.kinesis_endpoint,
            "config": BotoConfig(retries=retries) if retries else None,
        }
        with region_required("Kinesis", "kinesis_region"):
            if config.role_arn:
                client = blocking_role_session(config, self.client_id).client("kinesis", **options)
            else:
                client = blocking_client("kinesis", **options)
        return self._instrumented(client)

    def _instrumented(self, client: Any) -> Any:
        return instrument(client, self.stats) if self.stats is not None else client


@contextlib.contextmanager
def not_sts_answer() -> Iterator[None]:
    """botocore's XML parser raises a bare KeyError for well-formed XML that is not the
    operation's answer (an XHTML page of a proxy, with HTTP 200): that is
    :class:`~.retry.MalformedAnswer`, as an answer it cannot parse at all is."""
    try:
        yield
    except KeyError as exc:
        raise MalformedAnswer(f"sts:AssumeRole answered what is not STS's (no {exc})") from exc


def answered_credentials(response: Any) -> dict[str, Any]:
    """The ``Credentials`` of an AssumeRole answer; an answer without them (HTTP 200 from
    something that is not STS, parsed into nothing) is :class:`~.retry.MalformedAnswer`."""
    creds = response.get("Credentials") if isinstance(response, dict) else None
    keys = ("AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration")
    if not isinstance(creds, dict) or not all(key in creds for key in keys):
        raise MalformedAnswer("sts:AssumeRole answered without credentials")
    return creds


#: STS's codes for the *caller's own* credentials refused (not the role): a key deleted or
#: mistyped, a session token expired (refreshing credentials are renewed before they expire,
#: so this is a static token that will not heal), a signature made with a wrong secret or a
#: skewed clock. Permanent: trying again signs with the same credentials.
_CALLER_REFUSED_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "ExpiredToken",
        "ExpiredTokenException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidSignatureException",
    }
)

#: Failures of the caller's own credential source (the ECS container endpoint, the instance
#: metadata service: botocore has already retried them) and answers that are not STS's (a proxy's
#: HTML page with HTTP 200): no verdict on the role, and they heal.
_TRANSIENT_ASSUME_ERRORS = (
    TransientAWSError,
    CredentialRetrievalError,
    MetadataRetrievalError,
    ResponseParserError,
    MalformedAnswer,
)


def assume_failed_for_now(exc: BaseException) -> bool:
    """Whether a failed ``sts:AssumeRole`` is worth trying again: STS throttled, failing
    (5xx) or unreachable, the caller's own credential source failing for a moment, or an answer
    that was not STS's. Everything else is permanent: the role refused (AccessDenied: its trust
    policy, a deleted role, a wrong external id), the caller's own credentials refused
    (:data:`_CALLER_REFUSED_CODES`) or absent (NoCredentialsError, an SSO session expired),
    STS not enabled in the region (RegionDisabledException), any other 4xx."""
    return isinstance(exc, _TRANSIENT_ASSUME_ERRORS) or is_transient(exc)


def role_not_assumed(
    config: Config, role_arn: str, exc: BaseException
) -> AccountAccessError | TransientAWSError:
    """What a failed ``sts:AssumeRole`` of ``role_arn`` (at the first fetch or at a renewal of
    its credentials) is to the member: :class:`~kinesumer.errors.TransientAWSError` when it is
    worth trying again (:func:`assume_failed_for_now`: readers pause and try again), else
    :class:`~kinesumer.errors.AccountAccessError` naming the account, the role and the
    action."""
    account = role_account(role_arn)
    access = (config.accounts or {}).get(account)
    where = (
        f"Config.accounts[{account!r}]"
        if access is not None and access.role_arn == role_arn
        else "Config.role_arn"
    )
    return assume_failure(account, role_arn, where, exc)


def assume_failure(
    account: str, role_arn: str, where: str, exc: BaseException
) -> AccountAccessError | TransientAWSError:
    """:func:`role_not_assumed`'s verdict, ``where`` naming the setting that gave the role."""
    if assume_failed_for_now(exc):
        if isinstance(exc, (CredentialRetrievalError, MetadataRetrievalError)):
            why = f"this caller's own credentials could not be fetched ({exc})"
        elif isinstance(exc, (ResponseParserError, MalformedAnswer)):
            why = f"the answer was not STS's (a proxy's page?: {exc})"
        else:
            why = f"STS kept failing ({exc})"
        return TransientAWSError(
            f"could not assume {role_arn} for account {account} yet: {why}; the role itself "
            f"was not refused"
        )
    if isinstance(exc, ClientError) and error_code(exc) in _CALLER_REFUSED_CODES:
        fix = (
            "this caller's own credentials were refused, not the role: renew or fix them "
            "(AWS_PROFILE, the access key, its session token, the clock)"
        )
    else:
        fix = (
            f"check {where} and the role's trust policy (it must trust this caller, with the "
            f"external id if it asks one)"
        )
    return AccountAccessError(
        f"cannot read the Kinesis streams of account {account}: sts:AssumeRole on {role_arn} "
        f"failed ({exc}); {fix}",
        account=account,
        role_arn=role_arn,
        action="sts:AssumeRole",
    )


async def assume_now(session: aioboto3.Session, account: str, role_arn: str) -> None:
    """Fetch ``session``'s role credentials now: a role that cannot be assumed is an
    :class:`~kinesumer.errors.AccountAccessError` naming the account, the role and the action
    at subscribe, not a Kinesis call failing later under another name."""
    try:
        credentials = await session.get_credentials()
        await credentials.get_frozen_credentials()
    except AccountAccessError:
        raise  # named by the session's own fetch (role_not_assumed)
    except (ClientError, BotoCoreError, KinesumerError, ResponseParserError) as exc:
        if isinstance(exc, TransientAWSError):
            raise  # named by the session's own fetch (role_not_assumed)
        raise assume_failure(account, role_arn, f"Config.accounts[{account!r}]", exc) from exc


class AwsClients:
    """The two low-level aiobotocore clients an engine uses, opened and closed together."""

    def __init__(self, config: Config, stats: RequestStats, client_id: str | None = None) -> None:
        self._config = config
        self._factory = ClientFactory(config, stats, client_id)
        self._stack = contextlib.AsyncExitStack()
        self.dynamodb: Any = None
        self.kinesis: Any = None
        self._streams: dict[str, Any] = {}
        self._streams_lock = asyncio.Lock()
        self._sessions: dict[str, aioboto3.Session] = {}
        self._regional: dict[tuple[str, str], Any] = {}
        self._regional_lock = asyncio.Lock()
        self._caller: str | None = None

    async def caller_account(self) -> str:
        """The account of the caller's own credentials (STS GetCallerIdentity, asked once for
        these clients: a Spark executor's places, made per task, ask it of them)."""
        if self._caller is None:
            self._caller = await self._factory.caller_account()
        return self._caller

    async def open(self, *, dynamodb: bool = True, kinesis: bool = True) -> None:
        """Open the clients asked for (a member given its state or its Kinesis opens neither)."""
        # A DynamoDB call hanging longer than a member's timeout is as good as failed: give up on
        # it early and retry, rather than wait out a long socket timeout.
        read_timeout = max(1.0, self._config.client_timeout)
        if dynamodb:
            self.dynamodb = await self._stack.enter_async_context(
                self._factory.dynamodb(read_timeout=read_timeout)
            )
        if kinesis:
            self.kinesis = await self._stack.enter_async_context(self._factory.kinesis())

    async def dynamodb_streams(self, region: str) -> Any:
        """The DynamoDB Streams client of ``region``, opened at its first use (a member reading
        no table's stream opens none) and closed with the others."""
        client = self._streams.get(region)
        if client is not None:
            return client
        async with self._streams_lock:
            if region not in self._streams:
                self._streams[region] = await self._stack.enter_async_context(
                    self._factory.dynamodb_streams(region)
                )
            return self._streams[region]

    async def regional_kinesis(
        self, account: str, region: str, role: tuple[str, str | None] | None
    ) -> Any:
        """The Kinesis client of ``account``'s streams in ``region``, opened at its first use
        (a member reading one account and region opens one) and closed with the others. One
        session per account (``role``: assumed, else the caller's own credentials): its
        credentials are fetched, and renewed, once for all the account's regions."""
        client = self._regional.get((account, region))
        if client is not None:
            return client
        async with self._regional_lock:
            if (account, region) not in self._regional:
                session = await self._account_session(account, role)
                self._regional[(account, region)] = await self._stack.enter_async_context(
                    self._factory.regional_kinesis(session, region)
                )
            return self._regional[(account, region)]

    async def account_session(
        self, account: str, role: tuple[str, str | None] | None
    ) -> aioboto3.Session:
        """The session of ``account``'s streams (the one its regional clients use: enhanced
        fan-out signs its subscriptions with the same credentials), made at first use."""
        async with self._regional_lock:
            return await self._account_session(account, role)

    async def _account_session(
        self, account: str, role: tuple[str, str | None] | None
    ) -> aioboto3.Session:
        session = self._sessions.get(account)
        if session is None:
            session = self._factory.account_session(role)
            if role is not None:
                await assume_now(session, account, role[0])
            self._sessions[account] = session
        return session

    async def close(self) -> None:
        self._regional.clear()
        self._sessions.clear()
        self._streams.clear()
        await self._stack.aclose()
