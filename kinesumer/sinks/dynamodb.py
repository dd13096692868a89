"""Exactly-once into DynamoDB: the handler's writes and the fenced checkpoint in one transaction.

The handler gets a :class:`DynamoDBTransaction` and adds its writes to it (any table of the
state table's account and region); :class:`DynamoDBTransactions` appends the checkpoint update
of the shard's item in the state table, conditional on ``owner`` and ``lease`` being this
member's claim (the same condition and expression every checkpoint write uses), and calls
TransactWriteItems. Either everything lands, records and position, or nothing does:

- the checkpoint's condition failed: another member claimed the shard (this one is a zombie);
  :class:`~.base.LeaseLostError`, the lease ends, nothing was written;
- a handler's write was refused (its own condition failed, or it is invalid):
  :class:`~.base.TransactionCanceledError` with DynamoDB's reasons, through the failure policy;
- a conflict with another transaction or throttling: retried here (a new transaction each time),
  and after ``attempts`` :class:`~kinesumer.errors.TransientAWSError`. Network errors and 5xx
  are retried by the library's policy with the same ``ClientRequestToken``, and so is a request
  DynamoDB finds still in progress, so a transaction that landed before its answer was lost is
  not applied twice.

Because the transactions write the positions, the engine's checkpointer writes none (only the
finished flag and the release): a periodic flush could otherwise write a position older than
one a transaction had just committed, and a crash would then deliver a record twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeSerializer
from botocore.exceptions import ClientError

from ..aws import call_with_retry, denied, error_code, is_denied
from ..errors import TransientAWSError
from ..statestore.dynamodb.codecs import checkpoint_transact_update
from .base import EngineLink, SinkError, TransactionCanceledError, TransactionTooLargeError

if TYPE_CHECKING:
    from ..models import Position
    from ..read.engine import Engine
    from ..read.progress import ShardLease

log = logging.getLogger("kinesumer.sinks")

#: TransactWriteItems' limit of elements per call; one of them is the checkpoint.
MAX_TRANSACTION_ITEMS = 100
#: Cancellation reasons that say "try again": nothing was wrong with the writes themselves.
_RETRYABLE_REASONS = frozenset(
    {
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
    }
)
_NO_REASON = (None, "None")
#: How often a worker thread waiting for its commit checks that the engine's loop still runs.
_LOOP_CHECK = 1.0


class DynamoDBTransaction:
    """The writes one handler call adds; committed with the shard's position, or not at all.

    Items, keys and ``values`` are plain Python values (str, int, Decimal, bytes, bool, None,
    lists, dicts, sets), converted by boto3's ``TypeSerializer`` (floats are refused there: use
    Decimal). :meth:`add` takes an element already in DynamoDB's low-level JSON. At most
    ``MAX_TRANSACTION_ITEMS - 1`` (99) writes: the position takes the last place.
    """

    def __init__(self) -> None:
        self.elements: list[dict[str, Any]] = []
        self._serializer = TypeSerializer()

    def __len__(self) -> int:
        return len(self.elements)

    def put(
        self,
        table: str,
        item: Mapping[str, Any],
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """PutItem ``item`` into ``table`` (if ``condition`` holds)."""
        body = {"TableName": table, "Item": self._attributes(item)}
        self.add({"Put": {**body, **self._condition(condition, names, values)}})

    def update(
        self,
        table: str,
        key: Mapping[str, Any],
        expression: str,
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """UpdateItem at ``key`` with the update ``expression`` (if ``condition`` holds)."""
        body = {"TableName": table, "Key": self._attributes(key), "UpdateExpression": expression}
        self.add({"Update": {**body, **self._condition(condition, names, values)}})

    def delete(
        self,
        table: str,
        key: Mapping[str, Any],
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """DeleteItem at ``key`` (if ``condition`` holds)."""
        body = {"TableName": table, "Key": self._attributes(key)}
        self.add({"Delete": {**body, **self._condition(condition, names, values)}})

    def check(
        self,
        table: str,
        key: Mapping[str, Any],
        condition: str,
        *,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """ConditionCheck: the whole transaction commits only if ``condition`` holds at ``key``."""
        body = {"TableName": table, "Key": self._attributes(key)}
        self.add({"ConditionCheck": {**body, **self._condition(condition, names, values)}})

    def add(self, element: dict[str, Any]) -> None:
        """One TransactItems element as DynamoDB takes it (``{"Put": {...}}``, low-level JSON)."""
        if len(self.elements) >= MAX_TRANSACTION_ITEMS - 1:
            raise TransactionTooLargeError(
                f"a handler may add at most {MAX_TRANSACTION_ITEMS - 1} writes to one "
                f"transaction (DynamoDB's limit is {MAX_TRANSACTION_ITEMS}, the position takes "
                f"one): use smaller batches (run(batch=Batch(max_size=...)))"
            )
        self.elements.append(element)

    def _attributes(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self._serializer.serialize(value) for name, value in values.items()}

    def _condition(
        self,
        condition: str | None,
        names: Mapping[str, str] | None,
        values: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if condition is not None:
            out["ConditionExpression"] = condition
        if names:
            out["ExpressionAttributeNames"] = dict(names)
        if values:
            out["ExpressionAttributeValues"] = self._attributes(values)
        return out


class DynamoDBTransactions:
    """Exactly-once sink into DynamoDB: ``run(streams, handler, sink=DynamoDBTransactions())``
    with ``handler(record_or_batch, tx: DynamoDBTransaction)``.

    The transactions go through the consumer's own DynamoDB client (its region, endpoint and
    credentials), so the handler's tables are in the state table's account and region.
    ``attempts``: transactions tried when they conflict with another one or are throttled.
    """

    def __init__(self, *, attempts: int = 6) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self._attempts = attempts
        self._link = EngineLink()
        #: Transactions committed, and refused by the fence (for tests and benchmarks).
        self.commits = 0
        self.refused = 0

    def attach(self, engine: Engine) -> None:
        self._link.attach(engine, self)
        engine.sink_writes_positions = True
        engine.claim_hook = self._on_claim

    async def _on_claim(self, lease: ShardLease) -> Position | None:
        # The claim itself read the position (the item as the claim wrote it): start there.
        self._link.on_loop()
        return None

    def transact_sync(self, lease: ShardLease, end: Position, body: Callable[[Any], None]) -> None:
        tx = DynamoDBTransaction()
        body(tx)
        loop = self._link.loop
        if loop is None:
            raise SinkError("no shard was claimed through this sink yet: nothing to commit")
        future = asyncio.run_coroutine_threadsafe(self._commit(lease, end, tx), loop)
        while True:
            try:
                future.result(timeout=_LOOP_CHECK)
                return
            except concurrent.futures.TimeoutError:
                if future.done():
                    raise  # the commit's own timeout, not the wait's
                # A loop that stopped (the consumer closed or died) would never answer.
                if loop.is_closed() or not loop.is_running():
                    future.cancel()
                    raise SinkError(
                        "the consumer's event loop stopped during the commit; whether it "
                        "landed is unknown (the next owner resumes from the checkpoint)"
                    ) from None

    async def transact_async(
        self, lease: ShardLease, end: Position, body: Callable[[Any], Awaitable[None]]
    ) -> None:
        tx = DynamoDBTransaction()
        await body(tx)
        await self._commit(lease, end, tx)

    def close_sync(self) -> None:
        """Nothing to release: the consumer's client closes with it."""

    async def close_async(self) -> None:
        """Nothing to release: the consumer's client closes with it."""

    async def _commit(self, lease: ShardLease, end: Position, tx: DynamoDBTransaction) -> None:
        """TransactWriteItems: the handler's writes, then the fenced position (on the loop)."""
        engine = self._link.require()
        config = engine.config
        position = checkpoint_transact_update(
            config.dynamodb_table, config.app, lease.claim.checkpoint, end
        )
        elements = [*tx.elements, position]
        delay = 0.05
        token = str(uuid.uuid4())
        for attempt in range(1, self._attempts + 1):
            call = partial(
                engine.aws.dynamodb.transact_write_items,
                TransactItems=elements,
                ClientRequestToken=token,  # same token across network retries
            )
            try:
                await call_with_retry("dynamodb.TransactWriteItems", call, engine.requests)
            except ClientError as exc:
                retry = self._refusal(exc, lease, len(elements))
                if error_code(exc) != "TransactionInProgressException":
                    # Cancelled: nothing landed, a new token makes a new transaction. In
                    # progress: the first request with this token may still commit, so only the
                    # same token may ask again (a new one would apply the writes twice).
                    token = str(uuid.uuid4())
                if not retry or attempt == self._attempts:
                    if retry:
                        raise TransientAWSError(
                            f"dynamodb.TransactWriteItems kept conflicting after {attempt} "
                            f"attempts: {exc}"
                        ) from exc
                    raise
                await asyncio.sleep(random.uniform(0, delay))  # full jitter
                delay = min(delay * 2, 2.0)
                continue
            self.commits += 1
            lease.claim.mark_checkpointed(end)
            return

    def _refusal(self, exc: ClientError, lease: ShardLease, count: int) -> bool:
        """Sort a refused transaction: True to try again; otherwise raise the named error
        (returns False only for errors to re-raise as they are)."""
        code = error_code(exc)
        if code == "TransactionInProgressException":
            return True
        if is_denied(exc):
            raise denied(exc, "dynamodb:TransactWriteItems", "the handler's tables") from exc
        if code != "TransactionCanceledException":
            return False
        reasons: list[dict[str, Any]] = list(exc.response.get("CancellationReasons") or [])
        codes = [r.get("Code") for r in reasons]
        if len(codes) == count and codes[-1] == "ConditionalCheckFailed":
            self.refused += 1
            raise self._link.lost(
                lease, "the checkpoint's fence refused the transaction (owner or lease changed)"
            ) from exc
        failing = [c for c in codes if c not in _NO_REASON]
        if failing and all(c in _RETRYABLE_REASONS for c in failing):
            return True
        stream, shard_id = lease.key
        raise TransactionCanceledError(
            f"DynamoDB cancelled the transaction of {stream}/{shard_id} for the handler's "
            f"writes: {', '.join(f'#{i}: {c}' for i, c in enumerate(codes) if c not in _NO_REASON)}"
            " (element numbers in the order the handler added them)",
            reasons,
        ) from exc
