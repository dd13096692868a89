"""moto's DynamoDB made to keep two promises of DynamoDB's that kinesumer's fencing rests on.

- **Conditional writes are atomic.** moto answers each request on a thread of its own, and its
  DynamoDB backend checks a write's condition and then writes with nothing held in between: two
  conditional writes of one item racing on two threads can both pass (six concurrent claims of
  one shard once had three winners on a busy machine). Here moto's DynamoDB answers one request
  at a time, with one lock per process. moto's other services are left as they are: Kinesis's
  long-lived calls (SubscribeToShard) must not wait for each other.
- **A TransactWriteItems with a ClientRequestToken applies once.** DynamoDB remembers a token
  for ten minutes after its transaction succeeded: the same request again is answered with
  success and changes nothing, the same token with other items is refused
  (``IdempotentParameterMismatchException``). moto ignores the token, so a transaction whose
  answer was lost on the way (a reset connection, a read timeout on a busy machine) and that the
  client's retry sent again was applied twice: the exactly-once sink
  (:class:`kinesumer.sinks.DynamoDBTransactions`) committed a batch's records twice.

The local AWS kinesumer starts (:mod:`kinesumer.aws.local_server`: the demo,
``kinesumer local-aws``, the testing plugin) applies both, by patching moto's DynamoDB request
handler class once per process. Any process that calls :func:`serialize_dynamodb_requests`
(an application's own tests serving moto, say) gets the same; moto elsewhere is left as it is.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from typing import Any

_LOCK = threading.RLock()
_MARK = "_kinesumer_serialized"
#: How long DynamoDB remembers a transaction's ClientRequestToken after it succeeded.
TOKEN_WINDOW_S = 600.0
#: (account, region, token) -> (digest of the request, monotonic time it succeeded), oldest
#: first.
_TOKENS: OrderedDict[tuple[str, str, str], tuple[str, float]] = OrderedDict()


def serialize_dynamodb_requests() -> None:
    """Make moto's DynamoDB handler answer one request at a time in this process, and apply a
    TransactWriteItems' ClientRequestToken as DynamoDB does (idempotent). Needs moto (the
    ``testing`` extra)."""
    from moto.core.exceptions import JsonRESTError
    from moto.dynamodb.responses import DynamoHandler

    with _LOCK:
        original = DynamoHandler.call_action
        if getattr(original, _MARK, False):
            return
        transact = DynamoHandler.transact_write_items

        def call_action(self: Any) -> Any:
            with _LOCK:
                return original(self)

        def transact_write_items(self: Any) -> Any:
            token = self.body.get("ClientRequestToken")
            if not token:
                return transact(self)
            key = (str(self.current_account), str(self.region), str(token))
            request = {k: v for k, v in self.body.items() if k != "ClientRequestToken"}
            digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
            now = time.monotonic()
            while _TOKENS and now - next(iter(_TOKENS.values()))[1] > TOKEN_WINDOW_S:
                _TOKENS.popitem(last=False)
            seen = _TOKENS.get(key)
            if seen is not None:
                if seen[0] != digest:
                    raise JsonRESTError(
                        "IdempotentParameterMismatchException",
                        "The request uses the same client token as a previous, but "
                        "non-identical request.",
                    )
                return transact_result()
            result = transact(self)  # raises when cancelled: a failed token is not remembered
            _TOKENS[key] = (digest, now)
            return result

        setattr(call_action, _MARK, True)
        setattr(DynamoHandler, "transact_write_items", transact_write_items)  # noqa: B010
        setattr(DynamoHandler, "call_action", call_action)  # noqa: B010 (a class of moto's)


def transact_result() -> Any:
    """moto's answer to a TransactWriteItems that succeeded (what it answers the first time)."""
    from moto.core.responses import ActionResult

    return ActionResult({"ConsumedCapacity": [], "ItemCollectionMetrics": {}})
