"""Testing a handler without any server: ``record(...)`` builds the records, ``HandlerDriver``
calls the handler through the same decoding, retries, failure policy and dead letters as
``run()``, in memory, on a clock the test moves (``RetryLater`` without waiting a minute).

    pip install "kinesumer[testing]"
    pytest examples/testing_handler.py
"""

from __future__ import annotations

from dataclasses import dataclass

from kinesumer.handlers import DeadLetter, Message, Retry, RetryLater
from kinesumer.testing import HandlerDriver, aggregate, record


@dataclass
class Order:
    id: int
    amount: int


class PaymentsDown(Exception):
    pass


charged: list[int] = []
payments_up = True


def charge(message: Message[Order]) -> None:
    """The handler under test: charges an order; refuses negative amounts."""
    if message.value.amount < 0:
        raise ValueError(f"order {message.value.id}: negative amount")
    if not payments_up:
        raise PaymentsDown("payments service unavailable")
    charged.append(message.value.id)


def test_bad_orders_go_to_the_dead_letter_stream() -> None:
    charged.clear()
    driver = HandlerDriver(
        charge, decode=Order, on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=3))
    )
    driver.deliver(
        [
            record({"id": 1, "amount": 10}),
            record({"id": 2, "amount": -5}),  # the handler refuses it, three times
            record(b"not an order"),  # does not decode: dead-lettered at once
            *aggregate([{"id": 3, "amount": 7}, {"id": 4, "amount": 1}]),  # a KPL aggregate
        ]
    )
    assert charged == [1, 3, 4]
    letters = driver.dead_letters("orders-dlq")
    assert [(letter.data, letter.attempts) for letter in letters] == [
        (b'{"id": 2, "amount": -5}', 3),
        (b"not an order", 1),
    ]
    assert driver.counts == {"ok": 3, "retried": 2, "decode_error": 1, "dead_lettered": 2}


def test_retry_later_waits_on_the_tests_clock() -> None:
    global payments_up
    charged.clear()
    payments_up = False
    policy = RetryLater("orders-retry", delay=300.0, retry=Retry(attempts=1))
    driver = HandlerDriver(charge, decode=Order, on_failure=policy)
    driver.deliver([record({"id": 9, "amount": 5})])
    assert charged == [] and len(driver.written("orders-retry")) == 1
    payments_up = True
    driver.advance(299.0)
    assert charged == []  # not due yet
    driver.advance(2.0)
    assert charged == [9]
