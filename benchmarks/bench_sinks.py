"""Exactly-once sinks side by side with plain sinks that write the same rows (same run).

    .venv/bin/python benchmarks/bench_sinks.py [--quick] [--rounds 1]

One pre-filled 4-shard kinesalite stream of ~100 B records, read from TRIM_HORIZON by a fresh
group per contender through ``Kinesumer.run(concurrency=4)`` (one call per shard at a time, as a
sink requires), one record per call and in batches of 25:

- DynamoDB: the handler adds each record to one of 50 counter items (``ADD n :n``, summed per
  counter within a batch). ``DynamoDBTransactions`` commits those updates and the fenced
  checkpoint in one TransactWriteItems; the plain handler calls ``update_item`` per counter, with
  the usual periodic checkpoints. DynamoDB is moto in server mode for both (state table and sink
  table): dynalite has no transactions. moto is far slower than DynamoDB, so the ratio says what
  a transaction costs beside plain writes on the same server, not AWS's rates.
- PostgreSQL (a local server from Debian's binaries, as the tests start it): ``PostgresPositions``
  (the handler's INSERTs and the fenced position UPDATE in one transaction) against a plain
  handler whose INSERTs commit on their own (autocommit; one transaction per batch when
  batched). The DynamoDB side is dynalite for both.

records/s from the first record handled to the last; the median of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import boto3  # noqa: E402
import psycopg  # noqa: E402
from bench_core import Clock, bench_config, fill  # noqa: E402
from support.postgres import postgres_server  # noqa: E402
from support.standins import start_dynalite, start_kinesalite, start_moto  # noqa: E402

from kinesumer import Kinesumer, Record, create_state_table  # noqa: E402
from kinesumer.handlers import Batch  # noqa: E402
from kinesumer.models import Checkpoint, Position  # noqa: E402
from kinesumer.read.progress import shard_lease  # noqa: E402
from kinesumer.sinks import DynamoDBTransactions, PostgresPositions  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

SINK_TABLE = "bench-sink"
BATCH = 25


class Counter:
    """Records handled, the clock ticked at the first and stopped at ``total``."""

    def __init__(self, total: int, clock: Clock) -> None:
        self.total, self.clock = total, clock
        self.count = 0
        self.lock = threading.Lock()
        self.enough = threading.Event()

    def add(self, n: int) -> None:
        self.clock.tick()
        with self.lock:
            self.count += n
            if self.count >= self.total and not self.enough.is_set():
                self.clock.stop()
                self.enough.set()


def run_until(config: Any, stream: str, counter: Counter, handler: Any, **options: Any) -> None:
    with Kinesumer(config) as consumer:
        closer = threading.Thread(
            target=lambda: (counter.enough.wait(), consumer.close()), daemon=True
        )
        closer.start()
        consumer.run([stream], handler, concurrency=4, **options)
        closer.join()


# -- DynamoDB ------------------------------------------------------------------------------------
#: The DynamoDB handler adds each record to one of this many counter items (``ADD n :n``): the
#: write exactly-once exists for. Few items also keep moto fast: its TransactWriteItems copies
#: every table it touches (for rollback), so a transaction's cost grows with the table's size.
COUNTERS = 50


def counter_totals(records: list[Record]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for r in records:
        key = f"c{int(r.sequence_number) % COUNTERS}"
        totals[key] = totals.get(key, 0) + 1
    return totals


def dynamodb_contenders(
    kurl: str, murl: str, stream: str, app: Callable[[], str]
) -> dict[str, Callable[[Counter], None]]:
    client = boto3.client("dynamodb", endpoint_url=murl, region_name="us-east-1")

    def exactly_once(batched: bool) -> Callable[[Counter], None]:
        def go(counter: Counter) -> None:
            def handle(records: Any, tx: Any) -> None:
                records = records if batched else [records]
                for key, n in counter_totals(records).items():
                    tx.update(SINK_TABLE, {"pk": key}, "ADD n :n", values={":n": n})
                counter.add(len(records))

            options: dict[str, Any] = {"batch": Batch(BATCH, 0.05)} if batched else {}
            sink = DynamoDBTransactions()
            run_until(
                bench_config(kurl, murl, app()), stream, counter, handle, sink=sink, **options
            )

        return go

    def plain(batched: bool) -> Callable[[Counter], None]:
        def go(counter: Counter) -> None:
            def handle(records: Any) -> None:
                records = records if batched else [records]
                for key, n in counter_totals(records).items():
                    client.update_item(
                        TableName=SINK_TABLE,
                        Key={"pk": {"S": key}},
                        UpdateExpression="ADD n :n",
                        ExpressionAttributeValues={":n": {"N": str(n)}},
                    )
                counter.add(len(records))

            options: dict[str, Any] = {"batch": Batch(BATCH, 0.05)} if batched else {}
            run_until(bench_config(kurl, murl, app()), stream, counter, handle, **options)

        return go

    return {
        "dynamodb_plain": plain(False),
        "dynamodb_exactly_once": exactly_once(False),
        "dynamodb_plain_batch": plain(True),
        "dynamodb_exactly_once_batch": exactly_once(True),
    }


# -- PostgreSQL ----------------------------------------------------------------------------------
_INSERT = "INSERT INTO bench_records (shard_id, seq, data) VALUES (%s, %s, %s)"


def pg_rows(records: list[Record]) -> list[tuple[str, str, bytes]]:
    return [(r.shard_id, r.sequence_number, r.data) for r in records]


def postgres_contenders(
    kurl: str, durl: str, conninfo: str, stream: str, app: Callable[[], str]
) -> dict[str, Callable[[Counter], None]]:
    local = threading.local()

    def connection() -> psycopg.Connection[Any]:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.connect(conninfo, autocommit=True)
        return conn

    def exactly_once(batched: bool) -> Callable[[Counter], None]:
        def go(counter: Counter) -> None:
            def handle(records: Any, conn: psycopg.Connection[Any]) -> None:
                records = records if batched else [records]
                with conn.cursor() as cursor:
                    cursor.executemany(_INSERT, pg_rows(records))
                counter.add(len(records))

            options: dict[str, Any] = {"batch": Batch(BATCH, 0.05)} if batched else {}
            sink = PostgresPositions(conninfo, table="bench_positions")
            run_until(
                bench_config(kurl, durl, app()), stream, counter, handle, sink=sink, **options
            )

        return go

    def plain(batched: bool) -> Callable[[Counter], None]:
        def go(counter: Counter) -> None:
            def one(r: Record) -> None:
                connection().execute(_INSERT, pg_rows([r])[0])
                counter.add(1)

            def many(records: list[Record]) -> None:
                conn = connection()
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.executemany(_INSERT, pg_rows(records))
                counter.add(len(records))

            config = bench_config(kurl, durl, app())
            if batched:
                run_until(config, stream, counter, many, batch=Batch(BATCH, 0.05))
            else:
                run_until(config, stream, counter, one)

        return go

    return {
        "postgres_plain": plain(False),
        "postgres_exactly_once": exactly_once(False),
        "postgres_plain_batch": plain(True),
        "postgres_exactly_once_batch": exactly_once(True),
    }


def transaction_cost(conninfo: str, rows: int = BATCH, calls: int = 300) -> dict[str, float]:
    """Milliseconds per transaction of ``rows`` INSERTs, one thread, no consumer around it:
    plain (BEGIN, INSERTs, COMMIT) and through ``PostgresPositions.transact_sync`` (plus the
    fenced position UPDATE). What the sink itself adds, apart from how calls are scheduled."""
    values = [("s", str(i), b"x" * 100) for i in range(rows)]
    sink = PostgresPositions(conninfo, table="bench_cost_positions")
    lease = shard_lease(Checkpoint("cost", "shard", owner="bench", lease=1))
    # The claim hook, through the engine seam a consumer would give it: creates the table and
    # fences the row with lease 1.
    engine = SimpleNamespace(config=SimpleNamespace(app="cost", broadcast=False), client_id="bench")
    sink.attach(engine)  # type: ignore[arg-type]
    asyncio.run(engine.claim_hook(lease))
    out: dict[str, float] = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        started = time.perf_counter()
        for _ in range(calls):
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(_INSERT, values)
        out["plain_ms"] = (time.perf_counter() - started) / calls * 1000

    def body(conn: psycopg.Connection[Any]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(_INSERT, values)

    started = time.perf_counter()
    for i in range(calls):
        sink.transact_sync(lease, Position(str(i)), body)
    out["exactly_once_ms"] = (time.perf_counter() - started) / calls * 1000
    sink.close_sync()
    return out


# -- the comparison ------------------------------------------------------------------------------
def measure(fn: Callable[[Counter], None], total: int) -> float:
    clock = Clock()
    fn(Counter(total, clock))
    assert clock.first is not None and clock.end is not None
    return (total - 1) / (clock.end[0] - clock.first[0])


def run(
    kurl: str, durl: str, murl: str, conninfo: str, quick: bool, rounds: int = 1
) -> dict[str, Any]:
    """Every contender, ``rounds`` times, alternating; medians of records/s."""
    single, batched = (300, 1_500) if quick else (1_000, 5_000)
    dynamo_stream, pg_stream = f"bench-sinks-d-{os.getpid()}", f"bench-sinks-p-{os.getpid()}"
    fill(kurl, dynamo_stream, 4, batched)
    fill(kurl, pg_stream, 4, batched)
    boto3.client("dynamodb", endpoint_url=murl, region_name="us-east-1").create_table(
        TableName=SINK_TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_records (shard_id text, seq text, data bytea)")
    apps = iter(range(1_000_000))

    def app() -> str:
        return f"bs-{os.getpid()}-{next(apps)}"

    contenders = {
        **dynamodb_contenders(kurl, murl, dynamo_stream, app),
        **postgres_contenders(kurl, durl, conninfo, pg_stream, app),
    }
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for number in range(rounds):
        for name, fn in contenders.items():
            rate = measure(fn, batched if name.endswith("_batch") else single)
            results[name].append(rate)
            print(f"  round {number + 1} {name}: {rate:,.0f} records/s", flush=True)
    rate = {name: statistics.median(got) for name, got in results.items()}
    ratios = {
        name: rate[name] / rate[name.replace("exactly_once", "plain")]
        for name in rate
        if "exactly_once" in name
    }
    return {
        "rounds": rounds,
        "batch": BATCH,
        "records_per_s": rate,
        "ratio_to_plain": ratios,
        "postgres_transaction": transaction_cost(conninfo),
    }


def report(result: dict[str, Any]) -> str:
    rate, ratio = result["records_per_s"], result["ratio_to_plain"]
    lines = [f"exactly-once sinks vs plain sinks, 4 shards (median of {result['rounds']}):"]
    for store, label in (("dynamodb", "DynamoDB (moto)"), ("postgres", "PostgreSQL")):
        for suffix, how in (("", "per record"), ("_batch", f"batches of {result['batch']}")):
            plain, exact = f"{store}_plain{suffix}", f"{store}_exactly_once{suffix}"
            lines.append(
                f"  {label + ', ' + how:<34}plain {rate[plain]:>8,.0f} records/s   "
                f"exactly-once {rate[exact]:>8,.0f} records/s  {ratio[exact]:>5.2f}x"
            )
    cost = result["postgres_transaction"]
    lines.append(
        f"  PostgreSQL, one transaction of {result['batch']} INSERTs alone: plain "
        f"{cost['plain_ms']:.2f} ms, exactly-once {cost['exactly_once_ms']:.2f} ms "
        f"({cost['exactly_once_ms'] / cost['plain_ms']:.2f}x)"
    )
    return "\n".join(lines)


def run_with_servers(kurl: str, durl: str, quick: bool, rounds: int = 1) -> dict[str, Any]:
    """:func:`run` beside kinesalite + dynalite the caller started (``bench-state`` created on
    dynalite): starts moto and PostgreSQL for it, and stops them (benchmarks/run.py's entry)."""
    moto = start_moto()
    try:
        create_state_table(bench_config(None, moto.url, "bench"))
        with postgres_server() as postgres:
            return run(kurl, durl, moto.url, postgres.conninfo, quick, rounds)
    finally:
        moto.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    kinesalite, dynalite = start_kinesalite(), start_dynalite()
    try:
        create_state_table(bench_config(None, dynalite.url, "bench"))
        result = run_with_servers(kinesalite.url, dynalite.url, args.quick, args.rounds)
    finally:
        kinesalite.stop()
        dynalite.stop()
    print(report(result))


if __name__ == "__main__":
    main()
