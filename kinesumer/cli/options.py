"""The command line's option values: argparse types that check them (one clear message per bad
value), environment defaults, and the :class:`~kinesumer.Config` a command's options make."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from ..config import Config, InitialPosition
from ..statestore.dynamodb.codecs import MAX_SEQUENCE_DIGITS

DEFAULT_CLIENT_TIMEOUT: float = next(
    f.default for f in dataclasses.fields(Config) if f.name == "client_timeout"
)  # type: ignore[assignment]


def env_option(parser: argparse.ArgumentParser, flag: str, env: str, what: str) -> None:
    """An option that defaults to ``$env`` and is required when that is unset."""
    default = os.environ.get(env) or None
    parser.add_argument(
        flag, default=default, required=default is None, help=f"{what} (default: ${env})"
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def sequence_number(text: str) -> str:
    """Kinesis sequence numbers are decimal strings of up to ~56 digits (checked as text: they
    do not fit in a float, nor in a DynamoDB number)."""
    if not text.isascii() or not text.isdigit() or len(text) > MAX_SEQUENCE_DIGITS:
        raise argparse.ArgumentTypeError(
            f"a sequence number is decimal digits only (e.g. 4959033827149025660855969253836157"
            f"1095921575989136588898), got {text!r}"
        )
    return text


def initial_position(text: str) -> InitialPosition:
    if text.upper() in ("LATEST", "TRIM_HORIZON"):
        return "LATEST" if text.upper() == "LATEST" else "TRIM_HORIZON"
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LATEST, TRIM_HORIZON or an ISO 8601 time (2024-05-01T12:00:00Z), "
            f"got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def iso_instant(text: str) -> datetime:
    """An ISO 8601 time (``2024-05-01T12:00:00Z``; a naive time is UTC)."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2024-05-01T12:00:00Z, got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


#: A century, in seconds: longer durations are capped to it (see :func:`duration`).
_LONGEST_DURATION_S = 100 * 365.25 * 86_400.0


def duration(text: str) -> timedelta:
    """A positive duration: numbers with units, such as ``1h``, ``90m``, ``1h30m``, ``45s``,
    ``2d`` (ms, s, m, h, d, w)."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 1h, 90m, 1h30m or 2d (units ms, s, m, h, d, w), "
            f"got {text!r}"
        )
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text!r}")
    # Past a century every duration reaches before 1970, which a rewind reads as the oldest
    # record; capping keeps the arithmetic inside datetime's range (99999999999w overflows it).
    return timedelta(seconds=min(seconds, _LONGEST_DURATION_S))


def group_config(args: argparse.Namespace, **extra: Any) -> Config:
    return Config(
        app=args.app,
        dynamodb_table=args.table,
        region=args.region,
        dynamodb_endpoint=args.dynamodb_endpoint,
        kinesis_endpoint=getattr(args, "kinesis_endpoint", None),
        allow_insecure_endpoints=getattr(args, "allow_insecure_endpoints", False),
        **extra,
    )
