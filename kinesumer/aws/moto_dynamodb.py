"""moto's DynamoDB answering one request at a time, so its conditional writes are atomic.

moto's server answers each request on a thread of its own, and its DynamoDB backend checks a
write's condition and then writes with nothing held in between: two conditional writes of one
item racing on two threads can both pass (six concurrent claims of one shard once had three
winners on a busy machine). DynamoDB never lets that happen, and kinesumer's fencing (claims,
checkpoints, handoffs, rewinds) rests on it. So the local AWS kinesumer starts
(:mod:`kinesumer.aws.local_server`: the demo, ``kinesumer local-aws``, the testing plugin)
serializes moto's DynamoDB requests with one lock per process. moto's other services are left
as they are: Kinesis's long-lived calls (SubscribeToShard) must not wait for each other.

It patches moto's DynamoDB request handler class, once per process; a process that imports
moto to mock DynamoDB in-process gets the same serialization, which only makes moto closer to
DynamoDB.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.RLock()
_MARK = "_kinesumer_serialized"


def serialize_dynamodb_requests() -> None:
    """Make moto's DynamoDB handler answer one request at a time in this process (idempotent).
    Needs moto (the ``testing`` extra)."""
    from moto.dynamodb.responses import DynamoHandler

    with _LOCK:
        original = DynamoHandler.call_action
        if getattr(original, _MARK, False):
            return

        def call_action(self: Any) -> Any:
            with _LOCK:
                return original(self)

        setattr(call_action, _MARK, True)
        setattr(DynamoHandler, "call_action", call_action)  # noqa: B010 (a class of moto's)
