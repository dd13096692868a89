"""AWS plumbing shared by the state store, the Kinesis reader and the command line.

- :mod:`.retry`: the retry policy (tenacity, exponential backoff with jitter) and the error
  classification (throttled, transient, denied);
- :mod:`.clients`: the one client factory (DynamoDB, async and blocking; Kinesis, through a
  cross-account role when configured) and the sessions behind it;
- :mod:`.accounting`: every request counted (:class:`RequestStats`, :func:`instrument`).
"""

import typing as _typing

from .. import lazy_imports as _lazy_imports

if _typing.TYPE_CHECKING:
    from .accounting import THROTTLE_CODES, RequestStats, instrument
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
        call_with_retry,
        denied,
        error_code,
        is_denied,
        is_throttle,
        is_transient,
    )

# Bound on first use (kinesumer.lazy_imports): ``clients`` imports aioboto3 (a quarter second of
# CPU); the command line's error messages need ``retry`` only, and ``--help`` neither.
#: The lazily bound names, each with the module that defines it (relative to this package).
_LAZY_NAMES = {
    "AwsClients": ".clients",
    "ClientFactory": ".clients",
    "RequestStats": ".accounting",
    "THROTTLE_CODES": ".accounting",
    "assumed_role_session": ".clients",
    "boto_config": ".clients",
    "botocore_session": ".clients",
    "call_with_retry": ".retry",
    "denied": ".retry",
    "error_code": ".retry",
    "instrument": ".accounting",
    "is_denied": ".retry",
    "is_throttle": ".retry",
    "is_transient": ".retry",
    "parse_timestamp": ".clients",
    "session_for": ".clients",
}

if not _typing.TYPE_CHECKING:  # so that a misspelt name stays a type error
    __getattr__ = _lazy_imports.module_getattr(__name__, _LAZY_NAMES)
__dir__ = _lazy_imports.module_dir(__name__, _LAZY_NAMES)

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
