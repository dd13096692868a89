"""Fixtures shared by the whole test suite: fake AWS credentials, local stand-ins, fault proxies.

Why these shapes:

* Credentials are faked for the whole session, and every way boto3 could find real ones (profile,
  config files, instance metadata) or a real endpoint (``AWS_ENDPOINT_URL*``) is cut off, so no
  test can reach AWS even by mistake.
* Servers are session-scoped because starting them costs time (moto ~1 s for its imports, node
  servers ~0.2 s each); tests share them and avoid collisions through :func:`unique_name`, and
  moto (whose state is global) is reset per test through :func:`moto_url`.
* Every server and proxy is stopped in a ``finally``, by its own pid / thread, even when tests
  fail.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.faultproxy import FaultProxy
from support.group import make_config, setup_table
from support.long_tests import LONG_TEST_SECONDS, Ran, unexplained_long_tests
from support.standins import (
    KinesisLocalStandIn,
    MotoStandIn,
    NodeStandIn,
    start_dynalite,
    start_kinesalite,
    start_kinesis_local,
    start_moto,
)

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # Never query the EC2/ECS metadata endpoints for credentials or region.
    "AWS_EC2_METADATA_DISABLED": "true",
    # A developer's ~/.aws files could name a credential_process, SSO or endpoint_url.
    "AWS_CONFIG_FILE": "/nonexistent/kinesumer-tests/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/kinesumer-tests/aws-credentials",
}
"""Environment every test runs in."""

_UNSET_AWS_ENV_PREFIXES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",  # also AWS_ENDPOINT_URL_<SERVICE>
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
)
"""Variables that could point boto3 at real credentials or a real endpoint."""

_NAME_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")

_NODE_FIXTURES = frozenset({"kinesalite", "dynalite", "kinesis_local"})


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``first`` marker, and keep pytest-xdist to the file order set below.

    pytest-xdist (3.x) with ``--dist loadfile`` sorts the files by their number of tests before
    handing them out, unless ``--no-loadscope-reorder`` is given: the order chosen in
    :func:`pytest_collection_modifyitems` would be undone (files of one or two long tests, most
    scenarios among them, would all run last, side by side).
    """
    config.addinivalue_line(
        "markers",
        "first: a scenario that keeps about a core busy while it runs (member processes, "
        "kinesis-local); its file is handed out first, before the other files load the machine",
    )
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """After the slowest durations: the tests whose call ran over
    :data:`support.long_tests.LONG_TEST_SECONDS` and are not marked ``slow`` (a scenario that
    needs the time says why in its docstring and is marked so; any other test is split)."""
    reports = [
        r
        for outcome in ("passed", "failed")
        for r in terminalreporter.stats.get(outcome, [])
        if getattr(r, "when", None) == "call"
    ]
    over = unexplained_long_tests(Ran(r.nodeid, r.duration, frozenset(r.keywords)) for r in reports)
    if over:
        terminalreporter.write_sep(
            "=", f"over {LONG_TEST_SECONDS:.0f} s and not marked slow: split, or mark and say why"
        )
        for r in over:
            terminalreporter.write_line(f"{r.seconds:6.1f}s {r.nodeid}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the node servers ``kinesalite``, so ``-m`` can select them; and
    move the files marked ``first``, then the files that run long, to the front.

    The order is for pytest-xdist (``./scripts/test`` runs ``--dist loadfile``): it hands whole
    files to workers in this order (:func:`pytest_configure` keeps it from reordering them), so
    the long ones (a Spark session per file, the ``slow`` scenarios) start first and the short
    ones fill in around them, instead of one worker starting a Spark file while the others have
    finished. The ``first`` files go before them: their tests' length is the CPU they get, not
    a timer (the kinesis-local EFO scenarios keep about 0.7 of a core busy for their whole run:
    kinesis-local, the member processes, the test; they took 2 to 3.5 times as long as alone at
    a load of 8 to 13, and up to 6.5 times in full runs), and at the start of a run only each
    other run beside them. Within each part the order is as collected, so a file's tests keep
    their order.
    """
    first_files: set[str] = set()
    long_files: set[str] = set()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if _NODE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.kinesalite)
        path = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("first") is not None:
            first_files.add(path)
        elif "spark" in fixtures or item.get_closest_marker("slow") is not None:
            long_files.add(path)

    def part(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return 0 if path in first_files else 1 if path in long_files else 2

    items.sort(key=part)


@pytest.fixture(scope="session", autouse=True)
def fake_aws_environment() -> Iterator[None]:
    """Fake credentials and region for the whole session; no AWS profile or endpoint override."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(_UNSET_AWS_ENV_PREFIXES):
                patch.delenv(name, raising=False)
        for name, value in FAKE_AWS_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoStandIn]:
    """moto in server mode (all services) on a loopback port, shared by the session."""
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_url(moto_server: MotoStandIn) -> str:
    """The moto server's URL, with all moto state reset before the test."""
    moto_server.reset()
    return moto_server.url


@pytest.fixture(scope="session")
def kinesalite() -> Iterator[NodeStandIn]:
    """In-memory kinesalite on a loopback port, shared by the session.

    Streams outlive the test that made them: name them with :func:`unique_name` and do not
    expect ``list_streams`` to be empty.
    """
    server = start_kinesalite()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def dynalite() -> Iterator[NodeStandIn]:
    """In-memory dynalite on a loopback port, shared by the session.

    Tables outlive the test that made them: name them with :func:`unique_name` and do not
    expect ``list_tables`` to be empty.
    """
    server = start_dynalite()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kinesis_local() -> Iterator[KinesisLocalStandIn]:
    """kinesis-local (enhanced fan-out: RegisterStreamConsumer, SubscribeToShard over HTTP/2
    on its plain port), shared by the session; name streams with :func:`unique_name`."""
    server = start_kinesis_local()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _issued_names() -> set[str]:
    return set()


@pytest.fixture
def unique_name(_issued_names: set[str]) -> Callable[[str], str]:
    """``unique_name(prefix)`` -> ``prefix-<8 hex>``, never repeated in the session.

    The result is a valid Kinesis stream name and DynamoDB table name (``[A-Za-z0-9_.-]``, 3 to
    128 characters), so tests sharing the session's kinesalite/dynalite never collide.
    """

    def make(prefix: str) -> str:
        if not _NAME_PREFIX.match(prefix):
            raise ValueError(
                f"prefix {prefix!r} must be 1-100 characters of letters, digits, '_', '.', '-'"
            )
        while True:
            name = f"{prefix}-{uuid.uuid4().hex[:8]}"
            if name not in _issued_names:
                _issued_names.add(name)
                return name

    return make


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[str], FaultProxy]]:
    """Factory ``fault_proxy(upstream_url) -> FaultProxy``; every proxy is stopped at teardown."""
    proxies: list[FaultProxy] = []

    def make(upstream_url: str) -> FaultProxy:
        proxy = FaultProxy(upstream_url)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.stop()


@pytest.fixture
def proxied(
    kinesalite: NodeStandIn,
    dynalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> dict[str, Any]:
    """A table and a stream name on kinesalite + dynalite, reached through a fault proxy each
    (``kinesis`` / ``dynamodb``); ``url`` is kinesalite itself, for setting up unhindered."""
    kinesis_proxy, dynamodb_proxy = fault_proxy(kinesalite.url), fault_proxy(dynalite.url)
    config = make_config(
        kinesis_proxy.url, dynamodb_proxy.url, unique_name("app"), unique_name("state")
    )
    setup_table(config.replace(dynamodb_endpoint=dynalite.url))
    return {
        "url": kinesalite.url,
        "config": config,
        "stream": unique_name("s"),
        "kinesis": kinesis_proxy,
        "dynamodb": dynamodb_proxy,
    }
