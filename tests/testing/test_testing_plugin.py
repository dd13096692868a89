"""The ``kinesumer.testing`` pytest plugin, tested as a user's suite uses it: a test file run by
pytest (pytester, in a subprocess of its own) with the plugin loaded by ``-p``, the way its
``pytest11`` entry point loads it once ``kinesumer[testing]`` is installed.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
import boto3
import pytest

from kinesumer import AsyncKinesumer
from kinesumer.testing import wait_for_async


def test_consumes_what_was_put(make_stream, make_consumer, put, wait_for):
    stream = make_stream(shards=2, records=[b"a", "b"])
    put(stream, [("k", b"c"), b"d"])
    consumer = make_consumer()
    consumer.subscribe([stream])
    arrived = wait_for([b"a", b"b", b"c", b"d"], consumer, timeout=30)
    assert sorted(r.data for r in arrived) == [b"a", b"b", b"c", b"d"]


def test_boto3_without_endpoint_reaches_the_local_aws(make_stream, local_aws):
    stream = make_stream(name="same-name")
    assert stream in boto3.client("kinesis").list_streams()["StreamNames"]


def test_each_test_starts_empty(make_stream):
    assert make_stream(name="same-name") == "same-name"  # the previous test's stream is gone


async def test_async_consumer(kinesumer_config, make_stream):
    stream = make_stream(records=[b"x", b"y"])
    async with AsyncKinesumer(kinesumer_config) as consumer:
        await consumer.subscribe([stream])
        await wait_for_async([b"x", b"y"], consumer, timeout=30)


def test_missing_records_are_reported(make_stream, make_consumer, wait_for):
    stream = make_stream(records=[b"here"])
    consumer = make_consumer()
    consumer.subscribe([stream])
    wait_for([b"here", b"never-put"], consumer, timeout=3)
"""


def test_the_plugin_serves_a_users_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:kinesumer", "-p", "kinesumer.testing.plugin", "-p", "asyncio"
    )
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*RecordsDidNotArriveError: 1 of 2 expected records did not arrive within 3 s*",
            "*missing: [[]b'never-put'[]]*",
            "*arrived (1): [[]b'here'[]]*",
        ]
    )


PER_WORKER_TESTS = """
import os

import pytest


def test_each_worker_has_its_own_local_aws(make_stream, make_consumer, wait_for, local_aws):
    stream = make_stream(name="shared-name", records=[b"a", b"b"])  # one name on each worker
    consumer = make_consumer()
    consumer.subscribe([stream])
    assert sorted(r.data for r in wait_for([b"a", b"b"], consumer, timeout=30)) == [b"a", b"b"]
    with open(os.environ["SERVERS_SEEN"], "a") as seen:
        seen.write(f"{os.environ['PYTEST_XDIST_WORKER']} {local_aws.url}\\n")
"""


def test_the_plugin_serves_a_suite_run_by_pytest_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``pytest -n 2`` each worker starts its own local AWS (its session fixture): the same
    stream name created, written and consumed on both workers at once, each against its own
    server (``--dist each``: the test runs on each worker, so both are certain to run it)."""
    pytest.importorskip("xdist")
    seen = pytester.path / "servers-seen.txt"
    monkeypatch.setenv("SERVERS_SEEN", str(seen))
    pytester.makepyfile(test_workers=PER_WORKER_TESTS)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:kinesumer", "-p", "kinesumer.testing.plugin", "-p", "asyncio",
        "-n", "2", "--dist", "each",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    servers = dict(line.split() for line in seen.read_text().splitlines())
    assert len(servers) == 2, servers  # both workers ran tests ...
    assert len(set(servers.values())) == 2, servers  # ... each against its own server
