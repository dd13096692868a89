"""The outbox through crashes, as real processes: relays (``kinesumer outbox relay``) SIGKILLed
and restarted while writers commit and roll back, and the chained example
(``examples/outbox_chained.py``: exactly-once in through PostgresPositions, the outbox out)
SIGKILLed mid-stream and started again. PostgreSQL from tests/support/postgres.py, kinesalite,
dynalite."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.cli import Running
from support.group import create_stream, make_config, setup_table
from support.postgres import PostgresServer, postgres_server
from support.produced import by_key, kinesis, read_all
from support.standins import NodeStandIn
from support.wait import wait_until

from kinesumer.outbox import PostgresOutbox

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BATCH = 20
#: Payments into the chained example.
TOTAL = 400


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def first_occurrences(datas: list[bytes]) -> list[bytes]:
    seen: set[bytes] = set()
    return [d for d in datas if not (d in seen or seen.add(d))]


def test_relays_sigkilled_and_restarted_lose_nothing_and_keep_key_order(
    postgres: PostgresServer, kinesalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("ob")
    create_stream(kinesalite.url, stream, 2)
    outbox = PostgresOutbox(postgres.conninfo, table=unique_name("outbox").replace("-", "_"))
    outbox.create_table()
    argv = [
        *(sys.executable, "-m", "kinesumer.cli", "outbox", "relay"),
        *("--conninfo", postgres.conninfo, "--table", outbox.table, "--region", "us-east-1"),
        *("--kinesis-endpoint", kinesalite.url, "--batch-size", str(BATCH)),
        *("--poll-interval", "0.2"),
    ]

    def relay() -> Running:
        started = Running(argv)
        started.wait_for(lambda: "relaying" in started.output, 60, "the relay's start")
        return started

    relays = [relay(), relay()]
    order: dict[str, list[bytes]] = {}
    order_lock = threading.Lock()
    rolled_back: set[bytes] = set()
    done = [0]

    def writer(number: int) -> None:
        rng = random.Random(number)
        with psycopg.connect(postgres.conninfo) as conn:
            for txn in range(100):
                keys = sorted(rng.sample([f"k{i}" for i in range(10)], rng.randint(1, 3)))
                datas = [f"w{number}-t{txn}-{key}".encode() for key in keys]
                with conn.transaction():
                    for key, data in zip(keys, datas, strict=True):
                        outbox.publish(conn, stream, data, partition_key=key)
                    if rng.random() < 0.2:
                        rolled_back.update(datas)
                        raise psycopg.Rollback
                    with order_lock:  # under the keys' locks: the commit order per key
                        for key, data in zip(keys, datas, strict=True):
                            order.setdefault(key, []).append(data)
                done[0] += 1
                time.sleep(0.005)  # the writers span the relays' kills and restarts

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    try:
        for thread in writers:
            thread.start()
        kills = 0

        def published() -> int:  # committed rows the relays put and deleted so far
            with order_lock:
                committed = sum(len(datas) for datas in order.values())
            return committed - outbox.stats().pending

        for threshold in (50, 200):  # mid-stream, twice: the first relay, then its successor
            wait_until(lambda t=threshold: published() >= t, 60, f"{threshold} rows published")
            relays[0].proc.send_signal(signal.SIGKILL)
            relays[0].wait(10)
            kills += 1
            relays[0] = relay()
        for thread in writers:
            thread.join(timeout=120)
        wait_until(lambda: outbox.stats().pending == 0, 60, "the relays to empty the outbox")
        for relay in relays:  # a graceful stop: exit 0
            relay.send_signal(signal.SIGTERM)
            assert relay.wait(30) == 0, relay.errors
    finally:
        for relay in relays:
            relay.stop()
    landed = by_key(read_all(kinesalite.url, stream))
    assert {key: first_occurrences(datas) for key, datas in landed.items()} == order
    copies = Counter(d for datas in landed.values() for d in datas)
    assert not rolled_back & set(copies)
    duplicated = sum(n - 1 for n in copies.values())
    # Only a killed relay's rows sent and not yet deleted come again: one batch per kill.
    assert duplicated <= kills * BATCH, duplicated


def test_chained_example_applies_each_input_once_through_a_member_crash(
    postgres: PostgresServer,
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
) -> None:
    database = unique_name("bank").replace("-", "_")
    with postgres.connect() as conn:
        conn.execute(f"CREATE DATABASE {database}")
    conninfo = postgres.conninfo.replace("dbname=postgres", f"dbname={database}")
    app, table = unique_name("app"), unique_name("state")
    setup_table(make_config(kinesalite.url, dynalite.url, app, table))
    payments, events = unique_name("pay"), unique_name("events")
    create_stream(kinesalite.url, payments, 2)
    create_stream(kinesalite.url, events, 2)
    amounts = {i: (i * 7) % 50 + 1 for i in range(TOTAL)}
    accounts = {i: f"a-{i % 6}" for i in amounts}
    client = kinesis(kinesalite.url)
    for start in range(0, TOTAL, 100):
        entries = [
            {
                "Data": json.dumps({"id": i, "account": accounts[i], "amount": amounts[i]}),
                "PartitionKey": accounts[i],
            }
            for i in range(start, start + 100)
        ]
        assert client.put_records(StreamName=payments, Records=entries)["FailedRecordCount"] == 0
    environ = {
        **os.environ,
        "AWS_ENDPOINT_URL_KINESIS": kinesalite.url,
        "AWS_ENDPOINT_URL_DYNAMODB": dynalite.url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "KINESUMER_APP": app,
        "KINESUMER_TABLE": table,
        "KINESUMER_STREAMS": payments,
        "KINESUMER_OUTPUT": events,
        "KINESUMER_PG": conninfo,
        "KINESUMER_INITIAL_POSITION": "TRIM_HORIZON",
    }
    argv = [sys.executable, str(EXAMPLES / "outbox_chained.py")]

    def applied() -> int:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            found = conn.execute("SELECT to_regclass('applied')").fetchone()
            if found is None or found[0] is None:
                return 0
            row = conn.execute("SELECT count(*) FROM applied").fetchone()
        return 0 if row is None else int(row[0])

    member = Running(argv, env=environ)
    try:
        member.wait_for(lambda: applied() >= 25, 60, "25 payments applied")
        member.proc.send_signal(signal.SIGKILL)  # mid-stream: no handoff, no relay stop
        member.wait(10)
        member = Running(argv, env=environ)
        member.wait_for(lambda: applied() >= TOTAL, 60, "every payment applied")
        outbox = PostgresOutbox(conninfo, table="balance_outbox")
        member.wait_for(lambda: outbox.stats().pending == 0, 60, "the outbox emptied")
        member.send_signal(signal.SIGTERM)
        assert member.wait(30) == 0, member.errors
    finally:
        member.stop()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        once = conn.execute("SELECT payment, count(*) FROM applied GROUP BY payment").fetchall()
        balances = dict(conn.execute("SELECT account, balance FROM balances").fetchall())
    assert dict(once) == dict.fromkeys(amounts, 1), "each payment applied exactly once"
    expected: dict[str, int] = {}
    for i in amounts:
        expected[accounts[i]] = expected.get(accounts[i], 0) + amounts[i]
    assert balances == expected
    out = by_key(read_all(kinesalite.url, events))
    for account, datas in out.items():
        firsts = first_occurrences(datas)
        ids = [json.loads(d)["payment"] for d in firsts]
        assert ids == sorted(i for i in amounts if accounts[i] == account), account
        running = 0
        for data in firsts:  # each event carries the balance after its payment, in order
            event: dict[str, Any] = json.loads(data)
            running += amounts[event["payment"]]
            assert event["balance"] == running
    assert set(out) == set(expected)
