"""The three testing examples (examples/testing_*.py) pass, run by pytest as a user runs them:
in a subprocess, from outside the repository (no conftest of ours), with no endpoint variables
set. The plugin is loaded by ``-p`` (``-p no:kinesumer`` first, so that the ``pytest11`` entry
point of an installed ``kinesumer[testing]`` does not register it a second time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["testing_mock_aws", "testing_fixtures", "testing_handler"])
def test_the_testing_example_passes(name: str, tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    command = [sys.executable, "-m", "pytest", str(EXAMPLES / f"{name}.py"), "-q"]
    command += ["-p", "no:cacheprovider", "-p", "no:kinesumer", "-p", "kinesumer.testing.plugin"]
    done = subprocess.run(
        command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    assert " passed" in done.stdout and "failed" not in done.stdout
