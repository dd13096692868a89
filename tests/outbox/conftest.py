"""The outbox tests' fixtures: one PostgreSQL server per module, an outbox table of its own per
test, and the relays a test starts (stopped after it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.outbox import Relays
from support.postgres import PostgresServer, postgres_server
from support.standins import NodeStandIn

from kinesumer.outbox import PostgresOutbox


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def outbox(postgres: PostgresServer, unique_name: Callable[[str], str]) -> PostgresOutbox:
    box = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    box.create_table()
    return box


@pytest.fixture
def relays(outbox: PostgresOutbox, kinesalite: NodeStandIn) -> Iterator[Relays]:
    running = Relays(outbox, kinesalite.url)
    yield running
    running.close()
