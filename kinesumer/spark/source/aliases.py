"""Other Kinesis connectors' option names, accepted where they mean the same, and the
"did you mean" hint for a name nobody knows.

A user switching from the AWS Labs connector (``format("aws-kinesis")``, options
``kinesis.*``) or the Databricks one (``format("kinesis")``) should only have to change the
format name: :data:`ALIASES` maps each of their options that means what one of ours means to
ours (values translated where their spelling differs, as ``initialPosition=earliest``). An
option of theirs that we cannot honour is never accepted and ignored: :data:`UNSUPPORTED` names
it with the reason, and :func:`canonical_options` raises :class:`~kinesumer.ConfigError`.

Hints go by meaning first (an alias, the same name in another case or spelling, a word that
names what the option is about) and by edit distance only when nothing else matched.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone

from ...errors import ConfigError
from .instants import parse_instant, parse_with_pattern
from .offsets import epoch_ms, ms_datetime

#: Where an alias comes from, as the table of docs/spark/source.md says it.
AWSLABS = "AWS Labs spark-sql-kinesis-connector"
DATABRICKS = "Databricks Kinesis connector"

#: alias (lower case, as Spark hands options over) -> (our option, the connector it comes from).
ALIASES: dict[str, tuple[str, str]] = {
    "kinesis.streamname": ("streams", AWSLABS),
    "kinesis.region": ("region", AWSLABS),
    "kinesis.kinesisregion": ("kinesis_region", AWSLABS),
    "kinesis.endpointurl": ("kinesis_endpoint", AWSLABS),
    "kinesis.startingposition": ("initial_position", AWSLABS),
    "kinesis.consumertype": ("consumer_type", AWSLABS),
    "kinesis.consumername": ("consumer_name", AWSLABS),
    "kinesis.stsrolearn": ("role_arn", AWSLABS),
    "kinesis.stsendpointurl": ("sts_endpoint", AWSLABS),
    "kinesis.maxfetchrecordspershard": ("max_records_per_shard", AWSLABS),
    "kinesis.maxfetchtimepershardsec": ("max_read_seconds", AWSLABS),
    "kinesis.getrecords.numberofrecordsperfetch": ("scan_limit", AWSLABS),
    "kinesis.dynamodb.tablename": ("dynamodb_table", AWSLABS),
    "streamname": ("streams", DATABRICKS),
    "streamarn": ("streams", DATABRICKS),
    "endpoint": ("kinesis_endpoint", DATABRICKS),
    "initialposition": ("initial_position", DATABRICKS),
    "consumermode": ("consumer_type", DATABRICKS),
    "rolearn": ("role_arn", DATABRICKS),
    "roleexternalid": ("external_id", DATABRICKS),
    "externalid": ("external_id", DATABRICKS),
    "stsendpoint": ("sts_endpoint", DATABRICKS),
    "maxrecordsperfetch": ("scan_limit", DATABRICKS),
    "consumername": ("consumer_name", DATABRICKS),
}

_KEYS = "use the default AWS credential chain (environment, profile, instance role) or role_arn"
#: Their options with no counterpart here: refused, with what to do instead.
UNSUPPORTED: dict[str, str] = {
    "kinesis.awsaccesskeyid": _KEYS,
    "kinesis.awssecretkey": _KEYS,
    "awsaccesskey": _KEYS,
    "awssecretkey": _KEYS,
    "kinesis.stssessionname": "kinesumer names its role sessions itself; remove the option",
    "rolesessionname": "kinesumer names its role sessions itself; remove the option",
    "kinesis.metadatacommittertype": "the per-batch metadata lives in dynamodb_table",
    "kinesis.failondataloss": "kinesumer never skips records: a shard's records are all read",
    "servicecredential": "Databricks service credentials are not read; use role_arn",
}

#: consumer_type values (ours and theirs, lower case) -> enhanced fan-out or not.
CONSUMER_TYPES = {
    "getrecords": False,
    "polling": False,
    "subscribetoshard": True,
    "efo": True,
}

#: Words that say what an option is about -> the option (the "by meaning" hint).
_MEANINGS = (
    ("timestamp", "starting_timestamp"),
    ("stream", "streams"),
    ("table", "dynamodb_table"),
    ("dynamo", "dynamodb_table"),
    ("position", "initial_position"),
    ("starting", "initial_position"),
    ("region", "region"),
    ("endpoint", "kinesis_endpoint"),
    ("role", "role_arn"),
    ("trigger", "max_records_per_trigger"),
    ("fanout", "enhanced_fan_out"),
    ("group", "app"),
    ("application", "app"),
)


def _compact(name: str) -> str:
    """A name without case, separators or a ``kinesis.`` prefix: ``maxRecordsPerTrigger`` and
    ``max-records-per-trigger`` both become ``maxrecordspertrigger``."""
    return re.sub(r"[^a-z0-9]", "", name.lower().removeprefix("kinesis."))


def suggest(name: str, known: Iterable[str]) -> str | None:
    """The option ``name`` most likely meant, or None: the same name spelled otherwise, then a
    word naming what it is about, then the closest name by edit distance."""
    options = list(known)
    compact = {_compact(k): k for k in options}
    compact.update({_compact(alias): ours for alias, (ours, _) in ALIASES.items()})
    wanted = _compact(name)
    if wanted in compact:
        return compact[wanted]
    for word, option in _MEANINGS:
        if word in wanted and option in options:
            return option
    close = difflib.get_close_matches(wanted, list(compact), n=1, cutoff=0.75)
    return compact[close[0]] if close else None


def hint(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for :func:`suggest`'s answer, or nothing."""
    option = suggest(name, known)
    return f" (did you mean {option!r}?)" if option else ""


def canonical_options(given: Mapping[str, str]) -> dict[str, str]:
    """``given`` (lower-cased names) with every alias renamed to our option and its value in our
    spelling. :class:`ConfigError` for an option we refuse, or for an alias and our own name
    (or two aliases) given with different values.

    A starting instant, by any name (``starting_timestamp``; a time under ``initial_position``,
    ``kinesis.startingPosition`` or ``initialPosition``), comes out as ``initial_position`` =
    the instant in ISO 8601 (UTC, milliseconds): one path from here on. Two names giving two
    instants, or an instant beside LATEST or TRIM_HORIZON, or AT_TIMESTAMP with no instant,
    is a :class:`ConfigError` naming the option to fix (:func:`_starting_instant`)."""
    out: dict[str, str] = {}
    origin: dict[str, str] = {}
    for name, value in given.items():
        if name in UNSUPPORTED:
            reason = UNSUPPORTED[name]
            raise ConfigError(name, f"is not supported by the kinesumer source: {reason}")
        ours = ALIASES[name][0] if name in ALIASES else name
        text = str(value)
        if ours == "initial_position":
            text, instant = _position(name, text)
            if instant is not None:
                _put(out, origin, STARTING_TIMESTAMP, str(instant), name)
        elif ours == STARTING_TIMESTAMP:
            text = str(_instant(name, text, parse_instant))
        _put(out, origin, ours, text, name)
    return _starting_instant(out, origin)


#: Our option naming a starting instant (docs/spark/source.md); folded into initial_position.
STARTING_TIMESTAMP = "starting_timestamp"

_AT_TIMESTAMP = "AT_TIMESTAMP"


def _put(out: dict[str, str], origin: dict[str, str], ours: str, text: str, name: str) -> None:
    if ours in out and out[ours] != text:
        first = origin[ours]
        raise ConfigError(ours, f"is given twice with different values (as {first!r} and {name!r})")
    out[ours] = text
    origin.setdefault(ours, name)


def _starting_instant(out: dict[str, str], origin: dict[str, str]) -> dict[str, str]:
    """Fold the starting instant into ``initial_position`` (see :func:`canonical_options`)."""
    instant = out.pop(STARTING_TIMESTAMP, None)
    position = out.get("initial_position")
    if instant is None:
        if position == _AT_TIMESTAMP:
            raise ConfigError(
                origin["initial_position"],
                "is AT_TIMESTAMP but no time is given: add the instant, as "
                f".option('{STARTING_TIMESTAMP}', '2026-01-02T03:04:05Z') (ISO 8601 with an "
                "offset or Z, or epoch milliseconds)",
            )
        return out
    if position not in (None, _AT_TIMESTAMP):
        raise ConfigError(
            origin["initial_position"],
            f"is {position} but {origin[STARTING_TIMESTAMP]!r} gives a starting time: a query "
            f"starts at one or the other. Remove {origin['initial_position']!r} (or set it to "
            f"AT_TIMESTAMP) to start at the time, or remove {origin[STARTING_TIMESTAMP]!r}",
        )
    out["initial_position"] = ms_datetime(int(instant)).isoformat(timespec="milliseconds")
    return out


def _instant(name: str, text: str, parse: Callable[[str], int]) -> int:
    """``parse(text)``, its ValueError as the named error of option ``name``."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ConfigError(name, f"must be a starting time: {exc}") from None


#: Position words every connector's users write, in our spelling.
_POSITION_WORDS = {
    "earliest": "TRIM_HORIZON",
    "trim_horizon": "TRIM_HORIZON",
    "latest": "LATEST",
    "at_timestamp": _AT_TIMESTAMP,
}


def _position(name: str, text: str) -> tuple[str, int | None]:
    """A starting position in ours, and its instant (epoch ms) if it names one. Ours and
    theirs alike: ``earliest`` is TRIM_HORIZON; an instant comes as ``AT_TIMESTAMP
    2023-08-30T19:00:05Z`` (AWS Labs), as the JSON ``{"at_timestamp": "...", "format":
    "..."}`` (Databricks; ``format`` a Java date pattern), or (``initial_position`` only, as
    before) an ISO 8601 time, UTC if it has no offset; ``AT_TIMESTAMP`` alone takes the
    instant from ``starting_timestamp``."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in _POSITION_WORDS:
        return _POSITION_WORDS[lowered], None
    if lowered.startswith("at_timestamp"):
        rest = stripped[len("at_timestamp") :].strip()
        return _AT_TIMESTAMP, _instant(name, rest, parse_instant)
    if stripped.startswith("{"):
        return _AT_TIMESTAMP, _databricks_instant(name, stripped)
    if name == "initial_position":
        return _AT_TIMESTAMP, _legacy_iso(name, stripped)
    raise ConfigError(
        name,
        "must be latest, earliest, trim_horizon or an at_timestamp with an ISO 8601 time "
        f"('AT_TIMESTAMP 2023-08-30T19:00:05Z' or '{{\"at_timestamp\": \"...\"}}'), got {text!r}",
    )


def _legacy_iso(name: str, text: str) -> int:
    """An ISO 8601 time under ``initial_position``, as it always was: UTC without an offset."""
    try:
        when = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text))
    except ValueError:
        raise ConfigError(
            name,
            "must be LATEST, TRIM_HORIZON, AT_TIMESTAMP (with starting_timestamp) or an ISO "
            f"timestamp, got {text!r}",
        ) from None
    return epoch_ms(when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc))


def _databricks_instant(name: str, text: str) -> int:
    """The instant of Databricks' ``{"at_timestamp": "...", "format": "..."}``."""
    import json

    try:
        spec = json.loads(text)
    except ValueError:
        spec = None
    when = spec.get("at_timestamp") if isinstance(spec, dict) else None
    pattern = spec.get("format") if isinstance(spec, dict) else None
    if not isinstance(when, str) or (pattern is not None and not isinstance(pattern, str)):
        raise ConfigError(
            name,
            'must be latest, earliest, trim_horizon or {"at_timestamp": "<time>"} with an ISO '
            '8601 time, or with "format": a Java date pattern of that time; got ' + repr(text),
        )
    if pattern is None:
        return _instant(name, when, parse_instant)
    return _instant(name, when, lambda t: parse_with_pattern(t, pattern))
