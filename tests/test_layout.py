"""The layout's rules, checked on the source (AST only: nothing is imported or run).

1. Nothing in ``kinesumer/``, ``tests/``, ``benchmarks/`` or ``examples/`` imports or reads a
   ``_private`` name of another module or package. A leading underscore makes a name private to
   the module that defines it, and a ``_module`` private to the package that holds it. Fine:
   a module's own ``_names``, ``self._x`` / ``cls._x``, dunder names, and the few third-party
   privates listed, each with its reason, in :data:`ALLOWED_ATTRIBUTES` (standard library),
   :data:`ALLOWED_IN_FILE` (third-party, one file each) and :data:`ALLOWED_MODULES`.
2. Every module in ``kinesumer/`` has a docstring saying its job and holds one concept: past
   about 800 lines, look for the second one (a split names two ideas; a split made only to get
   under a number is noise).

"Own" attribute names: an ``x._name`` read is the module's own when that module defines
``_name`` itself (a function, class, class-body name, module name, or ``self._name = ...``);
objects of its own classes are then what ``x`` is. A read of another module's private attribute
is caught unless the reading module happens to define a private name spelled the same.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "kinesumer"
#: Directories checked. tests/, benchmarks/ and examples/ are run as scripts or by pytest, so
#: their files import each other as top-level modules (``from support.group import ...``).
TREES = (PACKAGE, "tests", "benchmarks", "examples")
MAX_LINES = 800

#: Private attributes of the standard library that code anywhere here may use, with the reason.
ALLOWED_ATTRIBUTES: dict[str, str] = {
    # NamedTuple's public API is underscored so it cannot clash with field names.
    "_replace": "NamedTuple API",
    "_asdict": "NamedTuple API",
    "_fields": "NamedTuple API",
    "_make": "NamedTuple API",
    # A forked or hung child must leave without running atexit handlers: os._exit is the
    # documented way (the scenario member's hang watchdog).
    "_exit": "os._exit",
    "_getframe": "sys._getframe",
    # argparse has no public name for the type add_subparsers() returns; annotations need one.
    "_SubParsersAction": "argparse's subparsers type, for annotations",
}

#: Third-party private attributes one file must use, with the reason: ``(file, name)``.
ALLOWED_IN_FILE: dict[tuple[str, str], str] = {
    # botocore offers no public way to read a client's refreshable credentials or to move their
    # expiry: the cross-account test checks that assumed-role credentials refresh themselves.
    ("tests/consumer/test_api.py", "_request_signer"): "botocore client internals",
    ("tests/consumer/test_api.py", "_credentials"): "botocore client internals",
    ("tests/consumer/test_api.py", "_expiry_time"): "botocore RefreshableCredentials internals",
    # moto's ThreadedMotoServer.stop() leaves its listening socket open; only the inner
    # server (private) can close it, or later connections hang in the backlog.
    ("tests/support/standins.py", "_server"): "moto ThreadedMotoServer internals",
    # botocore has no public setter for a session's refreshable credentials; setting
    # session._credentials is the documented-by-practice way to plug in an AssumeRole refresher.
    ("kinesumer/aws/clients.py", "_credentials"): "botocore Session internals",
}

#: Private modules outside this repository that may be imported, with the reason.
ALLOWED_MODULES: dict[str, str] = {}

#: Trees whose helper modules another tree may import: the benchmarks run the tests' stand-ins,
#: fault proxy and scenario members instead of copying them.
SHARED_HELPERS: dict[str, tuple[str, ...]] = {"benchmarks": ("tests",)}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Source:
    path: Path
    tree: str  # which of TREES it is in
    module: tuple[str, ...]  # its dotted name as it is imported ("tests" files: top-level)
    is_package: bool

    @property
    def package(self) -> tuple[str, ...]:
        return self.module if self.is_package else self.module[:-1]

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))


def sources() -> list[Source]:
    found = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if any(part.startswith(".") or part == "node_modules" for part in path.parts):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if tree != PACKAGE:
                # "tests/support/group.py" is ("tests", "support", "group")
                parts = (tree, *parts[1:])
            is_package = parts[-1] == "__init__"
            found.append(Source(path, tree, parts[:-1] if is_package else parts, is_package))
    return found


SOURCES = sources()
MODULES = {s.module: s for s in SOURCES}


def resolve(source: Source, module: str | None, level: int) -> tuple[str, ...]:
    """The dotted path an import statement names, in the terms of :data:`MODULES`."""
    names = tuple(module.split(".")) if module else ()
    if level:
        base = source.package[: len(source.package) - (level - 1)]
        return base + names
    if source.tree != PACKAGE and names:
        for tree in (source.tree, *SHARED_HELPERS.get(source.tree, ())):
            # a sibling script module or package: ``from support.group import``
            if (tree, names[0]) in MODULES:
                return (tree, *names)
    return names


def private_module_uses(source: Source, target: tuple[str, ...]) -> Iterator[str]:
    """Private components of an imported module path the importer may not reach into."""
    in_repo = target[:1] == (PACKAGE,) or target[:1] in {(t,) for t in TREES}
    for index, part in enumerate(target):
        if not is_private(part):
            continue
        if not in_repo:
            if ".".join(target[: index + 1]) not in ALLOWED_MODULES:
                yield ".".join(target)
            return
        holder = target[:index]
        shared = holder[:1] in {(t,) for t in SHARED_HELPERS.get(source.tree, ())}
        if source.module[: len(holder)] != holder and not shared:
            yield ".".join(target)
            return


def own_private_names(tree: ast.Module) -> set[str]:
    """Private names the module defines itself (so reading them is its own business)."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in {"self", "cls"}
        ):
            own.add(node.attr)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.alias) and node.asname:
            own.add(node.asname)
    return {name for name in own if is_private(name)}


def allowed(source: Source, name: str, own: set[str]) -> bool:
    return name in own or name in ALLOWED_ATTRIBUTES or (source.where, name) in ALLOWED_IN_FILE


def violations(source: Source, code: str | None = None) -> Iterator[str]:
    """What ``source`` (or ``code`` written at its place) reads of others' private names."""
    text = source.path.read_text() if code is None else code
    tree = ast.parse(text, str(source.path))
    own = own_private_names(tree)
    for node in ast.walk(tree):
        line = f"{source.where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                for bad in private_module_uses(source, tuple(alias.name.split("."))):
                    yield f"{line}: imports private module {bad}"
        elif isinstance(node, ast.ImportFrom):
            target = resolve(source, node.module, node.level)
            for bad in private_module_uses(source, target):
                yield f"{line}: imports from private module {bad}"
            for alias in node.names:
                if not is_private(alias.name):
                    continue
                submodule = (*target, alias.name)
                if submodule in MODULES:
                    for bad in private_module_uses(source, submodule):
                        yield f"{line}: imports private module {bad}"
                else:
                    yield f"{line}: imports private name {alias.name} from {'.'.join(target)}"
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                continue
            if allowed(source, node.attr, own):
                continue
            yield f"{line}: uses private attribute {ast.unparse(node)}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            name = node.args[1].value
            target_is_self = isinstance(node.args[0], ast.Name) and node.args[0].id in {
                "self",
                "cls",
            }
            if not target_is_self and not allowed(source, name, own):
                yield f"{line}: uses private attribute {name} through {node.func.id}()"


def test_the_layout_sees_every_tree() -> None:
    for tree in TREES:
        assert any(s.tree == tree for s in SOURCES), f"no sources found under {tree}/"


def test_no_module_reads_another_modules_private_names() -> None:
    found = [v for source in SOURCES for v in violations(source)]
    assert not found, "private names read across modules:\n" + "\n".join(found)


PACKAGE_SOURCES = [s for s in SOURCES if s.tree == PACKAGE]


@pytest.mark.parametrize("source", PACKAGE_SOURCES, ids=lambda s: s.where)
def test_every_library_module_says_its_job_in_a_docstring(source: Source) -> None:
    tree = ast.parse(source.path.read_text(), str(source.path))
    docstring = ast.get_docstring(tree)
    assert docstring and docstring.strip(), f"{source.where} has no module docstring"


@pytest.mark.parametrize("source", PACKAGE_SOURCES, ids=lambda s: s.where)
def test_no_library_module_grows_past_800_lines(source: Source) -> None:
    lines = len(source.path.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{source.where} has {lines} lines: past {MAX_LINES}, look for the second concept in it"
    )


# -- the checker itself: what it catches and what it lets through ----------------------------


def check(code: str, where: str = "kinesumer/group/sample.py") -> list[str]:
    path = ROOT / where
    parts = path.relative_to(ROOT).with_suffix("").parts
    tree_name = parts[0]
    if tree_name != PACKAGE:
        parts = (tree_name, *parts[1:])
    return list(violations(Source(path, tree_name, parts, False), code))


@pytest.mark.parametrize(
    "code",
    [
        "consumer._engine.close()",
        "from kinesumer.aws import _botocore_session",
        "from ..statestore.dynamodb.store import _encode",
        "import kinesumer.cli._helpers",
        "getattr(engine, '_store')",
        "from _pytest.monkeypatch import MonkeyPatch",
        "client._request_signer._credentials",  # allowed in one test file only
    ],
)
def test_the_checker_catches_reads_of_anothers_private_names(code: str) -> None:
    assert check(code), code


@pytest.mark.parametrize(
    "code",
    [
        "self._engine.close()",
        "cls._registry.clear()",
        "def _helper(): pass\nother._helper()",
        "class A:\n    def __init__(self):\n        self._x = 1\ndef f(a):\n    return a._x",
        "point._replace(x=1)",
        "os._exit(3)",
        "obj.__class__.__name__",
        "from ._version import __version__",
        "from .base import BaseKinesumer",
    ],
)
def test_the_checker_lets_own_and_allowed_names_through(code: str) -> None:
    assert check(code) == [], code


def test_a_package_may_use_its_own_private_modules() -> None:
    assert check("from ._version import __version__", "kinesumer/cli/sample.py") == []
    assert check("from .._version import __version__", "kinesumer/cli/sample.py") == []
    assert check("from support.group import Member", "tests/group/test_sample.py") == []
    assert check("from support.standins import start_kinesalite", "benchmarks/bench_x.py") == []
    assert check("from kinesumer.group import _x", "tests/test_sample.py") != []
