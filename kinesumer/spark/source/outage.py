"""Outages of Kinesis or DynamoDB ridden out for a bounded time, then a named error.

Every AWS call of the library retries transient errors (throttling, 5xx, dropped connections,
hung calls) a few times, for about ten seconds plus one read timeout
(:func:`kinesumer.aws.retry.call_with_retry`), then raises
:class:`~kinesumer.TransientAWSError`. For a streaming query that is too short: a regional
blip of a minute would fail it. :func:`ride_out` runs one of the source's steps (an executor's
read of a shard for a batch, one of the driver's ledger, pin or probe calls) again and again,
with backoff, while it keeps failing that way, for up to ``outage_timeout`` seconds since the
first failure, logging a WARNING at every retry (which service, since when, for how long yet);
then it raises :class:`SourceOutageError`, which says which service and since when, and the
query fails with it.

The first failure is the moment the first failed call was *sent*: a call to a hung endpoint
counts from its send, not from when its tries gave up (which, with botocore's read timeout per
try, was a minute later). The step's calls run under an outage clock
(:func:`kinesumer.aws.retry.outage_clock`), which keeps that moment and cuts any call still
waiting when the budget ends, so the error comes by ``outage_timeout`` after the first failed
or hung call, plus at most a second (a try sent as the budget ends is still given
:data:`~kinesumer.aws.retry.MIN_TRY`, so the error names the service that is really down).

The steps are safe to repeat: a read is decided by the ledger (a repeat reads exactly the
recorded range, or records one), and the driver's calls are reads or conditional writes.
Nothing is lost: a batch that failed is replayed by Spark at the restart.

There is no hook for custom metrics in a Python source (SPARK-SOURCE.md): the logs are where
an outage shows while it lasts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TypeVar

from ...aws.retry import OutageClock, outage_clock
from ...errors import TransientAWSError

log = logging.getLogger("kinesumer.spark.source")

T = TypeVar("T")

#: Longest pause between two tries (seconds).
MAX_BACKOFF = 10.0


class SourceOutageError(TransientAWSError):
    """A service (Kinesis or DynamoDB) kept failing for longer than the source's
    ``outage_timeout``: the message names the service, the step, and since when."""

    def __init__(self, service: str, what: str, since: datetime, seconds: float, last: str):
        self.service = service
        self.since = since
        super().__init__(
            f"{service} unavailable since {since.isoformat(timespec='seconds')} ({seconds:.0f} s, "
            f"longer than outage_timeout): {what} failed every time; last error: {last}. "
            f"Nothing was lost: the batch is replayed when the query restarts"
        )


def service_of(exc: TransientAWSError) -> str:
    """The service a library error came from (its message starts ``<service>.<operation>``)."""
    head = str(exc).split(" ", 1)[0]
    name = head.split(".", 1)[0] if "." in head else "AWS"
    return {"kinesis": "Kinesis", "dynamodb": "DynamoDB", "sts": "STS"}.get(name, name)


def ride_out(step: Callable[[], T], timeout: float, what: str) -> T:
    """``step()``, tried again with backoff while it raises :class:`TransientAWSError`, for up to
    ``timeout`` seconds since the first failed (or hung) call was sent; then
    :class:`SourceOutageError`. The step's AWS calls are bounded by the same budget."""
    clock = OutageClock(timeout)
    began: float | None = None  # monotonic: the first failed call's send
    pause = 0.5
    while True:
        try:
            with outage_clock(clock):
                result = step()
        except SourceOutageError:
            raise
        except TransientAWSError as exc:
            now = time.monotonic()
            clock.failed(now)  # a no-op after a failed call; else an error raised outside one
            began = clock.since if began is None else min(began, clock.since or now)
            assert began is not None
            # An answer within the step does not end the outage of the step: its next try is
            # bounded from the first failure still.
            clock.since = began
            service, spent = service_of(exc), now - began
            since = datetime.now(timezone.utc) - timedelta(seconds=spent)
            if spent >= timeout:
                raise SourceOutageError(service, what, since, spent, str(exc)) from exc
            wait = min(pause, MAX_BACKOFF, timeout - spent)
            log.warning(
                "%s unavailable since %s (%.0f s of outage_timeout %.0f s): %s; retrying in "
                "%.1f s: %s", service, since.isoformat(timespec="seconds"), spent, timeout,
                what, wait, exc,
            )  # fmt: skip
            time.sleep(wait)
            pause *= 2
            continue
        if began is not None:
            log.warning("%s: back after %.0f s", what, time.monotonic() - began)
        return result
