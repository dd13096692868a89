"""A real Prometheus server (Debian's ``prometheus``) scraping given targets, for the dashboard
test: its own process on 127.0.0.1 and a free port, a generated config (every target scraped
every second), storage in a directory of the test's, stopped by its own pid.

Where the binary is missing the test skips, unless ``KINESUMER_REQUIRE_PROMETHEUS=1``
(``./scripts/test``, and so CI, which installs it through ``scripts/setup``): there it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.standins import LOOPBACK, StandInError, find_free_port

#: Seconds Prometheus may take to become ready (a second or so; a loaded machine takes longer).
STARTUP_TIMEOUT = 60.0
#: How often a start is retried when the free port was taken before Prometheus bound it.
PORT_ATTEMPTS = 3
STOP_GRACE_SECONDS = 10.0


def prometheus_binary() -> str:
    """The binary's path (``PATH``, then Debian's /usr/bin/prometheus); a skip or a failure."""
    path = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if path is None:
        message = "prometheus is not installed (scripts/setup installs it with apt-get)"
        if os.environ.get("KINESUMER_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def config_text(targets: dict[str, str]) -> str:
    """A config scraping each ``job -> host:port`` every second (JSON is valid YAML)."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in sorted(targets.items())
        ],
    }
    return json.dumps(config, indent=2)


class Prometheus:
    """One Prometheus process; :meth:`stop` ends it by its own pid (idempotent)."""

    def __init__(self, targets: dict[str, str], workdir: Path) -> None:
        binary = prometheus_binary()
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(config_text(targets))
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        for _ in range(PORT_ATTEMPTS):
            self.port = find_free_port()
            self.url = f"http://{LOOPBACK}:{self.port}"
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address={LOOPBACK}:{self.port}",
                        "--storage.tsdb.retention.time=1h",
                        "--log.level=warn",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._ready():
                return
            self.stop()
            if "address already in use" not in self.log.read_text(errors="replace"):
                break
        raise StandInError(f"prometheus did not become ready:\n{self.log.read_text()}")

    def _ready(self) -> bool:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; an AssertionError naming Prometheus's error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (``/api/v1/query``)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: a {data['resultType']}"
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets_up(self) -> dict[str, str]:
        """Job -> health (``up``, ``down``, ``unknown``) of every active target."""
        return {t["labels"]["job"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_GRACE_SECONDS)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Factory ``prometheus({job: "host:port"}) -> Prometheus``; each is stopped at teardown."""
    started: list[Prometheus] = []

    def start(targets: dict[str, str]) -> Prometheus:
        server = Prometheus(targets, tmp_path / f"prometheus-{len(started)}")
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
