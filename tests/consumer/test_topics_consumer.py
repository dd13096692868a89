"""A consumer created with ``topics=[...]`` reads those streams only, as a producer made with
``topics=`` puts to those only (issue 20, "required pre-registration of topics").

Every call that names streams (``consume``, ``subscribe`` before ``poll``, ``refresh``, ``run``,
``add_handler``), on both faces and in broadcast mode, refuses a stream outside the list, and a
:class:`~kinesumer.Topic` of another type for a listed stream, with a ConfigError that names the
call, the stream and the list, before any AWS call: the refusal tests point the consumer at a
closed port, where anything sent would fail with a connection error instead. Without
``topics=`` nothing changes. End to end, a consumer made with ``topics=[orders]`` runs
``run(orders, handler)`` and its handler gets ``Order`` values.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.group import create_stream, make_config, setup_table
from support.standins import NodeStandIn

from kinesumer import AsyncKinesumer, Config, Kinesumer, Producer, Record, Topic
from kinesumer.consumer.base import engine_of
from kinesumer.errors import ConfigError
from kinesumer.handlers import RetryLater


@dataclasses.dataclass
class Order:
    id: int
    item: str


@dataclasses.dataclass
class Payment:
    id: int


ORDERS = Topic("orders", Order)
PAYMENTS = Topic("payments", Payment)
OUTSIDE = r"'refunds' is not one of this consumer's topics \(orders, payments\); add it"


def _handle(record: Any) -> None:
    """A handler no refused call ever reaches."""


async def _handle_async(record: Any) -> None:
    """The async face's handler no refused call ever reaches."""


@pytest.fixture
def unreachable() -> Iterator[Config]:
    """A config whose AWS endpoints are a closed loopback port: a call that reached AWS before
    the topics check would fail with a connection error, not the ConfigError expected."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield make_config(url, url, "topics-app", "topics-state")


#: Each entry point of the blocking face, called with ``streams``.
SYNC_CALLS: dict[str, Callable[[Kinesumer, Any], object]] = {
    "consume": lambda consumer, streams: consumer.consume(streams),
    "subscribe": lambda consumer, streams: consumer.subscribe(streams),
    "refresh": lambda consumer, streams: consumer.refresh(streams),
    "run": lambda consumer, streams: consumer.run(streams, _handle),
    "add_handler": lambda consumer, streams: consumer.add_handler("h", _handle, streams=streams),
}


async def _async_call(consumer: AsyncKinesumer, call: str, streams: Any) -> None:
    """The async face's entry point ``call`` (``consume`` is a generator: its first step)."""
    if call == "consume":
        await consumer.consume(streams).__anext__()
    elif call == "subscribe":
        await consumer.subscribe(streams)
    elif call == "refresh":
        await consumer.refresh(streams)
    elif call == "run":
        await consumer.run(streams, _handle_async)
    else:
        consumer.add_handler("h", _handle_async, streams=streams)


@pytest.mark.parametrize("broadcast", [False, True], ids=["group", "broadcast"])
@pytest.mark.parametrize("call", list(SYNC_CALLS))
def test_blocking_face_refuses_a_stream_outside_its_topics(
    unreachable: Config, call: str, broadcast: bool
) -> None:
    config = unreachable.replace(broadcast=broadcast)
    with Kinesumer(config, topics=[ORDERS, PAYMENTS]) as consumer:
        with pytest.raises(ConfigError, match=rf"^{call}\(streams\): {OUTSIDE}"):
            SYNC_CALLS[call](consumer, ["orders", "refunds"])
        assert not engine_of(consumer).started


@pytest.mark.parametrize("broadcast", [False, True], ids=["group", "broadcast"])
@pytest.mark.parametrize("call", list(SYNC_CALLS))
async def test_async_face_refuses_a_stream_outside_its_topics(
    unreachable: Config, call: str, broadcast: bool
) -> None:
    config = unreachable.replace(broadcast=broadcast)
    async with AsyncKinesumer(config, topics=[ORDERS, PAYMENTS]) as consumer:
        with pytest.raises(ConfigError, match=rf"^{call}\(streams\): {OUTSIDE}"):
            await _async_call(consumer, call, ["orders", "refunds"])
        assert not engine_of(consumer).started


@pytest.mark.parametrize("call", ["run", "add_handler"])
def test_topics_are_checked_by_stream_and_by_type(unreachable: Config, call: str) -> None:
    """The calls that take topics: a Topic outside the list is refused like its name; a Topic
    of another type for a listed stream is refused too (the list says what the stream carries:
    the disagreement it is there to catch)."""
    with Kinesumer(unreachable, topics=[ORDERS, "payments"]) as consumer:
        with pytest.raises(ConfigError, match=rf"^{call}\(streams\): 'refunds' is not one of"):
            SYNC_CALLS[call](consumer, Topic("refunds", Order))
        with pytest.raises(
            ConfigError,
            match=rf"^{call}\(streams\): Topic\('orders', json\) is not this consumer's "
            r"topic Topic\('orders', Order\)",
        ):
            SYNC_CALLS[call](consumer, [Topic("orders")])
        assert not engine_of(consumer).started


async def test_async_run_refuses_a_topic_of_another_type(unreachable: Config) -> None:
    async with AsyncKinesumer(unreachable, topics=[ORDERS]) as consumer:
        with pytest.raises(ConfigError, match=r"^run\(streams\): Topic\('orders', Payment\)"):
            await consumer.run(Topic("orders", Payment), _handle_async)
        assert not engine_of(consumer).started


@pytest.mark.parametrize("face", [Kinesumer, AsyncKinesumer])
def test_the_topics_list_itself_is_checked(unreachable: Config, face: type[Any]) -> None:
    with pytest.raises(ConfigError, match=rf"^{face.__name__}\(topics\): must be a list"):
        face(unreachable, topics="orders")
    with pytest.raises(ConfigError, match=r"'bad name!' is not a Kinesis stream name"):
        face(unreachable, topics=["bad name!"])
    with pytest.raises(ConfigError, match="one stream, one payload type"):
        face(unreachable, topics=[ORDERS, Topic("orders", Payment)])
    assert face(unreachable, topics=["orders", ORDERS, PAYMENTS]).topics == {"orders", "payments"}
    assert face(unreachable).topics is None  # without topics=, any stream, as before


def test_typed_run_on_a_consumer_made_with_topics(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    """End to end on the blocking face: ``run(orders, handler)`` hands ``Order`` values; a
    handler added for the plain stream name gets raw records; the retry-later stream of the
    run's policy is the policy's, not checked against ``topics=``."""
    stream, retry = unique_name("orders"), unique_name("orders-retry")
    create_stream(kinesalite.url, stream, 2)
    create_stream(kinesalite.url, retry, 1)
    orders = Topic(stream, Order)
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1", topics=[orders]) as p:
        for i in range(10):
            p.put(orders, Order(i, f"item-{i}"), partition_key=f"o{i}")
    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    values: list[Any] = []
    raw: list[Any] = []
    everything = threading.Event()

    def handle(message: Any) -> None:
        values.append(message.value)

    def keep_raw(record: Any) -> None:
        raw.append(record)
        if len(raw) == 10:
            everything.set()

    consumer = Kinesumer(config, topics=[orders])
    consumer.add_handler("raw", keep_raw, streams=[stream])
    closer = threading.Thread(target=lambda: (everything.wait(120), consumer.close()))
    closer.start()
    try:
        consumer.run(orders, handle, on_failure=RetryLater(retry, delay=1.0))
    finally:
        everything.set()
        closer.join()
        consumer.close()
    assert all(isinstance(value, Order) for value in values)
    assert sorted(value.id for value in values) == list(range(10))
    assert all(isinstance(record, Record) for record in raw)


TYPED_USE = """
import dataclasses
from typing import Any, assert_type

from kinesumer import AsyncKinesumer, Kinesumer, Topic


@dataclasses.dataclass
class Order:
    id: int


orders = Topic("orders", Order)
assert_type(orders, Topic[Order])
assert_type(Topic("payments"), Topic[Any])


def handle(message: Any) -> None: ...


async def handle_async(message: Any) -> None: ...


async def use(consumer: Kinesumer, other: AsyncKinesumer) -> None:
    consumer.run(orders, handle)
    consumer.run([orders, "payments"], handle)
    consumer.add_handler("h", handle, streams=[orders])
    await other.run(orders, handle_async)
    Kinesumer(consumer_config(), topics=[orders, "payments"])


def consumer_config() -> Any: ...
"""


def test_typed_use_type_checks(tmp_path: Path) -> None:
    """What the docs show type-checks under mypy --strict: ``Topic("orders", Order)`` is a
    ``Topic[Order]`` (no annotation needed) and ``run``/``add_handler`` take topics."""
    pytest.importorskip("mypy", reason="mypy is a dev dependency, not a test one")
    (tmp_path / "typed_use.py").write_text(TYPED_USE)
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(tmp_path / "typed_use.py"),
        ],
        cwd=Path(__file__).resolve().parents[2],  # this tree's kinesumer
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
