"""The ``kinesumer.testing`` pytest plugin: fixtures a user's suite takes as they are.

Registered by kinesumer's ``pytest11`` entry point, so pytest loads it wherever kinesumer is
installed (packaging has no entry point per extra); its fixtures need the ``testing`` extra
(``pip install 'kinesumer[testing]'``: moto's server), and a fixture of the same name in the
user's own conftest wins. Without the entry point (``-p no:kinesumer``): ``-p
kinesumer.testing.plugin`` or ``pytest_plugins = ["kinesumer.testing.plugin"]``. Fixtures:

- ``local_aws``: moto in server mode on a free 127.0.0.1 port, the environment pointing boto3,
  aiobotocore and kinesumer at it, and every stream and table of the previous test forgotten.
  The server itself (``kinesumer_server``) is one per process and session: under pytest-xdist,
  one per worker.
- ``make_stream(shards=1, records=())``: a new active stream, optionally with records; its name.
- ``state_table``: a new kinesumer state table; its name.
- ``kinesumer_config``: a :class:`~kinesumer.Config` on the local AWS and that table
  (``initial_position="TRIM_HORIZON"``: records put before the consumer starts are read).
- ``make_consumer(**config_changes)``: a :class:`~kinesumer.Kinesumer`, closed after the test.
- ``put(stream, records)`` and ``wait_for(expected, source, timeout=10)``: see
  :mod:`kinesumer.testing.waiting` (``wait_for_async`` there for asyncio tests).

All fixtures are synchronous, so they serve pytest-asyncio tests as well.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

# server and waiting import only the standard library. The rest of kinesumer (Config, the
# consumer: boto3, the engine) is imported inside the fixtures that use it: pytest imports this
# plugin in every session wherever kinesumer is installed, most of which use none of it.
from .server import LocalAWS
from .waiting import Putable
from .waiting import put as put_records
from .waiting import wait_for as wait_for_records

if TYPE_CHECKING:
    from ..config import Config
    from ..consumer.sync import Kinesumer

_names = itertools.count(1)


def _unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="session")
def kinesumer_server() -> Iterator[LocalAWS]:
    """moto's server for this process (session-scoped: one per pytest-xdist worker)."""
    server = LocalAWS().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def local_aws(kinesumer_server: LocalAWS, monkeypatch: pytest.MonkeyPatch) -> LocalAWS:
    """The local AWS, emptied, with the environment pointing at it for this test."""
    kinesumer_server.reset()
    for name, value in kinesumer_server.environment().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return kinesumer_server


@pytest.fixture
def make_stream(local_aws: LocalAWS) -> Callable[..., str]:
    kinesis = local_aws.client("kinesis")

    def make(shards: int = 1, records: Iterable[Putable] = (), name: str | None = None) -> str:
        stream = name or _unique("stream")
        kinesis.create_stream(StreamName=stream, ShardCount=shards)
        kinesis.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
        )
        put_records(kinesis, stream, records)
        return stream

    return make


@pytest.fixture
def state_table(local_aws: LocalAWS) -> str:
    from ..admin import create_state_table
    from ..config import Config

    table = _unique("kinesumer-state")
    create_state_table(
        Config(
            app="kinesumer-testing",
            dynamodb_table=table,
            region=local_aws.region,
            dynamodb_endpoint=local_aws.url,
            kinesis_endpoint=local_aws.url,
        )
    )
    return table


@pytest.fixture
def kinesumer_config(local_aws: LocalAWS, state_table: str) -> Config:
    from ..config import Config

    return Config(
        app=_unique("app"),
        dynamodb_table=state_table,
        region=local_aws.region,
        kinesis_endpoint=local_aws.url,
        dynamodb_endpoint=local_aws.url,
        initial_position="TRIM_HORIZON",
    )


@pytest.fixture
def make_consumer(kinesumer_config: Config) -> Iterator[Callable[..., Kinesumer]]:
    from ..consumer.sync import Kinesumer

    made: list[Kinesumer] = []

    def make(**config_changes: Any) -> Kinesumer:
        consumer = Kinesumer(kinesumer_config.replace(**config_changes))
        made.append(consumer)
        return consumer

    yield make
    for consumer in reversed(made):
        consumer.close()


@pytest.fixture
def put(local_aws: LocalAWS) -> Callable[[str, Iterable[Putable]], list[dict[str, Any]]]:
    kinesis = local_aws.client("kinesis")

    def put_to(stream: str, records: Iterable[Putable]) -> list[dict[str, Any]]:
        return put_records(kinesis, stream, records)

    return put_to


@pytest.fixture
def wait_for() -> Callable[..., list[Any]]:
    return wait_for_records
