"""Starting instants as users write them: ISO 8601 with an offset, epoch milliseconds, or a time
in a Java date pattern (the Databricks connector's ``{"at_timestamp": ..., "format": ...}``).

Every parser returns epoch milliseconds, rounded up (a record stamped in the same millisecond
but before a sub-millisecond instant did not arrive at or after it), or raises
:class:`ValueError` with what to write instead; :mod:`.aliases` turns that into the
:class:`~kinesumer.ConfigError` of the option that carried it. A time without a zone is
refused: its instant would depend on the host's zone.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from .offsets import epoch_ms

#: Epoch milliseconds below this (1973-03-03) are taken for seconds given by mistake.
SMALLEST_EPOCH_MS = 100_000_000_000

ISO_EXAMPLE = "2026-01-02T03:04:05Z, 2026-01-02T03:04:05.250+01:00"


def parse_instant(text: str) -> int:
    """``text``: ISO 8601 with ``Z`` or an offset, or epoch milliseconds."""
    stripped = text.strip()
    if re.fullmatch(r"\d+", stripped):
        ms = int(stripped)
        if ms < SMALLEST_EPOCH_MS:
            raise ValueError(
                f"{stripped} as epoch milliseconds is before 1973: epoch seconds? Give "
                f"milliseconds ({ms * 1000}) or an ISO 8601 time ({ISO_EXAMPLE})"
            )
        return ms
    return parse_iso(stripped)


def parse_iso(text: str) -> int:
    """ISO 8601 with ``Z`` or an offset."""
    stripped = text.strip()
    try:
        when = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", stripped))
    except ValueError:
        raise ValueError(
            f"{stripped!r} is not an ISO 8601 time with an offset or Z, nor epoch milliseconds "
            f"(e.g. {ISO_EXAMPLE}, 1767322800000)"
        ) from None
    if when.tzinfo is None:
        raise ValueError(
            f"{stripped!r} has no offset: its instant would depend on the host's zone. Add Z "
            f"(UTC) or an offset such as +01:00"
        )
    return epoch_ms(when)


#: Java pattern letters (DateTimeFormatter / SimpleDateFormat) -> (field, regular expression).
_FIELDS = {
    "y": ("year", r"\d{4}"),
    "u": ("year", r"\d{4}"),
    "M": ("month", r"\d{1,2}"),
    "d": ("day", r"\d{1,2}"),
    "H": ("hour", r"\d{1,2}"),
    "h": ("hour12", r"\d{1,2}"),
    "m": ("minute", r"\d{1,2}"),
    "s": ("second", r"\d{1,2}"),
    "S": ("fraction", r"\d{1,9}"),
    "a": ("ampm", r"(?i:AM|PM)"),
    "X": ("offset", r"Z|[+-]\d{2}(?::?\d{2})?"),
    "x": ("offset", r"[+-]\d{2}(?::?\d{2})?"),
    "Z": ("offset", r"Z|[+-]\d{2}:?\d{2}|[A-Za-z][A-Za-z0-9/_+-]*"),  # names: refused after
    "z": ("offset", r"[A-Za-z][A-Za-z0-9/_+-]*"),
}

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def parse_with_pattern(text: str, pattern: str) -> int:
    """``text`` read by the Java date ``pattern`` (``yyyy-MM-dd HH:mm:ss.SSS XXX``,
    ``MM/dd/yyyy HH:mm:ss ZZZ``...): years, months (numbers or names), days, hours (24 or 12
    with ``a``), minutes, seconds, fractions, and a zone as an offset, ``Z``, ``UTC`` or ``GMT``.
    Zone names such as ``PDT`` are refused: they are ambiguous (``IST``, ``CST``) and their
    offsets change with the seasons; write the offset."""
    regex, fields = _pattern_regex(pattern)
    found = re.fullmatch(regex, text.strip())
    if found is None:
        raise ValueError(f"{text!r} does not match the format {pattern!r}")
    values = {f: found.group(f"g{i}") for i, f in enumerate(fields)}
    if "offset" not in values:
        raise ValueError(
            f"the format {pattern!r} has no zone: add one (XXX in the format, and an offset "
            f"such as +00:00 in the time), or give an ISO 8601 time ({ISO_EXAMPLE})"
        )
    if "year" not in values or "month" not in values or "day" not in values:
        raise ValueError(f"the format {pattern!r} lacks a year, a month or a day (yyyy, MM, dd)")
    hour = int(values.get("hour") or 0)
    if "hour12" in values:
        afternoon = str(values.get("ampm", "")).upper() == "PM"
        hour = int(values["hour12"]) % 12 + (12 if afternoon else 0)
    fraction = values.get("fraction") or "0"
    month = values["month"]
    micros_digits = (fraction + "000000")[:6]
    extra = fraction[6:].strip("0")  # below a microsecond: rounds the instant up
    zone = _zone(values["offset"])
    try:
        if month.isdigit():
            month_number = int(month)
        elif month[:3].lower() in _MONTHS:
            month_number = _MONTHS.index(month[:3].lower()) + 1
        else:
            raise ValueError(f"{month!r} is not a month")
        when = datetime(
            int(values["year"]), month_number, int(values["day"]), hour,
            int(values.get("minute") or 0), int(values.get("second") or 0), int(micros_digits),
            tzinfo=zone,
        )  # fmt: skip
    except ValueError as exc:
        raise ValueError(f"{text!r} read by {pattern!r} is not a valid time: {exc}") from None
    return epoch_ms(when + timedelta(microseconds=1 if extra else 0))


def _zone(text: str) -> timezone:
    upper = text.upper()
    if upper in ("Z", "UTC", "GMT"):
        return timezone.utc
    found = re.fullmatch(r"([+-])(\d{2}):?(\d{2})?", text)
    if found is None:
        raise ValueError(
            f"the zone {text!r} is a name, not an offset: names such as PDT are ambiguous and "
            f"change with the seasons; write the offset (e.g. -07:00 with XXX in the format)"
        )
    sign = -1 if found.group(1) == "-" else 1
    return timezone(sign * timedelta(hours=int(found.group(2)), minutes=int(found.group(3) or 0)))


def _pattern_regex(pattern: str) -> tuple[str, list[str]]:
    """The regular expression of a Java date pattern, and the field of each of its groups."""
    parts: list[str] = []
    fields: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "'":
            end = pattern.find("'", i + 1)
            if end < 0:
                raise ValueError(f"the format {pattern!r} has an unclosed quote")
            parts.append(re.escape(pattern[i + 1 : end] or "'"))
            i = end + 1
            continue
        run = len(pattern) - i - len(pattern[i:].lstrip(char)) if char.isalpha() else 1
        if char.isalpha():
            if char not in _FIELDS:
                raise ValueError(
                    f"the format {pattern!r} uses {char * run!r}, which is not read here "
                    f"(years, months, days, hours, minutes, seconds, fractions and offsets are)"
                )
            field, expression = _FIELDS[char]
            if char == "M" and run >= 3:
                expression = r"[A-Za-z]{3,9}"
            elif char in "yu" and run == 2:
                raise ValueError(f"the format {pattern!r} has a two-digit year: use yyyy")
            parts.append(f"(?P<g{len(fields)}>{expression})")
            fields.append(field)
        else:
            parts.append(re.escape(char))
        i += run
    if len(set(fields)) != len(fields):
        raise ValueError(f"the format {pattern!r} names a field twice")
    return "".join(parts), fields
