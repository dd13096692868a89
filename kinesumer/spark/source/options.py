"""Spark options -> :class:`~kinesumer.Config` plus the source's own settings, checked by name.

Spark hands a data source its options as a case-insensitive mapping of strings. Every
:class:`~kinesumer.Config` field is an option under its own name (``app``, ``dynamodb_table``,
``region``, ``scan_interval``, ``initial_position`` ...); ``streams`` is a comma-separated list
of names and ARNs (Kinesis streams of any account and region, DynamoDB tables' streams);
``accounts`` and ``kinesis_endpoints`` are JSON objects
(``{"111122223333": {"role_arn": "arn:aws:iam::111122223333:role/r", "external_id": "x"}}``,
``{"eu-west-1": "http://..."}``); the source adds the options of :data:`SOURCE_DEFAULTS`.
A missing, unknown or malformed option raises :class:`~kinesumer.ConfigError` naming it, from
``load()`` / ``start()``, before any worker connects anywhere.

Spark prints a source's options in its plans (``explain()``, the UI's SQL tab, event logs),
hiding only those whose name matches ``spark.sql.redaction.options.regex`` (default
``(?i)url``) or whose name or value matches ``spark.redaction.regex``: neither covers
:data:`SENSITIVE_OPTIONS`, so :func:`redact_sensitive_options` adds them to the session's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ...accounts import AccountAccess
from ...config import Config, check_streams
from ...errors import ConfigError
from ...stream_refs import is_dynamodb_stream
from .aliases import ALIASES, CONSUMER_TYPES, STARTING_TIMESTAMP, canonical_options, hint
from .logs import apply_log_level, parse_log_level

#: The source's own options and their defaults (documented in docs/spark/source.md).
SOURCE_DEFAULTS: dict[str, Any] = {
    # Admission control: records per micro-batch across the query's shards (None: no bound
    # beyond max_records_per_shard). Also Spark's ReadMaxRows when the query gives one.
    "max_records_per_trigger": None,
    # Records one shard contributes to one micro-batch at most.
    "max_records_per_shard": 10_000,
    # Longest an executor task reads one shard for one micro-batch (seconds).
    "max_read_seconds": 10.0,
    # Idle shards (every one caught up): how often the driver looks for new records with a
    # one-record probe before planning a batch (seconds).
    "idle_poll_interval": 1.0,
    # Ledger items (per batch and shard) expire after this many seconds (DynamoDB TTL); at
    # least LEDGER_TTL_FLOOR: a replay after a restart needs its batch's items.
    "ledger_ttl_seconds": 7 * 24 * 3600,
    # False: the query is a group of its own (every query reads every record, as with the
    # Kafka source); True: it joins the app's group, sharing its shards with the app's other
    # queries and plain Kinesumer processes (see kinesumer.spark.source.driver.groups).
    "shared_group": False,
    # Kinesis or DynamoDB failing: how long (seconds) the source retries a step, with backoff,
    # before the query fails with SourceOutageError naming the service and since when.
    "outage_timeout": 300.0,
    # An executor that took a full batch from a shard reads the shard's next batch ahead, on
    # its host, while Spark finishes this one (kinesumer.spark.source.executor.readahead).
    "read_ahead": True,
    # Level of the source's logs in Spark's Python workers (None: their default, WARNING).
    "log_level": None,
}

_REQUIRED = ("app", "dynamodb_table", "streams")

#: Options that are neither Config fields nor in SOURCE_DEFAULTS (``starting_timestamp`` is
#: folded into ``initial_position`` by :func:`~.aliases.canonical_options`).
_OWN = ("streams", "consumer_type", STARTING_TIMESTAMP)

#: Why enhanced fan-out is refused rather than ignored (the executors always poll).
EFO_UNSUPPORTED = (
    "enhanced fan-out (SubscribeToShard) is not supported by the Spark source yet: its "
    "executors read with GetRecords (polling). Remove the option, or set consumer_type to "
    "GetRecords (polling); Kinesumer processes (not Spark) support enhanced_fan_out=true"
)

#: Options whose values stay out of Spark's plans and UI: the role the source assumes and the
#: external id that guards it (which, with the role, is what a confused deputy needs).
SENSITIVE_OPTIONS = ("role_arn", "external_id", "accounts")

#: Spark's setting: option names (a Java regular expression) whose values plans print redacted.
REDACTION_CONF = "spark.sql.redaction.options.regex"
#: Their names and those of the other connectors' aliases (``roleArn``, ``kinesis.stsRoleArn``,
#: ``roleExternalId``, ``externalId``): Spark redacts an option whose name the pattern finds in.
_SENSITIVE_PATTERN = "(?i:" + "|".join([*SENSITIVE_OPTIONS, "rolearn", "externalid"]) + ")"


def redact_sensitive_options(spark: Any) -> None:
    """Add :data:`SENSITIVE_OPTIONS` to ``spark``'s :data:`REDACTION_CONF` (kept as given,
    extended by an alternative), so plans show ``role_arn=*********(redacted)``. Idempotent;
    :func:`~.datasource.read_stream` and registering the source call it."""
    current = str(spark.conf.get(REDACTION_CONF) or "")
    if _SENSITIVE_PATTERN in current:
        return
    spark.conf.set(
        REDACTION_CONF, f"{current}|{_SENSITIVE_PATTERN}" if current else _SENSITIVE_PATTERN
    )


def redact_in_active_session() -> None:
    """:func:`redact_sensitive_options` on the process's active Spark session, if it has one
    (``spark.dataSource.register`` runs in the application's process, which has; Spark's Python
    workers have none, and nothing happens there)."""
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    except ImportError:
        return
    if session is not None:
        redact_sensitive_options(session)


#: ``handoff_timeout`` when the option is not given: a shard moving away waits for its batches in
#: flight, and a batch is in hand for its read (``max_read_seconds``), the sink, and up to one
#: trigger interval (it is settled at the next ``latestOffset``). ``Config``'s 5 s is far too short.
SOURCE_HANDOFF_TIMEOUT = 120.0

#: The shortest ``ledger_ttl_seconds`` accepted (one day).
LEDGER_TTL_FLOOR = 24 * 3600


@dataclass(frozen=True)
class SourceOptions:
    """Everything the source needs, parsed: the member's Config, the streams, the bounds."""

    config: Config
    streams: tuple[str, ...]
    max_records_per_trigger: int | None = None
    max_records_per_shard: int = 10_000
    max_read_seconds: float = 10.0
    idle_poll_interval: float = 1.0
    ledger_ttl_seconds: int = 7 * 24 * 3600
    log_level: str | None = None
    shared_group: bool = False
    outage_timeout: float = 300.0
    read_ahead: bool = True

    def __post_init__(self) -> None:
        # Built in each Spark worker that parses the options (the planner's among them).
        apply_log_level(self.log_level)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in the executors' workers, which never parse options.
        for name, value in state.items():
            object.__setattr__(self, name, value)
        apply_log_level(self.log_level)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Parse Spark's option strings; :class:`ConfigError` names the first bad option."""
    given = canonical_options({str(k).lower(): v for k, v in options.items()})
    config_fields = {f.name: f for f in dataclasses.fields(Config)}
    for name in given:
        if name not in config_fields and name not in SOURCE_DEFAULTS and name not in _OWN:
            raise ConfigError(name, f"is not an option of the kinesumer source{_hint(name)}")
    _refuse_enhanced_fan_out(given)
    for name in _REQUIRED:
        if not str(given.get(name) or "").strip():
            raise ConfigError(name, "is required: .option(" + repr(name) + ", ...)")
    values: dict[str, Any] = {}
    for name, field in config_fields.items():
        if name in given:
            values[name] = _config_value(name, str(field.type), given[name])
    if "handoff_timeout" not in given:
        values["handoff_timeout"] = SOURCE_HANDOFF_TIMEOUT
    config = Config(**values)
    if config.broadcast:
        # The source's executors read the shards this driver's group member claimed: there is
        # no claim in broadcast mode, and Spark's own checkpoint already replays per query.
        raise ConfigError(
            "broadcast",
            "is not supported by the Spark source (its reads follow the group's claims); every "
            "query reads every record already (a group of its own unless shared_group=true)",
        )
    streams = check_streams(
        [s.strip() for s in str(given["streams"]).split(",") if s.strip()], kinesis_arns=True
    )
    _refuse_for_table_streams(config, streams, options)
    source: dict[str, Any] = {}
    for name in SOURCE_DEFAULTS:
        if name in given:
            source[name] = _source_value(name, given[name])
    return SourceOptions(config=config, streams=streams, **source)


def to_options(
    config: Config, streams: list[str] | tuple[str, ...], **source: Any
) -> dict[str, str]:
    """The option strings that :func:`parse_options` turns back into ``config`` and ``source``
    (for :func:`~kinesumer.spark.read_stream`); fields left at their default are omitted (so a
    ``handoff_timeout`` left at ``Config``'s default becomes :data:`SOURCE_HANDOFF_TIMEOUT`)."""
    out: dict[str, str] = {}
    for field in dataclasses.fields(Config):
        value = getattr(config, field.name)
        if value == field.default or value is None or not field.compare:
            continue  # not compared: process-local objects (OpenTelemetry providers)
        if field.name in _JSON_FIELDS:
            out[field.name] = _JSON_FIELDS[field.name][1](value)
            continue
        out[field.name] = value.isoformat() if isinstance(value, datetime) else str(value)
    out["streams"] = ",".join(check_streams(streams, kinesis_arns=True))
    for name, value in source.items():
        if name not in SOURCE_DEFAULTS:
            raise ConfigError(name, f"is not an option of the kinesumer source{_hint(name)}")
        if value is not None:
            out[name] = str(value)
    return out


def _hint(name: str) -> str:
    known = [f.name for f in dataclasses.fields(Config)] + list(SOURCE_DEFAULTS) + list(_OWN)
    return hint(name, known)


def _refuse_enhanced_fan_out(given: Mapping[str, str]) -> None:
    """Enhanced fan-out asked for by any name: a named error, never accepted and ignored (for
    a table's stream, saying that DynamoDB Streams has none)."""
    reason = EFO_UNSUPPORTED
    tables = [s.strip() for s in str(given.get("streams", "")).split(",")]
    tables = [s for s in tables if is_dynamodb_stream(s)]
    if tables:
        reason = (
            f"DynamoDB Streams has no enhanced fan-out ({tables[0]!r}): its shards are read "
            "with GetRecords; remove the option, or set consumer_type to GetRecords"
        )
    kind = given.get("consumer_type")
    if kind is not None:
        efo = CONSUMER_TYPES.get(str(kind).strip().lower())
        if efo is None:
            raise ConfigError(
                "consumer_type",
                f"must be GetRecords (or polling); got {kind!r}",
            )
        if efo:
            raise ConfigError("consumer_type", reason)
    if "enhanced_fan_out" in given and _bool("enhanced_fan_out", str(given["enhanced_fan_out"])):
        raise ConfigError("enhanced_fan_out", reason)


def _refuse_for_table_streams(
    config: Config, streams: tuple[str, ...], options: Mapping[str, str]
) -> None:
    """What a DynamoDB table's stream cannot do, named by the option the user gave: it has no
    AT_TIMESTAMP iterator, so no starting instant (``starting_timestamp``, or a time given as
    ``initial_position`` or one of its aliases) and no LATEST start for a query. Enhanced
    fan-out is refused for every stream before (:func:`_refuse_enhanced_fan_out`)."""
    tables = [name for name in streams if is_dynamodb_stream(name)]
    if not tables:
        return
    given = [str(k).lower() for k in options]
    if config.initial_position == "LATEST":
        # A query at LATEST pins each shard's start to an instant and reads from the shard's
        # oldest change to it, skipping; without AT_TIMESTAMP each batch starts that scan over,
        # so a shard holding more changes than one batch scans (max_read_seconds) would never
        # get past it.
        named = [n for n in given if ALIASES.get(n, (n, ""))[0] == "initial_position"]
        raise ConfigError(
            named[0] if named else "initial_position",
            f"the Spark source reads a DynamoDB table's stream ({tables[0]!r}) from "
            "TRIM_HORIZON (the stream's last 24 hours) only: DynamoDB Streams has no "
            "AT_TIMESTAMP iterator to start a query at LATEST with; set "
            "initial_position=TRIM_HORIZON",
        )
    if not isinstance(config.initial_position, datetime):
        return
    named = [n for n in given if ALIASES.get(n, (n, ""))[0] == STARTING_TIMESTAMP]
    named += [n for n in given if ALIASES.get(n, (n, ""))[0] == "initial_position"]
    raise ConfigError(
        named[0] if named else "initial_position",
        f"DynamoDB Streams has no AT_TIMESTAMP iterator ({tables[0]!r}): a query reading a "
        "table's stream starts at TRIM_HORIZON (the stream's last 24 hours) or LATEST",
    )


def _config_value(name: str, kind: str, raw: str) -> Any:
    """One Config field from its option string, by the field's annotation."""
    text = str(raw).strip()
    if "None" in kind and text.lower() in ("", "none", "null"):
        return None
    if name in _JSON_FIELDS:
        return _JSON_FIELDS[name][0](text)
    if kind.startswith("int"):
        return _int(name, text)
    if kind.startswith("float"):
        return _float(name, text)
    if kind.startswith("bool"):
        return _bool(name, text)
    if kind == "InitialPosition":
        return _initial_position(text)
    return text


def _json_object(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(name, f"must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(name, f"must be a JSON object, got {text!r}")
    return value


def accounts_from_json(text: str) -> dict[str, AccountAccess]:
    """``accounts``: ``{"111122223333": {"role_arn": "...", "external_id": "..."}}`` (each
    account's role; ``roleArn`` / ``externalId`` spellings too)."""
    out: dict[str, AccountAccess] = {}
    for account, access in _json_object("accounts", text).items():
        if not isinstance(access, dict):
            raise ConfigError(
                "accounts", f'account {account}: must be {{"role_arn": ...}}, got {access!r}'
            )
        fields = {_compact_key(k): v for k, v in access.items()}
        unknown = set(fields) - {"rolearn", "externalid"}
        if unknown or "rolearn" not in fields:
            raise ConfigError(
                "accounts",
                f"account {account}: give role_arn (and external_id if the role asks one), got "
                f"{sorted(access)}",
            )
        out[str(account)] = AccountAccess(fields["rolearn"], fields.get("externalid"))
    return out


def _accounts_json(value: Any) -> str:
    return json.dumps(
        {
            account: {"role_arn": a.role_arn}
            | ({"external_id": a.external_id} if a.external_id else {})
            for account, a in value.items()
        }
    )


def endpoints_from_json(text: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _json_object("kinesis_endpoints", text).items()}


def _compact_key(name: str) -> str:
    return name.replace("_", "").lower()


#: Config fields given as JSON objects: field -> (parse, write).
_JSON_FIELDS: dict[str, tuple[Callable[[str], Any], Callable[[Any], str]]] = {
    "accounts": (accounts_from_json, _accounts_json),
    "kinesis_endpoints": (endpoints_from_json, lambda value: json.dumps(dict(value))),
}


def _source_value(name: str, raw: str) -> Any:
    text = str(raw).strip()
    if name == "log_level":
        return parse_log_level(text)
    if name in ("shared_group", "read_ahead"):
        return _bool(name, text)
    if name == "max_records_per_trigger" and text.lower() in ("", "none", "null"):
        return None
    if name in ("max_records_per_trigger", "max_records_per_shard", "ledger_ttl_seconds"):
        value = _int(name, text)
        least = LEDGER_TTL_FLOOR if name == "ledger_ttl_seconds" else 1
        if value < least:
            raise ConfigError(name, f"must be an integer >= {least}, got {value}")
        return value
    number = _float(name, text)
    low = 0.2 if name == "idle_poll_interval" else 0.5
    if number < low:
        raise ConfigError(name, f"must be a number of seconds >= {low}, got {number}")
    return number


def _int(name: str, text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {text!r}") from None


def _float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {text!r}")
    return value


def _bool(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigError(name, f"must be true or false, got {text!r}")


def _initial_position(text: str) -> Any:
    upper = text.upper()
    if upper in ("LATEST", "TRIM_HORIZON"):
        return upper
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            "initial_position",
            f"must be LATEST, TRIM_HORIZON or an ISO timestamp (AT_TIMESTAMP), got {text!r}",
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
