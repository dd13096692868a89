"""The outbox's valid rows with hostile rows and a hostile role present, beside a quiet outbox.

    .venv/bin/python benchmarks/bench_outbox_hostile.py [--seconds 10] [--rate 50]

One kinesalite, one local PostgreSQL, two relays with the defaults (batch 500, no --streams:
the worst case). Hostile, before the relays start, in a table without the CHECKs (as an older
deployment's, or a writer skipping publish()):

- 2,000 rows for a stream that does not exist (2,000 keys), 300 rows with invalid stream
  names, 10 rows with the hash key '²', 5 with 5,000 digits;
- a role with no grant on the outbox, holding every advisory lock the relays used to
  coordinate by (64 partition locks from one session, the presence lock from 63) and NOTIFYing
  the relays' channel in a loop.

A writer then commits ``--rate`` valid records a second for ``--seconds`` over 50 keys.
Printed: valid rows delivered, the relays' publish()-to-acknowledgement delay p50/p99 (their
own measure, which only valid rows have), the time from the last commit until the last valid
row was acknowledged, the relays' reads of the table, and the same without anything hostile.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

import boto3  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from support.postgres import postgres_server  # noqa: E402
from support.standins import start_kinesalite  # noqa: E402

from kinesumer import FlushError, Producer  # noqa: E402
from kinesumer.outbox import PostgresOutbox  # noqa: E402
from kinesumer.outbox.schema import Names, partition  # noqa: E402

INTRUDER = "bench_intruder"


def hostile_rows(outbox: PostgresOutbox) -> int:
    names = Names(outbox.table)
    rows: list[tuple[str, str, str | None]] = []
    rows += [("no-such-stream", f"k{i}", None) for i in range(2000)]
    rows += [(f"bad stream {i}", f"k{i}", None) for i in range(300)]
    rows += [("no-such-stream", f"h{i}", "²") for i in range(10)]
    rows += [("no-such-stream", f"d{i}", "7" * 5000) for i in range(5)]
    with psycopg.connect(outbox.conninfo) as conn, conn.transaction():
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} DROP CONSTRAINT outbox_stream_name, "
                "DROP CONSTRAINT outbox_explicit_hash_key"
            ).format(names.table)
        )
        insert = names.query(
            "INSERT INTO {table} (stream, partition_key, explicit_hash_key, data, record_id, "
            "part) VALUES (%s, %s, %s, 'x', 'r', %s)"
        )
        for stream, key, hash_key in rows:
            conn.execute(insert, (stream, key, hash_key, partition(stream, key)))
    return len(rows)


@contextlib.contextmanager
def intruder(conninfo: str, outbox: PostgresOutbox) -> Any:
    names = Names(outbox.table)
    sessions = [psycopg.connect(conninfo, autocommit=True) for _ in range(63)]
    sessions[0].execute(
        "SELECT pg_advisory_lock(%s, p) FROM generate_series(0, 63) AS p", (names.lock_class,)
    )
    for session in sessions:
        session.execute("SELECT pg_advisory_lock_shared(%s, 65535)", (names.lock_class,))
    stop = threading.Event()

    def flood() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(names.channel)))

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for session in sessions:
            session.close()


def run_case(
    kurl: str, conninfo: str, table: str, hostile: bool, rate: float, seconds: float
) -> dict[str, Any]:
    client = boto3.client("kinesis", endpoint_url=kurl, region_name="us-east-1")
    stream = f"bench-hostile-{os.getpid()}-{table}"
    client.create_stream(StreamName=stream, ShardCount=2)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
    outbox = PostgresOutbox(conninfo, table=table)
    outbox.create_table()
    planted = hostile_rows(outbox) if hostile else 0
    intruding = (
        intruder(conninfo.replace("user=kinesumer", f"user={INTRUDER}"), outbox)
        if hostile
        else contextlib.nullcontext()
    )
    stop = threading.Event()
    producers = [Producer(kinesis_endpoint=kurl, region="us-east-1", linger=0.01) for _ in "ab"]
    with intruding:
        threads = [
            threading.Thread(target=outbox.relay, args=(p,), kwargs={"stop": stop}, daemon=True)
            for p in producers
        ]
        for thread in threads:
            thread.start()
        total = int(rate * seconds)
        with psycopg.connect(conninfo) as conn:
            started = time.monotonic()
            for i in range(total):
                time.sleep(max(0.0, started + i / rate - time.monotonic()))
                with conn.transaction():
                    outbox.publish(conn, stream, b"%d" % i, partition_key=f"v{i % 50}")
        committed = time.monotonic()
        while outbox.stats().published < total and time.monotonic() - committed < 120:
            time.sleep(0.01)
        drained = time.monotonic() - committed
        stats = outbox.stats()
        reads = stats.reads
        stop.set()
        for thread in threads:
            thread.join()
    for producer in producers:
        with contextlib.suppress(FlushError):
            producer.close()
    return {
        "hostile rows": planted,
        "valid delivered": f"{stats.published}/{total}",
        "delay p50 s": stats.delay_p50,
        "delay p99 s": stats.delay_p99,
        "last commit to last ack s": round(drained, 3),
        "moved aside": stats.moved_aside,
        "pending after": stats.pending,
        "relay reads": reads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0)
    args, _ = parser.parse_known_args()
    kinesalite = start_kinesalite()
    try:
        with postgres_server() as server:
            with server.connect() as admin:
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(INTRUDER)))
            for table, hostile in (("quiet", False), ("hostile", True)):
                result = run_case(
                    kinesalite.url, server.conninfo, table, hostile, args.rate, args.seconds
                )
                print(table, result, flush=True)
    finally:
        kinesalite.stop()


if __name__ == "__main__":
    main()
