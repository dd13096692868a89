"""Testing with the ``kinesumer.testing`` pytest plugin: a moto server on a free 127.0.0.1
port per test process, the environment pointing boto3 and kinesumer at it, a stream factory, a
state table, a consumer factory, ``put`` and ``wait_for``.

    pip install "kinesumer[testing]"        # registers the plugin (pytest11 entry point)
    pytest examples/testing_fixtures.py

Each test starts with an empty local AWS. The server is one per process (session-scoped), so
under pytest-xdist each worker has its own. ``wait_for`` fails with what arrived and what did
not; ``kinesumer.testing.wait_for_async`` is its twin for pytest-asyncio tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kinesumer import Kinesumer, Record


def test_a_consumer_reads_what_was_put(
    make_stream: Callable[..., str],
    make_consumer: Callable[..., Kinesumer],
    put: Callable[..., Any],
    wait_for: Callable[..., list[Any]],
) -> None:
    stream = make_stream(shards=2, records=[b"first"])
    put(stream, [("customer-1", b"second"), ("customer-2", b"third")])
    consumer = make_consumer()
    consumer.subscribe([stream])
    wait_for([b"first", b"second", b"third"], consumer, timeout=30)


def test_a_handler_run(
    make_stream: Callable[..., str],
    make_consumer: Callable[..., Kinesumer],
    wait_for: Callable[..., list[Any]],
) -> None:
    stream = make_stream(records=[b"a", b"b"])
    consumer = make_consumer()
    handled: list[Record] = []
    runner = threading.Thread(target=consumer.run, args=([stream], handled.append))
    runner.start()
    try:
        wait_for([b"a", b"b"], handled, timeout=30)  # what the handler appended so far
    finally:
        consumer.close()  # run() returns
        runner.join()
