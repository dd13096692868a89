"""The relay's connection string, parsed once, and the redaction of its secrets from messages.

libpq's parse errors quote the string around the fault (``missing "=" after "horse" in
connection info string`` from ``password=Tr0ub4dor&3 horse``), and connection errors may quote
parts of it: no message of the outbox shows them. A string libpq cannot parse is refused at
:class:`~kinesumer.outbox.PostgresOutbox`'s construction with a message that shows none of it.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import ConfigError

#: What replaces a secret in a message.
REDACTED = "********"
#: Connection parameters whose values are secrets (libpq's names).
_SECRETS = ("password", "sslpassword", "sslkey")


class Conninfo:
    """A libpq connection string or URL, checked once; :meth:`redact` cleans messages."""

    def __init__(self, text: str, where: str = "PostgresOutbox") -> None:
        if not isinstance(text, str):
            raise ConfigError(
                "conninfo", f"a libpq connection string, got {type(text).__name__}", where
            )
        try:
            params = conninfo_to_dict(text)
        except psycopg.ProgrammingError:
            # libpq's message quotes the string around the fault: it may hold the password.
            raise ConfigError(
                "conninfo",
                "libpq cannot parse the connection string (not shown: it may hold a password); "
                "check its quoting: key=value pairs, a value with spaces in single quotes",
                where,
            ) from None
        self.text = text
        self._secrets = sorted(
            {str(params[name]) for name in _SECRETS if params.get(name)} | _url_secret(text),
            key=len,
            reverse=True,
        )

    def redact(self, message: str) -> str:
        """``message`` with every secret of the connection string (and its pieces) replaced."""
        for secret in self._secrets:
            message = message.replace(secret, REDACTED)
            for piece in secret.split():
                if len(piece) >= 3:
                    message = message.replace(piece, REDACTED)
        return message


def _url_secret(text: str) -> set[str]:
    """The password of a ``postgresql://user:password@host`` URL, as written (encoded)."""
    if "://" not in text:
        return set()
    authority = text.split("://", 1)[1].split("/", 1)[0]
    if "@" not in authority:
        return set()
    userinfo = authority.rsplit("@", 1)[0]
    return {userinfo.split(":", 1)[1]} if ":" in userinfo else set()
