"""What importing a part of kinesumer imports (kinesumer.lazy_imports): a package's re-exported
names are bound on first use, so a process that needs one module does not import the engine,
the consumers, the producer or boto3 through the packages above it.

Who depends on it: every Spark worker (it imports the source's modules), the command line at
every start, and every pytest session where kinesumer is installed (the ``pytest11`` plugin).
Imports are checked in a fresh interpreter (this one has imported everything already); the
declarations of each lazy package (``__all__``, the ``TYPE_CHECKING`` imports that mypy and the
API reference read, the name -> module mapping used at run time) are checked against each other
on the source.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The packages whose re-exports are bound on first use.
LAZY_PACKAGES = [
    "kinesumer",
    "kinesumer.aws",
    "kinesumer.spark",
    "kinesumer.spark.source",
    "kinesumer.testing",
]

#: Modules that none of the light imports below may bring: the engine, the faces, boto3.
HEAVY = (
    "kinesumer.read.engine",
    "kinesumer.consumer",
    "kinesumer.handlers",
    "kinesumer.producer",
    "kinesumer.admin",
    "kinesumer.spark.driver",
    "kinesumer.spark.source.driver.planner",
)


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(done.stdout.split())


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(HEAVY))


def test_importing_the_package_imports_only_the_errors() -> None:
    loaded = modules_after("import kinesumer")
    assert sorted(m for m in loaded if m.startswith("kinesumer")) == [
        "kinesumer",
        "kinesumer._version",
        "kinesumer.errors",
        "kinesumer.lazy_imports",
    ]
    assert not {"boto3", "aioboto3", "botocore"} & loaded


def test_the_pytest_plugin_imports_no_engine_config_or_boto3_until_a_fixture_runs() -> None:
    loaded = modules_after("import kinesumer.testing.plugin")
    assert heavy_in(loaded) == []
    assert "kinesumer.config" not in loaded
    assert not {"boto3", "aioboto3", "botocore", "moto"} & loaded


def test_a_spark_read_task_imports_no_engine_consumer_producer_or_planner() -> None:
    # What a worker unpickles (the reader and a partition) and what its read task runs.
    loaded = modules_after(
        "import kinesumer.spark.source.datasource, kinesumer.spark.source.partition\n"
        "import kinesumer.spark.source.executor.read"
    )
    assert heavy_in(loaded) == ["kinesumer.spark.source.driver.planner"]  # datasource's driver side
    loaded = modules_after("import kinesumer.spark.source.executor.read")
    assert heavy_in(loaded) == []


def test_the_command_lines_parser_imports_no_aws_client_consumer_or_producer() -> None:
    # What ``kinesumer --help`` (and every command, before it runs) costs.
    loaded = modules_after("import kinesumer.cli\nkinesumer.cli.build_parser()")
    assert heavy_in(loaded) == []
    assert not {"boto3", "aioboto3", "aiobotocore"} & loaded


def test_using_a_name_imports_its_module() -> None:
    loaded = modules_after("from kinesumer import Kinesumer")
    assert "kinesumer.consumer.sync" in loaded


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_listed_name_resolves_to_its_modules_object_and_is_listed_by_dir(
    package: str,
) -> None:
    module = importlib.import_module(package)
    for name, source in declared_sources(package).items():
        value = getattr(module, name)
        assert value is getattr(importlib.import_module(source, package), name), name
    assert set(module.__all__) <= set(dir(module))


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_an_unknown_name_raises_the_usual_attribute_error(package: str) -> None:
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match=f"^module '{package}' has no attribute 'nope'$"):
        module.nope  # noqa: B018
    with pytest.raises(ImportError):
        exec(f"from {package} import nope", {})


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_the_type_checking_imports_match_the_run_time_mapping_and_all(package: str) -> None:
    tree = ast.parse(source_path(package).read_text())
    mapping = lazy_names(tree)
    assert declared_sources(package) == mapping
    eager = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level and node.module
        for alias in node.names
    }
    module = importlib.import_module(package)
    assert set(module.__all__) == set(mapping) | (eager & set(module.__all__))
    assert not set(mapping) & eager, "a name both eager and lazy"


def source_path(package: str) -> Path:
    return ROOT.joinpath(*package.split("."), "__init__.py")


def lazy_names(tree: ast.Module) -> dict[str, str]:
    """The package's name -> module mapping, read from its source."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_LAZY_NAMES":
            value = ast.literal_eval(node.value)
            assert isinstance(value, dict)
            return value
    raise AssertionError("no _LAZY_NAMES mapping")


def declared_sources(package: str) -> dict[str, str]:
    """Each name imported under ``if TYPE_CHECKING:`` with the (relative) module it is from."""
    found: dict[str, str] = {}
    for node in ast.parse(source_path(package).read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                module = "." * statement.level + (statement.module or "")
                found.update({alias.name: module for alias in statement.names})
    return found
