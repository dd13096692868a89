"""A package's re-exported names, imported on first use (PEP 562) instead of with the package.

Importing any module of kinesumer first runs the ``__init__`` of every package above it. Those
re-export their API for ``from kinesumer import Kinesumer``; imported eagerly, that would make
every process pay for the engine, the consumers, the producer and boto3 even when it needs one
small module: each Spark worker that unpickles a partition, the command line at every start,
and every pytest session where kinesumer is installed (its plugin is loaded by entry point).

A package declares what it re-exports in three places that tests keep in step
(``tests/test_lazy_imports.py``): ``__all__``; imports under ``if TYPE_CHECKING:``, which are
what mypy, IDEs and the API reference (griffe) read; and a mapping of each name to its module,
which ``module_getattr`` imports from on first access and then binds on the package, so later
accesses are plain attribute reads::

    if TYPE_CHECKING:
        from .config import Config
    _LAZY_NAMES = {"Config": ".config"}
    if not TYPE_CHECKING:  # unknown names stay type errors: no __getattr__ for mypy to see
        __getattr__ = module_getattr(__name__, _LAZY_NAMES)
    __dir__ = module_dir(__name__, _LAZY_NAMES)

This module imports only the standard library.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module


def module_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each of ``names`` imported from its module
    (relative to ``package``) when first read, then bound on the package."""

    def __getattr__(name: str) -> object:
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module_name, package), name)
        setattr(sys.modules[package], name, value)  # the next read does not come here
        return value

    return __getattr__


def module_dir(package: str, names: Mapping[str, str]) -> Callable[[], list[str]]:
    """A module ``__dir__`` for ``package``: what it has bound and the names not yet imported."""

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __dir__
