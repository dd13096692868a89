"""AWS plumbing shared by the state store, the Kinesis reader and the command line.

- :mod:`.retry`: the retry policy (tenacity, exponential backoff with jitter) and the error
  classification (throttled, transient, denied);
- :mod:`.clients`: the one client factory (DynamoDB, async and blocking; Kinesis, through a
  cross-account role when configured) and the sessions behind it;
- :mod:`.accounting`: every request counted (:class:`RequestStats`, :func:`instrument`).
"""

from .accounting import RequestStats, instrument
from .clients import (
    AwsClients,
    ClientFactory,
    assumed_role_session,
    boto_config,
    botocore_session,
    parse_timestamp,
    session_for,
)
from .retry import (
    THROTTLE_CODES,
    call_with_retry,
    denied,
    error_code,
    is_denied,
    is_throttle,
    is_transient,
)

__all__ = [
    "THROTTLE_CODES",
    "AwsClients",
    "ClientFactory",
    "RequestStats",
    "assumed_role_session",
    "boto_config",
    "botocore_session",
    "call_with_retry",
    "denied",
    "error_code",
    "instrument",
    "is_denied",
    "is_throttle",
    "is_transient",
    "parse_timestamp",
    "session_for",
]
