"""The transport of the operator's tools (``kinesumer lag`` and its server, ``checkpoints
rewind``, ``deregister-consumer``): AWS's Kinesis, the Kinesis streams given by ARN in other
accounts and regions (:class:`~.places.AccountPlaces`: ``Config.accounts``' roles,
``kinesis_endpoints``), and DynamoDB Streams for the streams given by a table's stream ARN, as a
member reads them (:func:`~.routing.routing_over`).

The home Kinesis client opens at once (it makes no call until used); another account's or
region's, and a DynamoDB Streams client, open at their first use, so a tool reading only Kinesis
streams by name opens no other. Every client closes with the stack given.
"""

from __future__ import annotations

import contextlib

from ..aws.accounting import RequestStats
from ..aws.clients import AwsClients
from ..config import Config
from .places import AccountPlaces, places_for
from .routing import RoutingTransport, routing_over
from .transport import KinesisTransport

__all__ = ["open_tool_places", "open_tool_transport"]


async def open_tool_places(
    stack: contextlib.AsyncExitStack, config: Config
) -> tuple[RoutingTransport, AccountPlaces]:
    """The routed transport ``config`` reads through, and its places (which say where a stream
    ARN lives, and the state key it is kept under); the clients close with ``stack``."""
    aws = AwsClients(config, RequestStats())
    stack.push_async_callback(aws.close)
    await aws.open(dynamodb=False)
    places = places_for(config, aws)
    return routing_over(aws, places), places


async def open_tool_transport(stack: contextlib.AsyncExitStack, config: Config) -> KinesisTransport:
    """Kinesis and DynamoDB Streams as ``config`` says, their clients closed with ``stack``."""
    transport, _ = await open_tool_places(stack, config)
    return transport
