"""PostgresPositions: each record lands exactly once in a PostgreSQL table, through a rebalance,
a member killed mid-stream and a zombie's late commit (members in ``AsyncKinesumer.run``); the
claim's fence; the async face.

A real PostgreSQL (Debian's binaries, started by :mod:`support.postgres` on a loopback port for the
session) beside kinesalite + dynalite. The handler inserts one row per record into a table with
no unique key, so a duplicate would be a second row, which the test counts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.postgres import PostgresServer, postgres_server
from support.sink_driver import SinkMember, bounded
from support.standins import NodeStandIn
from support.wait import eventually

from kinesumer import AsyncKinesumer, Record
from kinesumer.consumer.base import engine_of
from kinesumer.models import Checkpoint, Position
from kinesumer.read.progress import shard_lease
from kinesumer.sinks import LeaseLostError, PostgresPositions

SHARDS = 2


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def group(
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    postgres: PostgresServer,
    unique_name: Callable[[str], str],
) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, SHARDS)
    records, positions = unique_name("records").replace("-", "_"), unique_name("positions")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {records} (shard_id text, seq text, data text)")
    return {
        "config": config,
        "stream": stream,
        "records": records,
        "positions": positions.replace("-", "_"),
        "kinesis": kinesalite.url,
    }


def recorder(table: str) -> Callable[[list[Record], psycopg.Connection[Any]], None]:
    def handle(records: list[Record], conn: psycopg.Connection[Any]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {table} (shard_id, seq, data) VALUES (%s, %s, %s)",
                [(r.shard_id, r.sequence_number, r.data.decode()) for r in records],
            )

    return handle


def async_recorder(table: str) -> Callable[[list[Record], Any], Awaitable[None]]:
    async def handle(records: list[Record], conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.cursor() as cursor:
            await cursor.executemany(
                f"INSERT INTO {table} (shard_id, seq, data) VALUES (%s, %s, %s)",
                [(r.shard_id, r.sequence_number, r.data.decode()) for r in records],
            )

    return handle


def rows(postgres: PostgresServer, table: str) -> dict[str, int]:
    """data -> rows holding it."""
    with postgres.connect() as conn:
        found = conn.execute(f"SELECT data, count(*) FROM {table} GROUP BY data").fetchall()
    return {data: count for data, count in found}


async def test_exactly_once_through_rebalance_crash_and_zombie(
    group: dict[str, Any], postgres: PostgresServer
) -> None:
    config, stream, url = group["config"], group["stream"], group["kinesis"]
    records, positions = group["records"], group["positions"]
    members: list[SinkMember] = []

    def committed(n: int) -> Callable[[], bool]:
        def check() -> bool:
            for member in members:
                member.check()
            return sum(rows(postgres, records).values()) >= n

        return check

    def member() -> SinkMember:
        sink = PostgresPositions(postgres.conninfo, table=positions)
        handle = async_recorder(records)
        made = SinkMember(config, stream, sink, handle, pace=0.02, runner=True)
        members.append(made.start())
        return made

    put(url, stream, 0, 100)
    a = member()
    await eventually(committed(100), 30, "member A committing the first 100 records")
    b = member()
    await eventually(lambda: len(a.owned()) == len(b.owned()) == 1, 30, "a rebalance to A and B")
    put(url, stream, 100, 300)
    await eventually(committed(130), 30, "both committing again")
    shard = sorted(a.owned())[0]
    old = a.engine.leases[(stream, shard)]
    await a.crash()  # mid-stream: what A read and did not commit is read again by B
    members.remove(a)
    await eventually(lambda: len(b.owned()) == SHARDS, 30, "B taking the crashed member's shard")

    def fenced() -> bool:  # B's claim hook ran: the row holds B's newer lease
        with postgres.connect() as conn:
            row = conn.execute(
                f"SELECT lease FROM {positions} WHERE app = %s AND shard_id = %s",
                (config.app, shard),
            ).fetchone()
        return row is not None and row[0] > old.claim.checkpoint.lease

    await eventually(fenced, 30, "B's claim fencing the position row")

    # A zombie: A's late commit under its old lease, after B's claim fenced the row.
    ran = threading.Event()
    with pytest.raises(LeaseLostError):
        zombie = asyncio.to_thread(
            a.sink.transact_sync, old, Position("9" * 56), lambda conn: ran.set()
        )
        await bounded(zombie, "the zombie's commit under its old lease", 30)
    assert not ran.is_set(), "a zombie's handler must not run"
    try:
        await eventually(committed(400), 60, "every record committed")
        found = rows(postgres, records)
        assert sorted(found, key=int) == [str(i) for i in range(400)]
        assert {d: n for d, n in found.items() if n != 1} == {}, "records committed twice"
    finally:
        await b.close()
        a.sink.close_sync()
        b.sink.close_sync()


async def test_claim_waits_for_a_zombie_transaction_and_resumes_after_it(
    group: dict[str, Any], postgres: PostgresServer
) -> None:
    """A zombie's transaction in flight holds the position row: the new owner's claim waits
    for it and resumes after what it committed; a later zombie commit is refused."""
    config, stream, url, records = (
        group["config"],
        group["stream"],
        group["kinesis"],
        group["records"],
    )
    positions = group["positions"]
    handle = recorder(records)
    put(url, stream, 0, 10)
    sink_a = PostgresPositions(postgres.conninfo, table=positions)
    a = SinkMember(config, stream, sink_a, handle, sync=True).start()
    await eventually(lambda: a.check() or a.committed == 10, 30, "A committing 10 records")
    leases = dict(a.engine.leases)
    await a.crash()
    put(url, stream, 10, 20)  # read by nobody yet
    # The zombie "handles" the first new records of one of its shards, and holds the position
    # row (its transaction open) while B claims the shard.
    with postgres.connect() as conn:
        shard, sequence = conn.execute(
            f"SELECT shard_id, sequence_number FROM {positions} WHERE app = %s"
            " AND sequence_number IS NOT NULL ORDER BY shard_id LIMIT 1",
            (config.app,),
        ).fetchone()
    old = leases[(stream, shard)]
    fresh = unread(url, stream, shard, Position(sequence))
    assert fresh, "no new record in the zombie's shard"
    taken = fresh[: (len(fresh) + 1) // 2]
    ahead = Position(taken[-1].sequence_number)
    inside, release = threading.Event(), threading.Event()

    def slow(conn: psycopg.Connection[Any]) -> None:
        handle(taken, conn)
        inside.set()
        release.wait(30)

    zombie = asyncio.ensure_future(asyncio.to_thread(a.sink.transact_sync, old, ahead, slow))
    await bounded(asyncio.to_thread(inside.wait, 10), "the zombie inside its transaction", 30)
    sink_b = PostgresPositions(postgres.conninfo, table=positions)
    b = SinkMember(config, stream, sink_b, handle, sync=True).start()
    try:
        claimed = lambda: b.check() or (stream, shard) in b.engine.leases  # noqa: E731
        await eventually(claimed, 30, "B claiming the zombie's shard")
        lease_b = b.engine.leases[(stream, shard)]
        assert (
            lease_b.progress.processed != ahead
        )  # B's claim hook waits behind the zombie's row lock
        release.set()
        await bounded(zombie, "the zombie's commit", 30)  # committed first: B resumes after it
        everything = lambda: b.check() or sum(rows(postgres, records).values()) >= 30  # noqa: E731
        await eventually(
            everything, 30, "every record committed", lambda: repr(rows(postgres, records))
        )
        found = rows(postgres, records)
        assert sorted(found, key=int) == [str(i) for i in range(30)]
        assert {d: n for d, n in found.items() if n != 1} == {}, "records committed twice"
        with pytest.raises(LeaseLostError):
            late = asyncio.to_thread(a.sink.transact_sync, old, ahead, lambda conn: None)
            await bounded(late, "the zombie's late commit", 30)
    finally:
        release.set()
        await b.close()
        a.sink.close_sync()
        sink_b.close_sync()


def unread(url: str, stream: str, shard: str, after: Position) -> list[Record]:
    """The records of ``shard`` after ``after``, read straight from Kinesis."""
    client = kinesis(url)
    iterator = client.get_shard_iterator(
        StreamName=stream,
        ShardId=shard,
        ShardIteratorType="AFTER_SEQUENCE_NUMBER",
        StartingSequenceNumber=after.sequence_number,
    )["ShardIterator"]
    found = client.get_records(ShardIterator=iterator)["Records"]
    return [
        Record(stream, shard, r["SequenceNumber"], 0, r["PartitionKey"], r["Data"], None)
        for r in found
    ]


async def test_async_face(group: dict[str, Any], postgres: PostgresServer) -> None:
    """transact_async over psycopg's AsyncConnection; a handler's error rolls back everything."""
    config, stream, url, records = (
        group["config"],
        group["stream"],
        group["kinesis"],
        group["records"],
    )
    sink = PostgresPositions(postgres.conninfo, table=group["positions"])

    put(url, stream, 0, 20)
    member = SinkMember(config, stream, sink, async_recorder(records)).start()
    try:
        await eventually(lambda: member.committed == 20, 30, "20 records committed")
        lease = next(x for x in member.engine.leases.values() if x.progress.processed is not None)

        async def failing(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(f"INSERT INTO {records} VALUES ('x', 'x', 'x')")
            raise RuntimeError("handler failed")

        with pytest.raises(RuntimeError, match="handler failed"):
            await bounded(sink.transact_async(lease, Position("9" * 56), failing), "a call", 30)
        assert sorted(rows(postgres, records), key=int) == [str(i) for i in range(20)]
    finally:
        await member.close()
        await bounded(sink.close_async(), "the sink closing", 30)


async def test_a_connection_lost_at_commit_is_tried_again_once(
    group: dict[str, Any], postgres: PostgresServer
) -> None:
    """PostgreSQL fails outside the handler (here the session is killed before its COMMIT): the
    transaction is tried again on a new connection and lands once; a failure inside the handler
    is the handler's, not retried by the sink."""
    config, stream, url, records = (
        group["config"],
        group["stream"],
        group["kinesis"],
        group["records"],
    )
    sink = PostgresPositions(postgres.conninfo, table=group["positions"])
    put(url, stream, 0, 6)
    member = SinkMember(config, stream, sink, recorder(records), sync=True).start()
    try:
        await eventually(lambda: member.check() or member.committed == 6, 30, "6 records")
        lease = next(x for x in member.engine.leases.values() if x.progress.processed is not None)
        end = Position("9" * 56)
        calls = []

        def killed_before_commit(conn: psycopg.Connection[Any]) -> None:
            calls.append(conn.info.backend_pid)
            conn.execute(f"INSERT INTO {records} VALUES ('x', 'x', 'marker')")
            if len(calls) == 1:
                with postgres.connect() as other:
                    other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))

        retried = asyncio.to_thread(sink.transact_sync, lease, end, killed_before_commit)
        await bounded(retried, "the call tried again", 30)
        assert len(calls) == 2 and rows(postgres, records)["marker"] == 1
        with postgres.connect() as conn:
            stored = conn.execute(
                f"SELECT sequence_number FROM {group['positions']} WHERE app = %s"
                " AND shard_id = %s",
                (config.app, lease.key[1]),
            ).fetchone()
        assert stored == (end.sequence_number,)

        def broken(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

        with pytest.raises(psycopg.OperationalError):
            failing = asyncio.to_thread(sink.transact_sync, lease, Position("9" * 57), broken)
            await bounded(failing, "a call whose handler kills its session", 30)
    finally:
        await member.close()
        sink.close_sync()


async def test_a_claim_asked_again_and_a_close_during_a_call(
    group: dict[str, Any], postgres: PostgresServer
) -> None:
    """The claim's fence asked again by the same claim (its first answer was lost) gets the row
    back instead of a refusal; a connection in use while the sink closes (a call the run did not
    wait for) is closed when it comes back, not pooled and left open."""
    opened: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        opened.append(psycopg.connect(postgres.conninfo))
        return opened[-1]

    sink = PostgresPositions(connect, table=group["positions"])
    engine = engine_of(AsyncKinesumer(group["config"]))  # never started: only its hook is used
    sink.attach(engine)
    hook = engine.claim_hook
    assert hook is not None
    lease = shard_lease(Checkpoint(group["stream"], "shardId-000000000000", owner="m", lease=3))
    assert await hook(lease) is None
    assert await hook(lease) is None and sink.refused == 0 and lease.claim.deliverable
    end = Position("4" * 56, 2)
    await asyncio.to_thread(sink.transact_sync, lease, end, lambda conn: sink.close_sync())
    assert await hook(lease) == end
    # An older lease (another member claimed since, or DynamoDB's item was deleted and its lease
    # numbers started again) is refused, naming who holds the row.
    lost: list[str] = []
    engine.checkpointer = SimpleNamespace(lose=lambda lease, why: lost.append(why))  # type: ignore[assignment]
    older = shard_lease(Checkpoint(group["stream"], "shardId-000000000000", owner="m", lease=1))
    assert await hook(older) is None and sink.refused == 1
    assert "holds lease 3 (owner " in lost[0] and "deleted" in lost[0]
    assert opened and all(conn.closed for conn in opened)


async def test_a_cancelled_call_leaves_no_row_lock_behind(
    group: dict[str, Any], postgres: PostgresServer
) -> None:
    """A call cancelled inside its transaction (a crashed member's task, a run cancelled) rolls
    back or closes its session: the position row is free at once, never held by a session left
    open (the next owner's claim fence would wait on it forever)."""
    positions, app = group["positions"], group["config"].app
    sink = PostgresPositions(postgres.conninfo, table=positions)
    engine = engine_of(AsyncKinesumer(group["config"]))  # never started: only its hook is used
    sink.attach(engine)
    hook = engine.claim_hook
    assert hook is not None
    lease = shard_lease(Checkpoint(group["stream"], "shardId-000000000000", owner="m", lease=1))
    assert await hook(lease) is None
    inside = asyncio.Event()

    async def in_python(conn: psycopg.AsyncConnection[Any]) -> None:
        inside.set()
        await asyncio.Event().wait()

    async def in_a_statement(conn: psycopg.AsyncConnection[Any]) -> None:
        inside.set()
        await conn.execute("SELECT pg_sleep(60)")

    for body in (in_python, in_a_statement):
        inside.clear()
        call = asyncio.create_task(sink.transact_async(lease, Position("1" * 56), body))
        await bounded(inside.wait(), "the call inside its transaction", 30)
        with pytest.raises(psycopg.errors.LockNotAvailable):
            lock_row(postgres, positions, app)  # the check can fail: the call holds the row
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bounded(call, f"the call cancelled in {body.__name__} ending", 30)
        lock_row(postgres, positions, app)
    await bounded(sink.close_async(), "the sink closing", 30)


def lock_row(postgres: PostgresServer, positions: str, app: str) -> None:
    """Lock the app's position row at once (NOWAIT), or raise LockNotAvailable."""
    with postgres.connect() as conn:
        row = conn.execute(
            f"SELECT 1 FROM {positions} WHERE app = %s FOR UPDATE NOWAIT", (app,)
        ).fetchone()
        assert row is not None, "the position row is missing"
