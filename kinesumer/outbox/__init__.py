"""A transactional outbox in PostgreSQL: records written in the caller's transaction, put to
Kinesis by a relay (``pip install 'kinesumer[postgres]'``).

:class:`PostgresOutbox` (``outbox.py``) writes rows and runs relays; ``relay.py`` is the relay's
loop (its order and crash arguments are in its docstring); ``schema.py`` holds the tables, the
SQL and the per-key lock; ``stats.py`` what :meth:`PostgresOutbox.stats` returns.
"""

from ..errors import OutboxConnectionError, OutboxError, OutboxTableNotFoundError
from .outbox import PostgresOutbox
from .schema import PARTITIONS
from .stats import OutboxStats

__all__ = [
    "PARTITIONS",
    "OutboxConnectionError",
    "OutboxError",
    "OutboxStats",
    "OutboxTableNotFoundError",
    "PostgresOutbox",
]
