"""The order in which a run hands files out (tests/conftest.py): the files marked ``first``, then
the long ones, then the rest; and pytest-xdist kept from sorting them by their number of tests,
which put every file of one or two long tests at the end of a run, side by side."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support.long_tests import Ran, unexplained_long_tests


def _part(item: pytest.Item, long_files: set[str], first_files: set[str]) -> int:
    path = item.nodeid.split("::", 1)[0]
    return 0 if path in first_files else 1 if path in long_files else 2


def test_this_sessions_files_come_first_then_long_then_the_rest(
    request: pytest.FixtureRequest,
) -> None:
    items = request.session.items
    first_files = {i.nodeid.split("::", 1)[0] for i in items if i.get_closest_marker("first")}
    long_files = {
        i.nodeid.split("::", 1)[0]
        for i in items
        if i.get_closest_marker("slow") or "spark" in getattr(i, "fixturenames", ())
    } - first_files
    parts = [_part(i, long_files, first_files) for i in items]
    assert parts == sorted(parts)


@pytest.mark.parametrize("name", ["test_efo_group_kinesis_local", "test_efo_kinesis_local"])
def test_the_kinesis_local_efo_scenarios_are_marked_first(name: str) -> None:
    path = Path(__file__).parent / "kinesis" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"order_check_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {"first", "slow"} <= {m.name for m in module.pytestmark}


def test_xdist_keeps_the_order(request: pytest.FixtureRequest) -> None:
    pytest.importorskip("xdist")
    assert request.config.option.loadscopereorder is False


def test_a_long_call_not_marked_slow_is_listed_longest_first() -> None:
    ran = [
        Ran("a.py::short", 3.0, frozenset()),
        Ran("b.py::long_scenario", 40.0, frozenset({"slow", "b.py"})),
        Ran("c.py::long", 21.0, frozenset({"c.py"})),
        Ran("d.py::longer", 35.0, frozenset({"kinesalite"})),
        Ran("e.py::at_the_limit", 20.0, frozenset()),
    ]
    assert [r.nodeid for r in unexplained_long_tests(ran)] == ["d.py::longer", "c.py::long"]
