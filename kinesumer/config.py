"""Config: every setting of a consumer, validated when it is built."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, Union
from urllib.parse import urlsplit

from .accounts import AccountAccess, check_accounts
from .errors import ConfigError, EnhancedFanOutNotInstalledError
from .stream_refs import check_stream, is_dynamodb_stream, parse_stream

InitialPosition = Union[Literal["LATEST", "TRIM_HORIZON"], datetime]  # noqa: UP007 (runtime alias, py3.10)

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TABLE = re.compile(r"^[A-Za-z0-9_.\-]{3,255}$")
_ROLE_ARN = re.compile(r"^arn:aws[a-zA-Z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_EXTERNAL_ID = re.compile(r"^[\w+=,.@:/-]{2,1224}$")
_CONSUMER = re.compile(r"^[a-zA-Z0-9_.\-]{1,128}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")

#: Every field naming a URL the library sends signed requests to.
ENDPOINT_FIELDS = (
    "kinesis_endpoint",
    "dynamodb_endpoint",
    "sts_endpoint",
    "dynamodb_streams_endpoint",
)

#: The service allows 5 GetRecords per second per shard: never poll faster.
MIN_SCAN_INTERVAL = 0.2


@dataclass(frozen=True)
class Config:
    """Settings of one consumer group member. Frozen; every field is checked on creation.

    Only ``app`` and ``dynamodb_table`` are required. Durations are seconds. The site's
    Configuration page (``docs/operating/configuration.md``) explains each default.
    """

    app: str
    dynamodb_table: str
    region: str | None = None
    kinesis_region: str | None = None
    dynamodb_region: str | None = None
    kinesis_endpoint: str | None = None
    dynamodb_endpoint: str | None = None
    sts_endpoint: str | None = None
    client_id: str | None = None
    role_arn: str | None = None
    # Out of repr (logs, tracebacks, Spark partitions' descriptions): with the role, it is what
    # a confused deputy needs.
    external_id: str | None = field(default=None, repr=False)
    scan_limit: int = 10_000
    scan_interval: float = 0.2
    # The longest wait between two reads of an idle shard (reads that found nothing at the tip
    # back off from scan_interval, doubling, up to this). Lower: less delay for the first record
    # after a quiet spell, more GetRecords calls (5/s per shard, shared by every consumer of the
    # stream). The Spark source's option of the same name sets it too (one concept).
    idle_poll_interval: float = 1.0
    initial_position: InitialPosition = "LATEST"
    auto_commit: bool = True
    broadcast: bool = False
    broadcast_resume: bool = False
    heartbeat_interval: float = 1.0
    client_timeout: float = 3.0
    assignment: Literal["range", "sticky", "weighted"] = "range"
    shard_sync_interval: float = 30.0
    commit_interval: float = 5.0
    handoff_timeout: float = 5.0
    max_buffered_records: int = 20_000
    max_buffered_bytes: int = 64 * 1024 * 1024
    metrics: bool = False
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    enhanced_fan_out: bool = False
    consumer_name: str | None = None
    #: Enhanced fan-out: after this many stalls in a row on a shard (a subscription that gives
    #: no event for 10 s, refused or failing included), the member reads that shard by polling
    #: (GetRecords) from the same position for a minute, then subscribes again.
    efo_stall_limit: int = 2
    allow_insecure_endpoints: bool = False
    #: OpenTelemetry spans go here (the ``otel`` extra); None: the global tracer provider.
    #: Neither compared nor shown in repr.
    tracer_provider: Any = field(default=None, repr=False, compare=False)
    #: The engine's metrics go to this OpenTelemetry MeterProvider instead of Prometheus.
    meter_provider: Any = field(default=None, repr=False, compare=False)
    #: Where DynamoDB streams (stream ARNs given as streams) are read. None: at
    #: ``dynamodb_endpoint`` when it is set (moto and DynamoDB Local serve both there), else at
    #: AWS's DynamoDB Streams endpoint of the ARN's region. Last, so that every field before it
    #: keeps its position.
    dynamodb_streams_endpoint: str | None = None
    #: Kinesis streams of other accounts (given by ARN): account id -> the role read through.
    #: A stream of the config's own account (``role_arn``'s, else the caller's) needs none.
    #: Not hashed (a dict).
    accounts: Mapping[str, AccountAccess] | None = field(default=None, hash=False)
    #: Region -> the Kinesis endpoint of that region's streams (local stand-ins).
    #: ``kinesis_endpoint`` serves every region not listed (moto serves them all); None: AWS's.
    kinesis_endpoints: Mapping[str, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        _check_name("app", self.app, _NAME, "letters, digits, '_', '.', '-'")
        _check_name("dynamodb_table", self.dynamodb_table, _TABLE, "3-255 of [A-Za-z0-9_.-]")
        for name in ("region", "kinesis_region", "dynamodb_region"):
            value = getattr(self, name)
            if value is not None:
                _check_name(name, value, _REGION, "an AWS region such as 'eu-west-1'")
        if not isinstance(self.allow_insecure_endpoints, bool):
            raise ConfigError(
                "allow_insecure_endpoints",
                f"must be True or False, got {self.allow_insecure_endpoints!r}",
            )
        for name in ENDPOINT_FIELDS:
            _check_endpoint(name, getattr(self, name), self.allow_insecure_endpoints)
        check_accounts(self.accounts)
        _check_regional_endpoints(self.kinesis_endpoints, self.allow_insecure_endpoints)
        if self.client_id is not None:
            _check_name("client_id", self.client_id, _NAME, "letters, digits, '_', '.', '-'")
        if self.role_arn is not None:
            _check_name("role_arn", self.role_arn, _ROLE_ARN, "arn:aws:iam::<12 digits>:role/<n>")
        if self.external_id is not None:
            if self.role_arn is None:
                raise ConfigError("external_id", "is only used with role_arn; set role_arn too")
            _check_name(
                "external_id", self.external_id, _EXTERNAL_ID, "2-1224 characters", secret=True
            )
        _check_int("scan_limit", self.scan_limit, 1, 10_000)
        _check_int("efo_stall_limit", self.efo_stall_limit, 1, 1_000)
        _check_number("scan_interval", self.scan_interval, MIN_SCAN_INTERVAL)
        _check_number("idle_poll_interval", self.idle_poll_interval, MIN_SCAN_INTERVAL)
        _check_initial_position(self.initial_position)
        if not isinstance(self.auto_commit, bool):
            raise ConfigError("auto_commit", f"must be True or False, got {self.auto_commit!r}")
        _check_broadcast(self.broadcast, self.broadcast_resume, self.client_id)
        for name in ("heartbeat_interval", "shard_sync_interval", "commit_interval"):
            _check_number(name, getattr(self, name), 0.05)
        _check_number("handoff_timeout", self.handoff_timeout, 0.0)
        _check_number("client_timeout", self.client_timeout, 0.1)
        if self.client_timeout < 2 * self.heartbeat_interval:
            # A member fences itself 0.9 x client_timeout after its last landed heartbeat was
            # sent (group/heartbeat.py); at 2x the next heartbeat still has 0.8 x
            # heartbeat_interval to land, below that a little latency fences a healthy member.
            raise ConfigError(
                "client_timeout",
                f"must be at least twice heartbeat_interval ({self.heartbeat_interval}s), or one "
                f"late heartbeat fences a healthy member; got {self.client_timeout}s",
            )
        if self.assignment not in ("range", "sticky", "weighted"):
            raise ConfigError(
                "assignment", f"must be 'range', 'sticky' or 'weighted', got {self.assignment!r}"
            )
        _check_int("max_buffered_records", self.max_buffered_records, 1, 10**9)
        _check_int("max_buffered_bytes", self.max_buffered_bytes, 1024, 2**40)
        if not isinstance(self.metrics, bool):
            raise ConfigError("metrics", f"must be True or False, got {self.metrics!r}")
        if self.metrics_port is not None:
            _check_int("metrics_port", self.metrics_port, 1, 65535)
        if not isinstance(self.metrics_address, str) or not self.metrics_address:
            raise ConfigError(
                "metrics_address", f"must be an address to listen on, got {self.metrics_address!r}"
            )
        _check_enhanced_fan_out(self.enhanced_fan_out, self.consumer_name, self.broadcast)
        _check_otel(self.tracer_provider, self.meter_provider, self.metrics, self.metrics_port)

    @property
    def effective_consumer_name(self) -> str:
        """The registered stream consumer enhanced fan-out reads through: ``consumer_name``, or
        the app's name (every member of an app shares one consumer, and its 2 MB/s per shard)."""
        return self.consumer_name or self.app

    @property
    def effective_kinesis_region(self) -> str | None:
        return self.kinesis_region or self.region

    def kinesis_endpoint_of(self, region: str) -> str | None:
        """Where the Kinesis streams of ``region`` are read: ``kinesis_endpoints[region]``,
        else ``kinesis_endpoint`` (one stand-in for every region), else None (AWS's)."""
        return (self.kinesis_endpoints or {}).get(region) or self.kinesis_endpoint

    @property
    def effective_dynamodb_region(self) -> str | None:
        return self.dynamodb_region or self.region

    @property
    def effective_dynamodb_streams_endpoint(self) -> str | None:
        """Where DynamoDB streams are read: ``dynamodb_streams_endpoint``, else
        ``dynamodb_endpoint`` (a local stand-in serves both), else None (AWS's, by region)."""
        return self.dynamodb_streams_endpoint or self.dynamodb_endpoint

    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed (validated again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = set(changes) - set(values)
        if unknown:
            raise ConfigError(sorted(unknown)[0], "is not a Config field")
        values.update(changes)
        return Config(**values)


def _check_otel(tracer: Any, meter: Any, metrics: bool, port: int | None) -> None:
    if tracer is not None and not callable(getattr(tracer, "get_tracer", None)):
        raise ConfigError(
            "tracer_provider", f"must be an OpenTelemetry TracerProvider, got {tracer!r}"
        )
    if meter is not None and not callable(getattr(meter, "get_meter", None)):
        raise ConfigError(
            "meter_provider", f"must be an OpenTelemetry MeterProvider, got {meter!r}"
        )
    if meter is not None and (metrics or port is not None):
        raise ConfigError(
            "meter_provider",
            "sends the metrics through OpenTelemetry; drop metrics/metrics_port (Prometheus), "
            "or export to Prometheus from your MeterProvider",
        )


def check_streams(streams: Any, *, kinesis_arns: bool = False) -> tuple[str, ...]:
    """Validate the stream names given to ``consume()``/``refresh()``; sorted, without repeats.
    ``kinesis_arns``: Kinesis streams may be given by ARN (whatever reads them; not where a
    stream is to be created by its name)."""
    if isinstance(streams, str) or not hasattr(streams, "__iter__"):
        raise ConfigError("streams", f"must be a list of stream names, got {streams!r}")
    names = list(streams)
    if not names:
        raise ConfigError("streams", "must name at least one stream")
    for name in names:
        if kinesis_arns:
            parse_stream(name)
        else:
            check_stream(name)
    return tuple(sorted(set(names)))


def check_streams_for(config: Config, streams: tuple[str, ...]) -> None:
    """What ``config`` cannot do with the streams :func:`check_streams` accepted: a DynamoDB
    stream has no enhanced fan-out, and no AT_TIMESTAMP iterator. (A Kinesis stream given by
    ARN is read with enhanced fan-out in its own account and region.)"""
    tables = [name for name in streams if is_dynamodb_stream(name)]
    if not tables:
        return
    if config.enhanced_fan_out:
        raise ConfigError(
            "enhanced_fan_out",
            f"DynamoDB Streams has no enhanced fan-out ({tables[0]!r}): read it with "
            "enhanced_fan_out=False, or read it from another Config than the Kinesis streams",
        )
    if isinstance(config.initial_position, datetime):
        raise ConfigError(
            "initial_position",
            f"DynamoDB Streams has no AT_TIMESTAMP iterator ({tables[0]!r}): use "
            "'TRIM_HORIZON' (its 24 hours) or 'LATEST'",
        )


def _check_regional_endpoints(endpoints: Any, allow_insecure: bool) -> None:
    if endpoints is None:
        return
    if not isinstance(endpoints, dict):
        raise ConfigError(
            "kinesis_endpoints", f"must be a dict of region -> URL, got {endpoints!r}"
        )
    for region, url in endpoints.items():
        _check_name(
            "kinesis_endpoints", region, _REGION, "keyed by AWS regions such as 'eu-west-1'"
        )
        _check_endpoint("kinesis_endpoints", url, allow_insecure)


def _check_name(
    field: str, value: Any, pattern: re.Pattern[str], what: str, *, secret: bool = False
) -> None:
    """``value`` is a non-empty string matching ``pattern`` whole (``fullmatch``: ``$`` alone
    lets a trailing newline through, as an environment variable filled from a file has).
    ``secret``: the message does not show the value."""
    shown = " (the value is not shown)" if secret else f", got {value!r}"
    if not isinstance(value, str) or not value:
        raise ConfigError(field, f"must be a non-empty string{shown}")
    if not pattern.fullmatch(value):
        raise ConfigError(field, f"must be {what}{shown}")


def is_loopback_host(host: str) -> bool:
    """``localhost`` (and its subdomains, RFC 6761), or an address in 127.0.0.0/8 or ``::1``."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(field: str, value: Any, allow_insecure: bool) -> None:
    """:class:`Config`'s rule for an endpoint, for one outside it (the lag service's
    CloudWatch endpoint): raises :class:`~kinesumer.errors.ConfigError` naming ``field``."""
    _check_endpoint(field, value, allow_insecure)


def _check_endpoint(field: str, value: Any, allow_insecure: bool) -> None:
    """An endpoint is an https:// URL, or an http:// URL on this machine (a local stand-in):
    plain HTTP anywhere else exposes every request to the network, and an STS endpoint's
    answers are the assumed role's keys."""
    if value is None:
        return
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigError(field, f"must be an http:// or https:// URL, got {value!r}")
    try:
        host = urlsplit(value).hostname
    except ValueError:
        host = None
    if not host:
        raise ConfigError(field, f"must be a URL with a host, got {value!r}")
    if value.startswith("http://") and not allow_insecure and not is_loopback_host(host):
        raise ConfigError(
            field,
            f"{value!r} is plain HTTP to another machine: requests (and, for STS, the assumed "
            "role's keys) would cross the network unencrypted. Use https://, or set "
            "allow_insecure_endpoints=True if that network is trusted (e.g. a stand-in in a "
            "container next to the tests)",
        )


def _check_int(field: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(field, f"must be between {low} and {high}, got {value}")


def _check_number(field: str, value: Any, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, f"must be a number of seconds, got {value!r}")
    if value != value or value < low or value == float("inf"):
        raise ConfigError(field, f"must be a finite number of seconds >= {low}, got {value}")


def _check_broadcast(broadcast: Any, resume: Any, client_id: str | None) -> None:
    """Broadcast mode: every member reads every shard. Resuming saves this member's own
    positions under its client id, so the id must be the same at every start."""
    for name, value in (("broadcast", broadcast), ("broadcast_resume", resume)):
        if not isinstance(value, bool):
            raise ConfigError(name, f"must be True or False, got {value!r}")
    if resume and not broadcast:
        raise ConfigError("broadcast_resume", "is only used with broadcast=True; set it too")
    if resume and client_id is None:
        raise ConfigError(
            "broadcast_resume",
            "saves positions under the member's client_id: set a client_id that stays the same "
            "across restarts (a generated one changes at every start)",
        )


def _check_enhanced_fan_out(enabled: Any, consumer_name: Any, broadcast: bool) -> None:
    """Enhanced fan-out needs its HTTP/2 client (the ``efo`` extra) and a valid consumer name
    (1-128 of [a-zA-Z0-9_.-], as RegisterStreamConsumer accepts)."""
    if not isinstance(enabled, bool):
        raise ConfigError("enhanced_fan_out", f"must be True or False, got {enabled!r}")
    if consumer_name is not None:
        if not enabled:
            raise ConfigError(
                "consumer_name", "is only used with enhanced_fan_out=True; set it too"
            )
        _check_name("consumer_name", consumer_name, _CONSUMER, "1-128 of [a-zA-Z0-9_.-]")
    if not enabled:
        return
    if broadcast:
        raise ConfigError(
            "enhanced_fan_out",
            "is not supported with broadcast=True (each broadcast member would need a consumer "
            "of its own); use polling for broadcast",
        )
    if importlib.util.find_spec("httpx") is None or importlib.util.find_spec("h2") is None:
        raise EnhancedFanOutNotInstalledError(
            "enhanced_fan_out=True needs an HTTP/2 client: pip install 'kinesumer[efo]'"
        )


def _check_initial_position(value: Any) -> None:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigError(
                "initial_position", "a datetime must be timezone-aware (e.g. tzinfo=timezone.utc)"
            )
        return
    if value not in ("LATEST", "TRIM_HORIZON"):
        raise ConfigError(
            "initial_position",
            f"must be 'LATEST', 'TRIM_HORIZON' or a datetime (AT_TIMESTAMP), got {value!r}",
        )


def default_client_id() -> str:
    """A member's id when :attr:`Config.client_id` is not set: host, process, a random tail."""
    host = re.sub(r"[^A-Za-z0-9_.\-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
