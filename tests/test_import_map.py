"""The package's imports run one way (``scripts/import_map.py``): no circle of files, no circle
of rooms (``group/`` below ``read/``, ``observability/`` below ``aws/``...), and no library
module imports ``kinesumer.testing``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_map.py"


def import_map(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_the_library_has_no_circle_and_no_import_of_its_testing_helpers() -> None:
    done = import_map("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_room_stands_on_a_floor_above_what_it_imports() -> None:
    lines = import_map().stdout.splitlines()
    floor = {line.split()[2]: int(line.split()[1]) for line in lines if line.startswith("floor")}
    assert floor["group/"] < floor["read/"] < floor["consumer/"]
    assert floor["observability/"] < floor["aws/"] < floor["kinesis/"] < floor["group/"]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_circles_of_files_and_rooms_and_imports_of_testing(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "kinesumer/__init__.py": "",
            "kinesumer/low/__init__.py": "from .a import A\n",
            "kinesumer/low/a.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ..high.b import B\nA = 1\n",
            "kinesumer/high/__init__.py": "",
            "kinesumer/high/b.py": "from ..low import A\nB = 2\n",
            "kinesumer/testing/__init__.py": "",
            "kinesumer/testing/fake.py": "F = 3\n",
            "kinesumer/x.py": "def f():\n    from .testing.fake import F\n    return F\n",
        },
    )
    done = import_map("--check", "--root", str(tmp_path))
    assert done.returncode == 1
    assert "circle of files: kinesumer.high.b kinesumer.low.a" in done.stdout
    assert "circle of rooms: high/ low/" in done.stdout
    assert "kinesumer.x imports kinesumer.testing.fake" in done.stdout
