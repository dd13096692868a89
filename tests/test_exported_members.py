"""The public surface, pinned (as httpx's ``tests/test_exported_members.py``).

``kinesumer.__all__`` is sorted and names exactly what the package exports; the same holds for
the public modules whose names it re-exports (``kinesumer.stats``, ``kinesumer.consumer``).
Every other package or module that declares ``__all__`` keeps it sorted and importable (the
optional ``kinesumer.spark`` among them: its contents are still moving, what it lists must
import).

"Sorted" is ruff's RUF022 order, the one the code is formatted with: ``SCREAMING_CASE``
constants, then ``CamelCase`` classes, then the rest, each group in natural order.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import types
from typing import Any

import pytest

import kinesumer
import kinesumer.consumer
import kinesumer.producer
import kinesumer.stats

#: Dunder names the package exports on purpose.
EXPORTED_DUNDERS = {"__version__"}

#: Public modules whose every name the package re-exports.
PUBLIC_MODULES: list[types.ModuleType] = [kinesumer.consumer, kinesumer.producer, kinesumer.stats]

#: Optional extras: listed modules that need a package the base install does not have.
OPTIONAL = ("kinesumer.spark",)


def ruf022_key(name: str) -> tuple[int, list[Any]]:
    if len(name) > 1 and name.isupper():
        group = 0  # SCREAMING_CASE
    elif name[:1].isupper():
        group = 1  # CamelCase
    else:
        group = 2
    natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return group, natural


def exported(package: types.ModuleType) -> list[str]:
    """The names a package's ``__init__`` really exports: its public names (bound or, for a lazy
    package, listed by its ``__dir__``), less the submodules bound as attributes by importing them
    and the ``from __future__`` features."""
    return [
        name
        for name in dir(package)
        if (not name.startswith("_") or name in EXPORTED_DUNDERS)
        and not isinstance(getattr(package, name), types.ModuleType)
        and type(getattr(package, name)).__name__
        != "_Feature"  # from __future__ import annotations
    ]


def defined_in(module: types.ModuleType) -> list[str]:
    """The public classes and functions a module defines itself (not what it imports)."""
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    ]


def declaring_modules() -> list[str]:
    """Every module of the package that declares ``__all__`` (extras included)."""
    found = []
    for info in pkgutil.walk_packages(kinesumer.__path__, "kinesumer."):
        if info.name.endswith(".__main__"):
            continue  # runs the command line when imported
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            if info.name.startswith(OPTIONAL):
                continue  # an optional extra not installed here
            raise
        if hasattr(module, "__all__"):
            found.append(info.name)
    return ["kinesumer", *found]


def test_the_package_exports_exactly_what_all_lists_sorted() -> None:
    assert kinesumer.__all__ == sorted(exported(kinesumer), key=ruf022_key)


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_a_public_modules_names_are_all_reexported_by_the_package(
    module: types.ModuleType,
) -> None:
    names = list(getattr(module, "__all__", None) or defined_in(module))
    assert names, f"{module.__name__} exports nothing"
    missing = [n for n in names if getattr(kinesumer, n, None) is not getattr(module, n)]
    assert not missing, f"{module.__name__} names not re-exported by kinesumer: {missing}"


@pytest.mark.parametrize("name", declaring_modules())
def test_every_all_is_sorted_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    listed = list(module.__all__)
    assert listed == sorted(listed, key=ruf022_key), f"{name}.__all__ is not sorted"
    assert len(set(listed)) == len(listed), f"{name}.__all__ lists a name twice"
    missing = [n for n in listed if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it does not have: {missing}"


def test_the_consumer_package_exports_exactly_the_two_faces() -> None:
    assert kinesumer.consumer.__all__ == ["AsyncKinesumer", "Kinesumer"]
    assert sorted(exported(kinesumer.consumer)) == kinesumer.consumer.__all__


def test_the_producer_package_exports_exactly_the_two_faces_and_their_results() -> None:
    assert kinesumer.producer.__all__ == [
        "AsyncProducer",
        "LatencySummary",
        "Producer",
        "ProducerStats",
        "PutResult",
    ]
    assert sorted(exported(kinesumer.producer)) == kinesumer.producer.__all__


def test_stats_defines_exactly_the_two_snapshots() -> None:
    assert sorted(defined_in(kinesumer.stats)) == ["ConsumerStats", "ShardStatus"]
