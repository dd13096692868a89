"""The relay's Producer puts with the lean PutRecords (kinesumer.kinesis.lean): a partial failure's
per-entry ``ErrorCode`` must reach the relay's ``refused_for_good`` as Kinesis sent it. A KMS
code (the stream's key disabled: the operator heals it) leaves the rows waiting, in order; any
other code that will not heal moves only the refused rows aside."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream
from support.outbox import Relays
from support.postgres import PostgresServer
from support.produced import by_key, read_all
from support.standins import NodeStandIn
from support.wait import wait_until

from kinesumer.outbox import PostgresOutbox


def test_a_kms_entry_code_keeps_rows_waiting_until_it_heals(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    fault_proxy: Callable[[str], FaultProxy],
    unique_name: Callable[[str], str],
) -> None:
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    refused = Fault.refuse_entries(1.0, code="KMSDisabledException")
    proxy.add_rule(refused, service="kinesis", operation="PutRecords")
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        for data in (b"a1", b"a2", b"b1"):
            outbox.publish(conn, stream, data, partition_key=data[:1].decode())
    relays.start(producer={"kinesis_endpoint": proxy.url})
    wait_until(lambda: outbox.stats().failed_attempts >= 2, what="puts refused, tried again")
    assert outbox.stats().pending == 3 and outbox.stats().dead_letters == 0
    proxy.clear()
    wait_until(relays.drained, what="the relay to empty the outbox")
    assert by_key(read_all(kinesalite.url, stream)) == {"a": [b"a1", b"a2"], "b": [b"b1"]}
    assert outbox.stats().dead_letters == 0


def test_an_entry_code_that_will_not_heal_moves_the_row_aside(
    outbox: PostgresOutbox,
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    relays: Relays,
    fault_proxy: Callable[[str], FaultProxy],
    unique_name: Callable[[str], str],
) -> None:
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    refused = Fault.refuse_entries(1.0, code="InvalidArgumentException")
    proxy.add_rule(refused, service="kinesis", operation="PutRecords", count=1)
    with psycopg.connect(postgres.conninfo) as conn, conn.transaction():
        outbox.publish(conn, stream, b"a1", partition_key="a")
    relays.start(producer={"kinesis_endpoint": proxy.url})
    wait_until(lambda: outbox.stats().dead_letters == 1, what="the row moved aside")
    with psycopg.connect(postgres.conninfo) as conn:
        row = conn.execute(f"SELECT error FROM {outbox.table}_dead").fetchone()
    assert row is not None and "InvalidArgumentException" in row[0]
    assert outbox.stats().pending == 0
