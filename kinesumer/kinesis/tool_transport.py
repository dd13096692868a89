"""The transport of the operator's tools (``kinesumer lag`` and its server, ``checkpoints
rewind``): AWS's Kinesis, and DynamoDB Streams for the streams given by a table's stream ARN,
as a member reads them (:class:`~.routing.RoutingTransport`).

Kinesis's client opens at once (it makes no call until used); a DynamoDB Streams client opens
at its first use, one per region of the ARNs read, so a tool reading only Kinesis streams opens
none. Every client closes with the stack given.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..aws.clients import ClientFactory
from ..config import Config
from .dynamodb_streams import DynamoDBStreamsTransport
from .routing import RoutingTransport
from .transport import KinesisTransport, transport_of

__all__ = ["open_tool_transport"]


async def open_tool_transport(stack: contextlib.AsyncExitStack, config: Config) -> KinesisTransport:
    """Kinesis and DynamoDB Streams as ``config`` says, their clients closed with ``stack``."""
    factory = ClientFactory(config)
    kinesis = await stack.enter_async_context(factory.kinesis())
    streams: dict[str, Any] = {}
    lock = asyncio.Lock()

    async def client_of(region: str) -> Any:
        async with lock:
            if region not in streams:
                streams[region] = await stack.enter_async_context(factory.dynamodb_streams(region))
            return streams[region]

    return RoutingTransport(transport_of(kinesis), DynamoDBStreamsTransport(client_of))
