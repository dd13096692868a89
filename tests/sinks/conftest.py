"""The sink tests' fixture: a group on kinesalite with its state table, a stream and a sink table
on moto (DynamoDB transactions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.group import create_stream, make_config, setup_table
from support.sinks import SHARDS, sink_table
from support.standins import NodeStandIn


@pytest.fixture
def group(
    kinesalite: NodeStandIn, moto_url: str, unique_name: Callable[[str], str]
) -> dict[str, Any]:
    config = make_config(kinesalite.url, moto_url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream, table = unique_name("s"), unique_name("sink")
    create_stream(kinesalite.url, stream, SHARDS)
    sink_table(moto_url, table)
    return {"config": config, "stream": stream, "table": table, "kinesis": kinesalite.url}
