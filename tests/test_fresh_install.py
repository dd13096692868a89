"""A new user's first test, with no setup beyond ``pip install "kinesumer[testing]"``: a fresh
virtual environment, the package installed from this checkout as a user installs it (a built
wheel, not an editable install, with the versions CI pins), and the three testing examples run
by that environment's pytest from outside the repository, the plugin found through its
``pytest11`` entry point alone (no ``-p``, no conftest).

It builds a venv and installs boto3, aiobotocore and moto into it (about a minute with pip's
cache warm), so it runs where ``KINESUMER_FRESH_INSTALL=1`` (``./scripts/test``, the README's
test command, and so CI, set it) and is skipped under a bare ``pytest``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("testing_mock_aws.py", "testing_fixtures.py", "testing_handler.py")

pytestmark = pytest.mark.skipif(
    os.environ.get("KINESUMER_FRESH_INSTALL") != "1",
    reason="builds a venv and installs the package: KINESUMER_FRESH_INSTALL=1 (./scripts/test)",
)


@pytest.mark.slow
def test_the_testing_examples_pass_after_a_plain_install(tmp_path: Path) -> None:
    """A new user's install, end to end: a fresh venv, the wheel built from a copy of the tree,
    ``kinesumer[testing]`` installed into it, and the testing examples run there. A scenario
    whose length (about 45 s) is the install itself: pip resolving and installing the extras."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    source = tmp_path / "src"  # a copy: building a wheel writes build/ and *.egg-info
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "node_modules", "site", "build", "*.egg-info", "__pycache__"
        ),
    )
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    install += ["-c", str(ROOT / "constraints.txt"), f"{source}[testing]"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The user's environment: nothing of this checkout's (a PYTHONPATH would shadow the install).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))}
    where = subprocess.run(
        [str(python), "-c", "import kinesumer; print(kinesumer.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(env_dir)), where.stdout  # installed, not this checkout

    users_tests = tmp_path / "users_project"
    users_tests.mkdir()
    for name in EXAMPLES:
        shutil.copy(ROOT / "examples" / name, users_tests / f"test_{name}")
    ran = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=users_tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert " passed" in ran.stdout and "skipped" not in ran.stdout, ran.stdout[-2000:]
