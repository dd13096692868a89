"""The source's log lines where a Spark user can see them: the ``log_level`` option.

The source logs from Spark's Python workers (the long-lived one planning batches on the
driver's host, and the executors' workers reading shards), never from the application's process:
the application's ``logging`` configuration does not reach them. A worker's Python logging is
unconfigured, so only WARNING and above get out (Python's last-resort handler, on the worker's
stderr, which Spark copies into the driver's or executor's log; in local mode, the console).

With ``log_level`` set (``INFO``, ``DEBUG`` ...), every worker that builds or unpickles the
source's options sets the ``kinesumer`` logger to it and, when that logger has no handler yet,
gives it one on stderr naming the process (``pid``), so INFO lines reach the same place. The
application's own process is left alone (its logging is the application's to configure).
"""

from __future__ import annotations

import logging
import sys

from ...errors import ConfigError
from .errors import in_spark_worker

#: The format of the handler added in Spark's workers.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s"

_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def parse_log_level(text: str) -> str | None:
    """``log_level``'s value, upper-cased; :class:`ConfigError` for anything else."""
    level = text.strip().upper()
    if level in ("", "NONE", "NULL"):
        return None
    if level not in _LEVELS:
        raise ConfigError("log_level", f"must be one of {', '.join(_LEVELS)}, got {text!r}")
    return level


def apply_log_level(level: str | None, force: bool = False) -> None:
    """In a Spark worker (or with ``force``), set the ``kinesumer`` logger to ``level`` and give
    it a stderr handler if it has none. Nothing when ``level`` is None."""
    if level is None or not (force or in_spark_worker()):
        return
    logger = logging.getLogger("kinesumer")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
