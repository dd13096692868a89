"""A close that is cancelled still ends the member (kinesalite + dynalite; A's table through the
fault proxy). The close hands its shards off, and the handoff's final write retries while
DynamoDB does not answer; cancelling it there (a supervisor's shutdown timeout, a task group
torn down) left the member half closed: its heartbeat went on, so the others judged it live
and nobody read its shards while its process lived. Now it stops heartbeating and closes what
it opened; the others take its shards over after ``client_timeout``, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import Member, create_stream, datas, make_config, put
from support.group import setup_table as create_table
from support.signals import sigint_raises
from support.wait import eventually, wait_until

from kinesumer import Kinesumer, Record


async def test_a_close_cancelled_during_its_handoff_still_ends_the_member(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    table_proxy = fault_proxy(dynalite.url)
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    create_table(config)
    url, stream = kinesalite.url, unique_name("s")
    create_stream(url, stream, 1)
    produced = put(url, stream, 0, 20)
    sink: list[tuple[str, Record]] = []
    first = Member(config.replace(client_id="a", dynamodb_endpoint=table_proxy.url), [stream], sink)
    first.start()
    await eventually(lambda: len(sink) >= 20, what="A read the records")

    # Checkpoint and release writes are UpdateItems; the heartbeat is a PutItem and goes on.
    held = table_proxy.add_rule(Fault.blackhole(), service="dynamodb", operation="UpdateItem")
    closing = asyncio.create_task(first.consumer.aclose())
    await eventually(lambda: held.fired >= 1, what="the handoff's write held")
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    assert first.consumer.stats().state == "closed"

    second = Member(config.replace(client_id="b"), [stream], sink).start()
    await eventually(lambda: len(second.owned()) == 1, timeout=30, what="B took A's shard")
    produced += put(url, stream, 20, 10)
    await eventually(lambda: set(datas(sink)) >= set(produced), timeout=30, what="every record")
    held.remove()
    await second.close()
    if first.task is not None:
        first.task.cancel()
        await asyncio.gather(first.task, return_exceptions=True)


async def _cancel_at_every_await(closing: asyncio.Task[None]) -> None:
    """Cancel ``closing`` again whenever it runs (as an anyio cancel scope does, or a second
    Ctrl-C): its close is cancelled inside the handoff and then inside the shut-down too."""
    await asyncio.sleep(0)  # the close starts (CLOSING) and waits at its first await
    while not closing.done():
        closing.cancel()
        await asyncio.sleep(0)
    with contextlib.suppress(asyncio.CancelledError):
        await closing


@pytest.mark.parametrize("broadcast", [False, True], ids=["group", "broadcast"])
async def test_a_close_cancelled_again_and_again_still_closes(
    kinesalite: Any, dynalite: Any, unique_name: Callable[[str], str], broadcast: bool
) -> None:
    config = make_config(
        kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"), broadcast=broadcast
    )
    create_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 5)
    sink: list[tuple[str, Record]] = []
    member = Member(config, [stream], sink).start()
    await eventually(lambda: len(sink) >= 5, what="the records read")

    await _cancel_at_every_await(asyncio.create_task(member.consumer.aclose()))
    # Cut at its first await, the shut-down left the clients open and the state "closing"
    # for good (a later close returns at once: it is closing already).
    assert member.consumer.stats().state == "closed"
    if member.task is not None:
        member.task.cancel()
        await asyncio.gather(member.task, return_exceptions=True)


def test_a_sync_close_interrupted_during_its_handoff_still_ends_the_member(
    kinesalite: Any,
    dynalite: Any,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    # Ctrl-C (a notebook's "interrupt kernel") while Kinesumer.close() waits for its handoff.
    table_proxy = fault_proxy(dynalite.url)
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    create_table(config)
    stream = unique_name("s")
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 5)
    consumer = Kinesumer(config.replace(dynamodb_endpoint=table_proxy.url))
    consumer.subscribe([stream])
    got: list[Record] = []
    wait_until(lambda: bool(got.extend(consumer.poll(timeout=0.5))) or len(got) >= 5)

    held = table_proxy.add_rule(Fault.blackhole(), service="dynamodb", operation="UpdateItem")

    def interrupt_once_held() -> None:
        wait_until(lambda: held.fired >= 1, what="the handoff's write held")
        # A real signal: it wakes the main thread's blocked wait (interrupt_main() does not).
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=interrupt_once_held, daemon=True).start()
    # SIGINT raises KeyboardInterrupt also where the suite runs as a background job (started
    # with SIGINT ignored: Python then installs no handler of its own).
    with sigint_raises(), pytest.raises(KeyboardInterrupt):
        consumer.close()
    # Before: the close was abandoned with the stopped loop, "closing" and heartbeating on.
    assert consumer.stats().state == "closed"
    held.remove()
