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
from collections.abc import Iterable, Mapping

from ...errors import ConfigError

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
    (or two aliases) given with different values."""
    out: dict[str, str] = {}
    origin: dict[str, str] = {}
    for name, value in given.items():
        if name in UNSUPPORTED:
            reason = UNSUPPORTED[name]
            raise ConfigError(name, f"is not supported by the kinesumer source: {reason}")
        ours = ALIASES[name][0] if name in ALIASES else name
        text = str(value)
        if ours == "initial_position" and name != ours:
            text = _their_position(name, text)
        elif ours == "initial_position" and text.strip().lower() in _POSITION_WORDS:
            # earliest/latest in any case under our own name too, as under theirs
            text = _POSITION_WORDS[text.strip().lower()]
        if ours in out and out[ours] != text:
            raise ConfigError(
                ours, f"is given twice with different values (as {origin[ours]!r} and {name!r})"
            )
        out[ours] = text
        origin[ours] = name
    return out


#: Position words every connector's users write, in our spelling.
_POSITION_WORDS = {"earliest": "TRIM_HORIZON", "trim_horizon": "TRIM_HORIZON", "latest": "LATEST"}


def _their_position(name: str, text: str) -> str:
    """Their starting positions in ours: ``earliest`` is TRIM_HORIZON; AT_TIMESTAMP comes as
    ``AT_TIMESTAMP 2023-08-30T19:00:05Z`` (AWS Labs) or as the JSON
    ``{"at_timestamp": "...", "format": "..."}`` (Databricks; ISO timestamps only here)."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("earliest", "trim_horizon"):
        return "TRIM_HORIZON"
    if lowered == "latest":
        return "LATEST"
    if lowered.startswith("at_timestamp"):
        rest = stripped[len("at_timestamp") :].strip()
        if rest and _is_iso(rest):
            return rest
    if stripped.startswith("{"):
        import json

        try:
            spec = json.loads(stripped)
        except ValueError:
            spec = None
        when = spec.get("at_timestamp") if isinstance(spec, dict) else None
        if isinstance(when, str) and _is_iso(when):
            return when
    raise ConfigError(
        name,
        "must be latest, earliest, trim_horizon or an at_timestamp with an ISO 8601 time "
        f"('AT_TIMESTAMP 2023-08-30T19:00:05Z' or '{{\"at_timestamp\": \"...\"}}'), got {text!r}",
    )


def _is_iso(text: str) -> bool:
    from datetime import datetime

    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True
