"""Which tests ran long without saying why: the suite's rule is that a test over
:data:`LONG_TEST_SECONDS` is a scenario that needs the time (marked ``slow``, its docstring says
why) or is split. ``tests/conftest.py`` lists the others at the end of a run; a report, never a
failure (how long a test takes is the machine's, not the test's)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Past this (seconds, the test's call alone), a test must be a ``slow`` scenario or be split.
LONG_TEST_SECONDS = 20.0


@dataclass(frozen=True)
class Ran:
    """One test's call as a run reports it."""

    nodeid: str
    seconds: float
    markers: frozenset[str]


def unexplained_long_tests(ran: Iterable[Ran], limit: float = LONG_TEST_SECONDS) -> list[Ran]:
    """The calls over ``limit`` seconds that are not marked ``slow``, longest first."""
    over = [r for r in ran if r.seconds > limit and "slow" not in r.markers]
    return sorted(over, key=lambda r: (-r.seconds, r.nodeid))
