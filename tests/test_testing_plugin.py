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
