"""The AWS operations kinesumer's code calls, read from its source, for the IAM policy tests.

A call is ``<receiver>.<operation>`` where the receiver is one of the names the library gives
its boto clients and its Kinesis transport (``CLIENT_NAMES``); a transport method is named
after the operation it makes, except ``get_epoch_records`` (GetRecords, its arrival times as
epoch seconds).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from support.tfschema import REPO_ROOT

# Names the library gives its boto clients and Kinesis transports -> IAM service prefix.
CLIENT_NAMES = {
    "_kinesis": "kinesis",
    "kinesis_client": "kinesis",  # kinesis/efo/consumers.py
    "_db": "dynamodb",
    "_dynamodb": "dynamodb",
    "dynamodb": "dynamodb",  # statestore/dynamodb/table.py: StateTable.dynamodb
    "_sts": "sts",
    "sts": "sts",
    "cloudwatch": "cloudwatch",  # cli/lag_cloudwatch.py: the lag service's PutMetricData
}
# Transport methods whose name is not the operation's.
TRANSPORT_OPERATIONS = {"get_epoch_records": "get_records"}
# A transaction's elements are authorised as their item calls: the library's own element is the
# fenced checkpoint Update on the state table (the handler's elements target the user's tables).
TRANSACTION_ACTIONS = {"dynamodb:TransactWriteItems": "dynamodb:UpdateItem"}
# Attributes of a client or a transport that are not operations (AwsKinesisTransport.client is
# the aiobotocore client under it).
NOT_OPERATIONS = {"get_waiter", "get_paginator", "can_paginate", "close", "meta", "exceptions"}
NOT_OPERATIONS |= {"client", "lean"}


def library_calls(
    under: Iterable[str],
    *,
    leave_out: tuple[str, ...] = (),
    receivers: dict[str, str] = CLIENT_NAMES,
) -> dict[str, set[str]]:
    """IAM actions of the AWS operations made in kinesumer/ folders ``under`` (relative to the
    package; "" for all of it), files starting with ``leave_out`` left out, on clients named as
    ``receivers`` says: {action: {files}}."""
    package = REPO_ROOT / "kinesumer"
    calls: dict[str, set[str]] = {}
    for folder in under:
        for path in sorted((package / folder).rglob("*.py")):
            if path.relative_to(package).as_posix().startswith(leave_out):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Attribute) or node.attr in NOT_OPERATIONS:
                    continue
                receiver = node.value
                name = (
                    receiver.attr
                    if isinstance(receiver, ast.Attribute)
                    else getattr(receiver, "id", None)
                )
                if name in receivers and not node.attr.startswith("_"):
                    method = TRANSPORT_OPERATIONS.get(node.attr, node.attr)
                    operation = "".join(part.title() for part in method.split("_"))
                    action = f"{receivers[name]}:{operation}"
                    action = TRANSACTION_ACTIONS.get(action, action)
                    calls.setdefault(action, set()).add(str(path.relative_to(REPO_ROOT)))
    return calls
