"""Kinesis of several accounts and regions, in memory: one ``orders`` stream in account A's
us-east-1 (the home, given by name), A's eu-west-1 and B's us-east-1 (given by ARN), each a
:class:`~kinesumer.testing.MemoryKinesis` of its own place, behind the routing transport a member
over AWS reads through (:class:`~kinesumer.kinesis.routing.RoutingTransport`). Its places hand
out each (account, region)'s transport as ``kinesumer.kinesis.places.AccountPlaces`` does over
AWS."""

from __future__ import annotations

from collections.abc import Mapping

from kinesumer import AccountAccessError
from kinesumer.kinesis.routing import RoutingTransport
from kinesumer.kinesis.transport import KinesisTransport
from kinesumer.testing import MemoryKinesis

A = "123456789012"
B = "111111111111"
NAME = "orders"

#: The places, by tag: (account, region). ``a-us`` is the home.
PLACES = {"a-us": (A, "us-east-1"), "a-eu": (A, "eu-west-1"), "b-us": (B, "us-east-1")}
HOME = "a-us"


def arn(region: str, account: str, name: str = NAME) -> str:
    return f"arn:aws:kinesis:{region}:{account}:stream/{name}"


#: How the application names each stream: the home one by name, the others by ARN (which are
#: also their state keys, ``kinesumer.accounts.state_key``).
STREAMS = {"a-us": NAME, "a-eu": arn("eu-west-1", A), "b-us": arn("us-east-1", B)}


class MemoryPlaces:
    """The :class:`~kinesumer.kinesis.routing.Places` of the memories: None for the home,
    whose calls go to the routing transport's own Kinesis."""

    def __init__(self, memories: Mapping[str, MemoryKinesis]) -> None:
        self.by_place = {PLACES[tag]: memory for tag, memory in memories.items()}
        self.asked: set[tuple[str, str]] = set()

    async def transport(self, account: str, region: str) -> KinesisTransport | None:
        self.asked.add((account, region))
        if (account, region) == PLACES[HOME]:
            return None
        memory = self.by_place.get((account, region))
        if memory is None:
            raise AccountAccessError(
                f"no access to account {account}", account=account, action="sts:AssumeRole"
            )
        return memory


def three_places(shards: Mapping[str, int]) -> tuple[dict[str, MemoryKinesis], RoutingTransport]:
    """A memory per place with its ``orders`` stream of ``shards[tag]`` shards, and the routing
    transport over them."""
    memories = {
        tag: MemoryKinesis(account=account, region=region)
        for tag, (account, region) in PLACES.items()
    }
    for tag, memory in memories.items():
        memory.create_stream(NAME, shards=shards[tag])
    routing = RoutingTransport(memories[HOME], MemoryKinesis(), MemoryPlaces(memories))
    return memories, routing
