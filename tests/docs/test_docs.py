"""The README and the documentation site (docs/) say what is true and lead somewhere.

- README.md stays a front door: at most 300 lines.
- Every relative link in README.md and in the site's pages resolves to a file of the repository
  (``mkdocs build --strict`` in ./scripts/test checks the site's links and anchors too; this
  also covers the README, which the site does not build).
- Every Python block marked ``<!-- runnable -->`` (on the line before its fence) runs, as a user
  would run it: a subprocess of its own, against a moto server on 127.0.0.1 holding the state
  table ``kinesumer-state`` and a two-shard stream ``orders`` of ten records in ``eu-west-1``,
  found the standard boto3 way (``AWS_ENDPOINT_URL_*``). Blocks not marked are fragments (they
  name your own functions) or need what this suite cannot give a page (a JVM for Spark, AWS):
  the examples/ programs they point to are run instead (tests/docs/test_examples.py says which).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import boto3
import pytest

from kinesumer import Config, KinesumerError, create_state_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: docs/incoming/<helper>.md is text other branches hand over; the site excludes it (mkdocs.yml).
INCOMING = DOCS / "incoming"
MAX_README_LINES = 300
RUNNABLE = "<!-- runnable -->"
REGION = "eu-west-1"
#: Markdown links and images: [text](target) with no space in target.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")


def pages() -> list[Path]:
    """README.md and the site's pages (not the hand-over texts in docs/incoming/)."""
    site = [p for p in sorted(DOCS.rglob("*.md")) if INCOMING not in p.parents]
    return [README, *site]


def prose(text: str) -> str:
    """The text outside fenced code blocks (links in code are code, not links)."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            in_code = not in_code
            continue
        if not in_code:
            kept.append(line)
    return "\n".join(kept)


def runnable_blocks(path: Path) -> list[str]:
    """The Python blocks of ``path`` whose fence follows a ``<!-- runnable -->`` line."""
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() == RUNNABLE:
            assert lines[i + 1].strip() == "```python", (
                f"{path}:{i + 1}: {RUNNABLE} not before a python fence"
            )
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            blocks.append("\n".join(lines[i + 2 : end]) + "\n")
    return blocks


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """Every Python block of ``path`` (line number, code), dedented; includes of whole files
    (``--8<--``) are left out: those files are examples/, run by their own tests."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            indent = lines[i].index("`")
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
            if "--8<--" not in code:
                blocks.append((i + 1, code))
            i = end
        i += 1
    return blocks


BLOCKS = [
    pytest.param(code, id=f"{path.relative_to(ROOT)}-{n}")
    for path in pages()
    for n, code in enumerate(runnable_blocks(path), start=1)
]


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most 300)"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page (mkdocs --strict checks those)
        path = unquote(target.split("#", 1)[0])
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


#: A file of the repository named in the text: ``tests/x.py`` (with ``::test_name``), ``examples/``,
#: ``benchmarks/``, ``scripts/``, ``infra/``, ``kinesumer/`` paths.
NAMED_FILE = re.compile(
    r"`((?:tests|examples|benchmarks|scripts|infra|kinesumer)/[\w./-]*\w)(?:::(\w+))?`"
)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_and_test_named_exists(page: Path) -> None:
    """A page that names ``tests/test_x.py::test_y`` or ``examples/x.py`` names something real:
    a renamed test or example fails here instead of leaving the docs pointing nowhere."""
    missing = []
    for name, test in NAMED_FILE.findall(page.read_text()):
        path = ROOT / name
        if "*" in name or "<" in name:
            continue
        if not path.exists():
            missing.append(name)
        elif test and not re.search(rf"def {test}\(", path.read_text()):
            missing.append(f"{name}::{test}")
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_is_python(page: Path) -> None:
    """Blocks that are not run (fragments naming your own functions, Spark) still parse: a typo
    or a half-edited call fails here. Top-level ``await`` is allowed (asyncio fragments)."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    for line, code in python_blocks(page):
        try:
            compile(code, f"{page.relative_to(ROOT)}:{line}", "exec", flags=flags)
        except SyntaxError as error:
            pytest.fail(f"{page.relative_to(ROOT)}:{line}: not Python: {error}")


def test_the_measured_page_is_what_the_benchmark_suite_wrote() -> None:
    """docs/measured.md's tables are benchmarks/results/results.json rendered by the suite's own
    report (naming the command, --quick included): never edited by hand, never stale."""
    results = json.loads((ROOT / "benchmarks" / "results" / "results.json").read_text())
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the report imports its sibling modules
    try:
        tables = importlib.import_module("_report").tables(results)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    body = f"{tables}\n![benchmarks](img/benchmarks-summary.png)\n"
    expected = f"<!-- benchmarks:begin -->\n{body}\n<!-- benchmarks:end -->"
    assert expected in (DOCS / "measured.md").read_text(), (
        "docs/measured.md differs from benchmarks/results/results.json: re-render it with "
        "`.venv/bin/python benchmarks/run.py --from-json benchmarks/results/results.json`"
    )


def test_every_config_field_is_on_the_configuration_page() -> None:
    """A field added to Config without a row (its default, and why) fails here."""
    page = (DOCS / "operating" / "configuration.md").read_text()
    missing = [f.name for f in dataclasses.fields(Config) if f"`{f.name}`" not in page]
    assert not missing, f"docs/operating/configuration.md has no row for {missing}"


def test_every_prometheus_metric_is_documented() -> None:
    """Every metric kinesumer declares (kinesumer/observability/metric_families.py, and metrics.py
    which records into them) is named on a page (Metrics and logs, or the page of what it
    counts), as Prometheus exposes it (counters with ``_total``)."""
    source = "\n".join(
        (ROOT / "kinesumer" / "observability" / name).read_text()
        for name in ("metrics.py", "metric_families.py")
    )
    declared = set(re.findall(r'"(kinesumer_[a-z_]+)"', source))
    site = "\n".join(page.read_text() for page in pages())
    missing = sorted(name for name in declared if not re.search(rf"\b{name}(_total)?\b", site))
    assert declared and not missing, f"no page names the metrics {missing}"


def test_every_command_is_on_the_command_line_page() -> None:
    from kinesumer.cli.parser import build_parser

    # The commands as `kinesumer --help` lists them (four spaces in, under COMMAND).
    usage = build_parser().format_help()
    commands = re.findall(r"(?m)^    ([a-z][a-z-]+)\b", usage.split("COMMAND\n", 1)[1])
    assert "consume" in commands and "produce" in commands, usage
    page = (DOCS / "operating" / "cli.md").read_text()
    missing = sorted(name for name in commands if f"kinesumer {name}" not in page)
    assert not missing, f"docs/operating/cli.md shows no `kinesumer {missing}` line"


#: The public modules whose exceptions a user meets (the API reference's).
ERROR_MODULES = (
    "kinesumer",
    "kinesumer.errors",
    "kinesumer.sinks",
    "kinesumer.spark",
    "kinesumer.testing",
    "kinesumer.handlers.deadletter",
)


def test_every_public_error_is_in_the_drawn_tree() -> None:
    """docs/operating/errors.md draws the KinesumerError tree: every public subclass is in it."""
    tree = (DOCS / "operating" / "errors.md").read_text()
    public = set()
    for name in ERROR_MODULES:
        module = importlib.import_module(name)
        for attribute in getattr(module, "__all__", dir(module)):
            value = getattr(module, attribute, None)
            if isinstance(value, type) and issubclass(value, KinesumerError):
                public.add(value.__name__)
    missing = sorted(name for name in public if name not in tree)
    assert not missing, f"docs/operating/errors.md does not draw {missing}"


def test_the_front_door_and_the_first_steps_have_runnable_blocks() -> None:
    """The markers cannot vanish silently: the README's and Getting started's first examples
    (blocking, asyncio, a handler or a producer) stay runnable."""
    assert len(runnable_blocks(README)) >= 3
    assert len(runnable_blocks(DOCS / "getting-started.md")) >= 4


@pytest.mark.parametrize("code", BLOCKS)
def test_a_runnable_block_runs(code: str, moto_url: str, tmp_path: Path) -> None:
    create_state_table(
        Config(
            app="docs", dynamodb_table="kinesumer-state", region=REGION, dynamodb_endpoint=moto_url
        )
    )
    kinesis = boto3.client("kinesis", endpoint_url=moto_url, region_name=REGION)
    kinesis.create_stream(StreamName="orders", ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(
        StreamName="orders", WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    records = [{"Data": b'{"id": %d}' % i, "PartitionKey": f"order-{i}"} for i in range(10)]
    kinesis.put_records(StreamName="orders", Records=records)
    script = tmp_path / "block.py"
    script.write_text(code)
    environ = {
        **os.environ,  # the fake credentials of conftest's session fixture
        "AWS_ENDPOINT_URL_KINESIS": moto_url,
        "AWS_ENDPOINT_URL_DYNAMODB": moto_url,
        "AWS_DEFAULT_REGION": REGION,
    }
    done = subprocess.run(
        [sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{code}\n{done.stdout}\n{done.stderr}"
