"""The PostgreSQL outbox beside the Producer alone, on one kinesalite and one local PostgreSQL.

    .venv/bin/python benchmarks/bench_outbox.py [--quick] [--records 20000] [--keys 100]

Measured, each case on a fresh 4-shard stream and a fresh outbox table, 100-byte records over
``--keys`` keys:

- **throughput**: records/s putting ``--records`` records: the Producer alone (``put`` then
  ``flush``), and one or two relays draining a table pre-filled with committed rows (from the
  relays' start to the table's last row deleted);
- **delay**: a writer commits one record per transaction at a steady pace while the relay(s)
  run; seconds from ``publish()`` to Kinesis' acknowledgement (``OutboxStats.delay_p50/p99``,
  the relays' own measure), beside the Producer's put-to-acknowledgement at the same pace;
- **publish cost**: ms per transaction of one ``INSERT`` into an application table, without and
  with one ``outbox.publish`` in the same transaction (one connection, sequential).

Relays and producers run with ``linger=0.01`` (the ``kinesumer outbox relay`` default).
kinesalite answers in about a millisecond from the same host; against AWS each round trip is
longer, and the relay, which puts a key's rows one at a time (the next after the previous one's
acknowledgement), pays it once per row of a key per cycle.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
from support.postgres import postgres_server  # noqa: E402
from support.standins import start_kinesalite  # noqa: E402

from kinesumer import Producer  # noqa: E402
from kinesumer.outbox import PostgresOutbox  # noqa: E402

SIZE = 100
SHARDS = 4
LINGER = 0.01


def payload(i: int) -> bytes:
    return (b"%d:" % i).ljust(SIZE, b"x")


class World:
    def __init__(self, kurl: str, conninfo: str) -> None:
        self.kurl, self.conninfo = kurl, conninfo
        self.client = boto3.client("kinesis", endpoint_url=kurl, region_name="us-east-1")
        self.made = 0

    def stream(self) -> str:
        self.made += 1
        name = f"bench-outbox-{os.getpid()}-{self.made}"
        self.client.create_stream(StreamName=name, ShardCount=SHARDS)
        self.client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1})
        return name

    def outbox(self) -> PostgresOutbox:
        self.made += 1
        box = PostgresOutbox(self.conninfo, table=f"bench_outbox_{self.made}")
        box.create_table()
        return box

    def producer(self) -> Producer:
        return Producer(kinesis_endpoint=self.kurl, region="us-east-1", linger=LINGER)


class Relays:
    def __init__(self, world: World, outbox: PostgresOutbox, count: int) -> None:
        self.stop = threading.Event()
        self.producers = [world.producer() for _ in range(count)]
        self.threads = [
            threading.Thread(
                target=outbox.relay, args=(p,), kwargs={"stop": self.stop, "poll_interval": 1.0}
            )
            for p in self.producers
        ]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        for producer in self.producers:
            producer.close()


def producer_alone(world: World, records: int, keys: int) -> float:
    stream = world.stream()
    with world.producer() as producer:
        started = time.perf_counter()
        for i in range(records):
            producer.put(stream, payload(i), partition_key=f"k{i % keys}")
        producer.flush()
        return records / (time.perf_counter() - started)


def relay_throughput(world: World, records: int, keys: int, count: int) -> float:
    stream, outbox = world.stream(), world.outbox()
    with psycopg.connect(world.conninfo) as conn:
        for start in range(0, records, 500):
            with conn.transaction():
                for i in range(start, min(start + 500, records)):
                    outbox.publish(conn, stream, payload(i), partition_key=f"k{i % keys}")
    started = time.perf_counter()
    relays = Relays(world, outbox, count)
    try:
        while outbox.stats().pending:
            time.sleep(0.02)
        return records / (time.perf_counter() - started)
    finally:
        relays.close()


def paced_delay(world: World, keys: int, rate: float, seconds: float, count: int) -> dict[str, Any]:
    """publish -> acknowledged through ``count`` relays (0: the Producer alone, put -> ack)."""
    stream = world.stream()
    total = int(rate * seconds)
    if count == 0:
        delays: list[float] = []
        with world.producer() as producer:
            for i in range(total):
                sent = time.monotonic()
                future = producer.put(stream, payload(i), partition_key=f"k{i % keys}")
                future.add_done_callback(lambda f, t=sent: delays.append(time.monotonic() - t))
                time.sleep(max(0.0, sent + 1 / rate - time.monotonic()))
            producer.flush()
        ordered = sorted(delays)
        return {"p50": ordered[len(ordered) // 2], "p99": ordered[int(0.99 * len(ordered))]}
    outbox = world.outbox()
    relays = Relays(world, outbox, count)
    try:
        time.sleep(1.5)  # the relays hold their partitions
        with psycopg.connect(world.conninfo) as conn:
            for i in range(total):
                begun = time.monotonic()
                with conn.transaction():
                    outbox.publish(conn, stream, payload(i), partition_key=f"k{i % keys}")
                time.sleep(max(0.0, begun + 1 / rate - time.monotonic()))
        while outbox.stats().pending:
            time.sleep(0.02)
        stats = outbox.stats()
    finally:
        relays.close()
    return {"p50": stats.delay_p50, "p99": stats.delay_p99}


def publish_cost(world: World, transactions: int) -> dict[str, float]:
    outbox = world.outbox()
    with psycopg.connect(world.conninfo) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id bigint, state text)")
        conn.commit()
        out = {}
        for label, with_outbox in (("without", False), ("with", True)):
            times = []
            for i in range(transactions):
                started = time.perf_counter()
                with conn.transaction():
                    conn.execute("INSERT INTO bench_orders VALUES (%s, 'paid')", (i,))
                    if with_outbox:
                        outbox.publish(conn, "bench-orders", payload(i), partition_key=f"o{i}")
                times.append(time.perf_counter() - started)
            out[label] = statistics.median(times) * 1000
    return out


def run(kurl: str, conninfo: str, records: int, keys: int, quick: bool) -> dict[str, Any]:
    world = World(kurl, conninfo)
    producer_alone(world, min(records, 2000), keys)  # warm-up, not reported
    throughput = {
        "producer": producer_alone(world, records, keys),
        "relay x1": relay_throughput(world, records, keys, 1),
        "relay x2": relay_throughput(world, records, keys, 2),
    }
    rate, seconds = 200.0, 3.0 if quick else 10.0
    delay = {
        "producer": paced_delay(world, keys, rate, seconds, 0),
        "relay x1": paced_delay(world, keys, rate, seconds, 1),
        "relay x2": paced_delay(world, keys, rate, seconds, 2),
    }
    cost = publish_cost(world, 500 if quick else 2000)
    return {
        "records": records,
        "keys": keys,
        "rate": rate,
        "throughput": throughput,
        "delay": delay,
        "cost": cost,
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        "",
        f"**Outbox**: {r['records']:,} records of {SIZE} B over {r['keys']} keys to {SHARDS} "
        f"shards on kinesalite, PostgreSQL on the same host; delay at {r['rate']:.0f} "
        "transactions/s of one record each (publish to acknowledgement; the Producer alone: "
        "put to acknowledgement).",
        "",
        "| path | records/s | delay p50 | delay p99 |",
        "|---|---:|---:|---:|",
    ]
    for name, rate in r["throughput"].items():
        p50, p99 = (r["delay"][name][p] * 1000 for p in ("p50", "p99"))
        lines.append(f"| {name} | {rate:,.0f} | {p50:.0f} ms | {p99:.0f} ms |")
    cost = r["cost"]
    lines += [
        "",
        f"publish() cost: {cost['without']:.2f} ms per transaction without the outbox, "
        f"{cost['with']:.2f} ms with one publish() (median, one connection).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records, shorter delays")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--keys", type=int, default=100)
    args, _ = parser.parse_known_args()  # ./scripts/bench passes run.py's options too
    records = args.records or (5_000 if args.quick else 20_000)
    kinesalite = start_kinesalite()
    try:
        with postgres_server() as server:
            print(report(run(kinesalite.url, server.conninfo, records, args.keys, args.quick)))
    finally:
        kinesalite.stop()


if __name__ == "__main__":
    main()
