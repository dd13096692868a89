"""Exactly-once sinks for ``run(..., sink=...)``: the handler's writes and the shard's position
commit together, fenced by the lease, or not at all.

- :class:`DynamoDBTransactions`: ``handler(record_or_batch, tx)`` adds its writes to a DynamoDB
  transaction to which the fenced checkpoint update is appended (TransactWriteItems).
- :class:`PostgresPositions`: ``handler(record_or_batch, conn)`` writes inside a PostgreSQL
  transaction that also moves the shard's position row, fenced by the lease number; the consumer
  resumes from that row (needs the ``postgres`` extra: psycopg 3).

Both raise :class:`LeaseLostError` when a member that lost the shard tries to commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    ExactlyOnceSink,
    LeaseLostError,
    SinkError,
    TransactionCanceledError,
    TransactionTooLargeError,
)
from .dynamodb import MAX_TRANSACTION_ITEMS, DynamoDBTransaction, DynamoDBTransactions

if TYPE_CHECKING:
    from .postgres import PostgresPositions

__all__ = [
    "MAX_TRANSACTION_ITEMS",
    "DynamoDBTransaction",
    "DynamoDBTransactions",
    "ExactlyOnceSink",
    "LeaseLostError",
    "PostgresPositions",
    "SinkError",
    "TransactionCanceledError",
    "TransactionTooLargeError",
]


def __getattr__(name: str) -> Any:
    # psycopg is an extra: import it only when PostgresPositions is asked for.
    if name == "PostgresPositions":
        from .postgres import PostgresPositions

        return PostgresPositions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
