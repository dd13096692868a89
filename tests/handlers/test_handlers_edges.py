"""The handler layer at its edges, each pinned by a test: a sink's refusal of the handler's
own writes goes through the failure policy; records a policy disposed of under a sink
move the sink's position; a blocking call on the inline runner gives up on close(); run() twice
at once, and a sink in broadcast mode, are refused; the inline fast path counts as the
invocation does. Unit-level where possible, the real engine (kinesalite + dynalite) otherwise."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import pytest
from support.group import create_stream, make_config, put, setup_table
from support.handlers import Run
from support.invocation import FAST, Failing, invocation, lease, record
from support.wait import wait_until

from kinesumer import AsyncKinesumer, ConfigError, ConsumerClosedError, Kinesumer, Record
from kinesumer.consumer.base import engine_of
from kinesumer.handlers import Block, DeadLetter, Discard, Retry, RetryLater, Stop
from kinesumer.handlers.policies import HandlerFailedError
from kinesumer.read.progress import shard_lease
from kinesumer.sinks.base import TransactionCanceledError

#: Retries a blocked handler makes without spinning a core.
SLOW = Retry(attempts=3, backoff=0.02, max_backoff=0.02)


class Sink:
    """Records every commit (end, writes); ``cancel``: the next commits are cancelled for the
    handler's own writes, as DynamoDB does when one of its conditions fails."""

    def __init__(self, cancel: int = 0) -> None:
        self.commits: list[tuple[Any, list[Any]]] = []
        self.cancel = cancel
        self.attached: list[Any] = []

    def attach(self, engine: Any) -> None:
        """Nothing to install (these tests drive no claims): remembered."""
        self.attached.append(engine)

    def _commit(self, end: Any, tx: list[Any]) -> None:
        if tx and self.cancel:
            self.cancel -= 1
            raise TransactionCanceledError("#0: ConditionalCheckFailed", [{"Code": "x"}])
        self.commits.append((end, tx))

    def transact_sync(self, lease: Any, end: Any, body: Callable[[Any], None]) -> None:
        tx: list[Any] = []
        body(tx)
        self._commit(end, tx)

    async def transact_async(
        self, lease: Any, end: Any, body: Callable[[Any], Awaitable[None]]
    ) -> None:
        tx: list[Any] = []
        await body(tx)
        self._commit(end, tx)


def writes(argument: Any, tx: list[Any]) -> None:
    tx.append(argument.sequence_number)


def test_a_cancelled_transaction_goes_through_the_policy() -> None:
    """(a) TransactionCanceledError is the handler's failure: retried, then the policy acts;
    with Stop, run() gets the cancellation itself as the handler's error."""
    sink = Sink(cancel=1)
    call, counters = invocation(writes, sink=sink, on_failure=Discard(retry=FAST))
    call.call_sync([record()], lease(), threading.Event())
    assert counters.counts == {"retried": 1, "ok": 1}
    assert sink.commits == [(("100", 0), ["100"])]
    sink = Sink(cancel=5)
    call, counters = invocation(writes, sink=sink)
    with pytest.raises(HandlerFailedError) as caught:
        call.call_sync([record()], lease(), threading.Event())
    assert isinstance(caught.value.error, TransactionCanceledError)
    assert counters.counts == {"failed": 1} and sink.commits == []


@pytest.mark.parametrize("policy", [Discard(retry=FAST), DeadLetter("dead", retry=FAST)])
def test_records_a_policy_disposed_of_move_the_sinks_position(policy: Any) -> None:
    """(b) a discarded or dead-lettered record's position is committed through the sink with
    no writes, so the next owner does not deliver it (and write its dead letter) again."""
    sink = Sink()
    call, _counters = invocation(Failing(), sink=sink, on_failure=policy)
    call.call_sync([record(seq="7")], lease(), threading.Event())
    assert sink.commits == [(("7", 0), [])]
    async_sink = Sink(cancel=5)

    async def fails(argument: Any, tx: list[Any]) -> None:
        tx.append(argument)

    made, _ = invocation(fails, sink=async_sink, on_failure=Discard(retry=FAST))
    asyncio.run(made.call_async([record(seq="8")], lease(), asyncio.Event()))
    assert async_sink.commits == [(("8", 0), [])]


def test_a_batch_under_a_sink_commits_its_end_only_once_every_record_is_done() -> None:
    """A bad payload in a batch is disposed of in its place: the records before it commit
    their own end first, the ones after it the batch's end. When the batch fails too, the end
    is committed alone after the policy acted."""
    sink = Sink()
    batch = [record(seq="1"), record(b"not json", seq="2"), record(seq="3")]
    call, _ = invocation(
        lambda values, tx: tx.extend(values),
        sink=sink,
        decode="json",
        batch=object(),
        on_failure=Discard(retry=FAST),
    )
    call.call_sync(batch, lease(), threading.Event())
    assert [end for end, _ in sink.commits] == [("1", 0), ("3", 0)]
    sink = Sink()
    call, _ = invocation(Failing(), sink=sink, batch=object(), on_failure=Discard(retry=FAST))
    call.call_sync(batch, lease(), threading.Event())
    assert sink.commits == [(("3", 0), [])]


class Engine:
    """What a thread runner reads of the engine: its batches, then closed."""

    def __init__(self, batches: list[tuple[Any, list[Record]]]) -> None:
        from kinesumer.read.delivery import Cursor
        from kinesumer.runtime.lifecycle import Lifecycle

        self.batches = batches
        self.cursor = Cursor(auto_commit=True)
        self.lifecycle = Lifecycle()
        self.state = self.lifecycle.state
        self.failure = None

    async def next_batch(self) -> tuple[Any, list[Record]]:
        if not self.batches:
            raise ConsumerClosedError("closed")
        return self.batches.pop(0)


def submit(coroutine: Any) -> Future[Any]:
    future: Future[Any] = Future()
    try:
        future.set_result(asyncio.run(coroutine))
    except BaseException as exc:
        future.set_exception(exc)
    return future


@pytest.mark.parametrize("fails_at", [None, 0, 3])
def test_the_fast_path_ends_as_the_invocation_does(fails_at: int | None) -> None:
    """The inline runner's direct call (default policy) and its call through Invocation give
    the same outcomes, counts, checkpoint, error and note."""
    from support.dispatch import lease_of
    from support.dispatch import record as numbered

    from kinesumer.handlers.options import calls_plainly, run_options
    from kinesumer.handlers.threads import ThreadRunner

    def handle(record: Record) -> None:
        if fails_at is not None and int(record.sequence_number) == fails_at:
            raise RuntimeError(f"boom at {fails_at}")

    ends = []
    for plainly in (True, False):
        options = run_options(
            handle,
            concurrency=1,
            ordering="shard",
            max_in_flight=None,
            batch=None,
            on_failure=None,
            decode=None,
            sink=None,
            name="h",
            is_async=False,
        )
        made, counters = invocation(handle, on_failure=options.on_failure, name="h")
        if not plainly:  # the runner takes the invocation's path; the invocation is the same
            options = dataclasses.replace(options, on_failure=Stop(retry=Retry(attempts=2)))
        assert calls_plainly(options) is plainly
        owned = lease_of("shard-0")
        engine: Any = Engine([(owned, [numbered(i) for i in range(3)]), (owned, [numbered(3)])])
        closes: list[bool] = []
        runner = ThreadRunner(engine, options, made, submit, closes.append, handle, counters)
        error: BaseException | None = None
        try:
            runner.run()
        except RuntimeError as exc:
            error = exc
        notes = getattr(error, "__notes__", None)
        ends.append((dict(counters.counts), owned.progress.processed, repr(error), notes, closes))
    assert ends[0] == ends[1]


# ---- on the real engine -----------------------------------------------------------------------


@pytest.fixture
def group(kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str]) -> dict[str, Any]:
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    return {"config": config, "stream": stream, "url": kinesalite.url}


def test_close_ends_a_blocked_inline_run_and_its_threads(group: dict[str, Any]) -> None:
    """Block on the inline runner (concurrency=1): close() from another thread ends run(); the
    record stays undone; no thread is left behind."""
    config, stream = group["config"], group["stream"]
    put(group["url"], stream, 0, 3)
    before = {t.ident for t in threading.enumerate()}
    calls: list[Record] = []

    def handle(record: Record) -> None:
        calls.append(record)
        raise RuntimeError("downstream is down")

    consumer = Kinesumer(config)
    run = Run(consumer, [stream], handle, on_failure=Block(retry=SLOW))
    wait_until(lambda: len(calls) >= 3, 20, "the handler blocks on the first record")
    run.stop()
    assert {int(r.data) for r in calls} == {0}
    wait_until(
        lambda: {t.ident for t in threading.enumerate()} <= before, 10, "no thread left behind"
    )


async def test_aclose_ends_a_blocked_inline_async_run(group: dict[str, Any]) -> None:
    config, stream = group["config"], group["stream"]
    put(group["url"], stream, 0, 2)
    calls: list[Record] = []

    async def handle(record: Record) -> None:
        calls.append(record)
        raise RuntimeError("downstream is down")

    consumer = AsyncKinesumer(config)
    task = asyncio.create_task(consumer.run([stream], handle, on_failure=Block(retry=SLOW)))
    while len(calls) < 3:
        assert not task.done(), task
        await asyncio.sleep(0.05)
    await consumer.aclose()
    await asyncio.wait_for(task, 20)


def test_run_twice_at_once_after_consume_or_closed_is_refused(group: dict[str, Any]) -> None:
    """Two runs (or a run and consume()) would take the same records: refused, and the first
    run goes on; a run after close() raises ConsumerClosedError."""
    config, stream = group["config"], group["stream"]
    consumer = Kinesumer(config)
    run = Run(consumer, [stream], lambda record: None)
    wait_until(lambda: engine_of(consumer).started, 20, "the first run joined")
    with pytest.raises(RuntimeError, match="running on this consumer already"):
        consumer.run([stream], lambda record: None)
    sink = Sink()
    with pytest.raises(RuntimeError, match="running on this consumer already"):
        consumer.run([stream], writes, sink=sink)
    assert sink.attached == [], "the refused run's sink hooked into the running engine"
    run.stop()
    with pytest.raises(ConsumerClosedError):
        consumer.run([stream], lambda record: None)
    other = Kinesumer(config)
    other.subscribe([stream])
    with pytest.raises(RuntimeError, match="joins the group itself"):
        other.run([stream], lambda record: None)
    other.close()


def test_close_while_run_joins_returns_quietly(group: dict[str, Any]) -> None:
    consumer = Kinesumer(config := group["config"])
    assert config.broadcast is False
    run = Run(consumer, [group["stream"]], lambda record: None)
    run.stop()  # at once: run() may still be joining; it returns without an error either way


def test_a_sink_in_broadcast_mode_is_refused(group: dict[str, Any]) -> None:
    """Broadcast has no claims, so no lease number to fence a sink's commit with; and every
    member would read a retry-later stream, handling each other's retries."""
    config = dataclasses.replace(group["config"], broadcast=True)
    consumer = Kinesumer(config)
    with pytest.raises(ConfigError, match=r"run\(sink\): broadcast"):
        consumer.run([group["stream"]], writes, sink=Sink())
    with pytest.raises(ConfigError, match=r"run\(on_failure\): every broadcast member"):
        consumer.run([group["stream"]], print, on_failure=RetryLater("retries"))
    consumer.close()


def test_an_abandoned_call_holds_its_key_and_lets_the_handoff_go() -> None:
    """A call abandoned while the run closes: its key's later records do not start before it
    (they would be handled out of order, and again by the next owner); the handoff's sweep
    gives the abandoned records up, so it does not wait out its timeout."""
    from support.dispatch import dispatch_for, lease_of
    from support.dispatch import record as numbered

    from kinesumer.handlers.policies import AbandonedError

    dispatch = dispatch_for(concurrency=2, ordering="key")
    owned = lease_of("shard-0")
    dispatch.set_batch(owned, [numbered(i, key="k") for i in range(3)])
    dispatch.admit()
    for i in range(3):
        assert owned.progress.mark_delivered(numbered(i, key="k"))
    call = dispatch.next_call(0.0)
    assert call is not None and [e.record.partition_key for e in call.items] == ["k"]
    dispatch.finished(call, AbandonedError("closing"))
    assert dispatch.next_call(0.0) is None, "the key's next record started after an abandon"
    assert owned.claim.begin_handoff()
    dispatch.sweep()
    assert not owned.progress.in_hand and dispatch.scheduler.idle


def test_a_waiting_call_gives_up_when_its_shard_is_handed_off() -> None:
    """A retry-later record waiting for its due time (or a blocked record) on a shard that is
    handed off gives up: the next owner handles it; waiting on would hold the handoff, then
    handle it on a released lease (a duplicate, out of order). A call spanning shards waits
    on (abandoning it would strand the other shard's records)."""
    from support.invocation import FakeKinesis, read_back

    from kinesumer.handlers import RetryLater
    from kinesumer.handlers.policies import AbandonedError
    from kinesumer.models import Checkpoint

    client = FakeKinesis()
    policy = RetryLater("orders-retry", delay=3600.0, retry=Retry(attempts=1))
    call, _ = invocation(Failing(), client, on_failure=policy)
    call.call_sync([record()], lease(), threading.Event())
    retry_lease = shard_lease(
        Checkpoint("orders-retry", "shardId-000000000000", owner="me", lease=1)
    )
    outcome: list[BaseException] = []

    def waits() -> None:
        try:
            call.call_sync([read_back(client, 0)], retry_lease, threading.Event())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waits, daemon=True)
    thread.start()
    assert retry_lease.claim.begin_handoff()
    thread.join(20)
    assert [type(e) for e in outcome] == [AbandonedError]
    blocked, _ = invocation(Failing(), on_failure=Block(retry=SLOW))
    blocked_lease = lease()
    blocked_lease.claim.lose()
    with pytest.raises(AbandonedError):
        blocked.call_sync([record()], blocked_lease, threading.Event())

    async def blocks_async() -> None:
        async def fails(argument: Any) -> None:
            raise RuntimeError("down")

        made, _ = invocation(fails, on_failure=Block(retry=SLOW))
        with pytest.raises(AbandonedError):
            await made.call_async([record()], blocked_lease, asyncio.Event())

    asyncio.run(blocks_async())


def test_the_inline_runner_goes_on_after_a_blocked_shard_is_handed_off() -> None:
    """concurrency=1 with Block: the shard moving away ends the blocked call (its record is the
    next owner's, nothing is left in hand to hold the handoff) and the run goes on with the
    other shards; it does not stop."""
    from support.dispatch import lease_of
    from support.dispatch import record as numbered

    from kinesumer.handlers.options import run_options
    from kinesumer.handlers.threads import ThreadRunner

    calls: list[Record] = []

    def handle(record: Record) -> None:
        calls.append(record)
        if record.shard_id == "shard-0":
            raise RuntimeError("down")

    options = run_options(
        handle,
        concurrency=1,
        ordering="shard",
        max_in_flight=None,
        batch=None,
        on_failure=Block(retry=SLOW),
        decode=None,
        sink=None,
        name="h",
        is_async=False,
    )
    made, counters = invocation(handle, on_failure=options.on_failure, name="h")
    moving, staying = lease_of("shard-0"), lease_of("shard-1")
    batches = [(moving, [numbered(0), numbered(1)]), (staying, [numbered(5, shard="shard-1")])]
    engine: Any = Engine(batches)
    runner = ThreadRunner(engine, options, made, submit, lambda discard: None, handle, counters)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            runner.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    wait_until(lambda: len(calls) >= 2, 10, "the handler blocks")
    assert moving.claim.begin_handoff()
    thread.join(20)
    assert not thread.is_alive() and errors == []
    assert not moving.progress.in_hand and moving.progress.processed is None
    assert staying.progress.processed is not None and counters.counts["ok"] == 1


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_failed_run_leaves_no_thread_and_checkpoints_nothing_at_the_failure(
    group: dict[str, Any], concurrency: int
) -> None:
    """The handler raising outside its policy: run() raises the original exception after a
    clean close, the shard's checkpoint is below the failing record, and every thread the run
    started (workers, the engine's loop) has ended."""
    from support.handlers import checkpoints

    config, stream = group["config"], group["stream"]
    put(group["url"], stream, 0, 20)
    before = {t.ident for t in threading.enumerate()}
    failing: list[Record] = []

    def handle(record: Record) -> None:
        if record.data == b"7":
            failing.append(record)
            raise KeyError("seven")

    consumer = Kinesumer(config)
    with pytest.raises(KeyError, match="seven") as caught:
        ordering = "key" if concurrency > 1 else "shard"  # 1: the inline runner
        consumer.run([stream], handle, concurrency=concurrency, ordering=ordering)
    assert any("handler" in note for note in caught.value.__notes__)
    (checkpoint,) = checkpoints(config, stream).values()
    assert checkpoint is None or checkpoint < int(failing[0].sequence_number)
    wait_until(
        lambda: {t.ident for t in threading.enumerate()} <= before, 10, "no thread left behind"
    )


@pytest.mark.parametrize(
    "policy",
    [RetryLater("orders"), DeadLetter("orders"), RetryLater("r", then=DeadLetter("orders"))],
)
def test_a_policy_writing_to_a_stream_the_run_reads_is_refused(policy: Any) -> None:
    """RetryLater("orders") on a run of "orders" would read every record as a (bad) envelope
    and send it to ``then``; a dead letter written to a stream the run reads comes back to the
    handler. Refused before anything starts."""
    from support.group import make_config

    consumer = Kinesumer(make_config("http://127.0.0.1:9", "http://127.0.0.1:9", "app", "table"))
    with pytest.raises(ConfigError, match=r"run\(on_failure\).*orders"):
        consumer.run(["orders", "other"], print, on_failure=policy)
    consumer.close()


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Retry(backoff=float("inf"), max_backoff=float("inf")), "Retry.backoff"),
        (lambda: Retry(max_backoff=float("inf")), "Retry.max_backoff"),
        (lambda: RetryLater("retries", delay=float("inf")), "RetryLater.delay"),
    ],
)
def test_an_endless_wait_is_refused(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"Config\.{field}: must be a finite"):
        make()


def test_a_discarded_last_record_moves_a_dynamodb_sinks_position(
    kinesalite: Any, moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """(a) and (b) on the real sink: a record whose transaction DynamoDB cancels for the
    handler's own condition is discarded by the policy and the run goes on; the last record of
    the shard is discarded too, and the position the sink commits (the checkpoint item) reaches
    it, so no next owner delivers it again."""
    from support.handlers import checkpoints

    from kinesumer.sinks import DynamoDBTransactions

    config = make_config(kinesalite.url, moto_url, unique_name("app"), unique_name("state"))
    setup_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 5)
    seen: list[Record] = []

    def handle(record: Record, tx: Any) -> None:
        seen.append(record)
        if record.data == b"2":  # (a): DynamoDB cancels the transaction for this condition
            missing = {"pk": "no-such-item", "sk": "none"}
            tx.check(config.dynamodb_table, missing, "attribute_exists(pk)")
        if record.data == b"4":
            raise ValueError("four is bad")

    consumer = Kinesumer(config)
    run = Run(
        consumer,
        [stream],
        handle,
        sink=DynamoDBTransactions(),
        on_failure=Discard(retry=Retry(attempts=1)),
    )
    wait_until(lambda: len(seen) >= 5, 30, "every record handled")
    last = int(seen[-1].sequence_number)
    wait_until(lambda: set(checkpoints(config, stream).values()) == {last}, 20, "position moved")
    (counts,) = consumer.stats().handled.values()
    assert counts == {"ok": 3, "discarded": 2}
    run.stop()
