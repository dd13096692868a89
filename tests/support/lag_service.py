"""``kinesumer lag --serve`` run as a user runs it (a child process on a free loopback port),
and the table writes its tests need: checkpoints as members write them, client items that stay
live however slow the machine."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from kinesumer import Config
from kinesumer.models import ClientInfo, Position
from support.cli import Running
from support.group import state_store
from support.standins import find_free_port


class LagService:
    """The server as a child process (``python -m kinesumer.cli lag --serve ...``), stopped by
    its own pid. ``sigint_ignored``: started as a script's background job (``cmd &``)."""

    def __init__(self, where: list[str], *extra: str, sigint_ignored: bool = False) -> None:
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "kinesumer.cli", "lag", "--serve", *where]
        argv += ["--port", str(self.port), *extra]
        self.proc = Running(argv, sigint_ignored=sigint_ignored)
        self.proc.wait_for(lambda: "serving the lag" in self.proc.output, 60, "the server")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, path: str) -> Any:
        code, body = self.get(path)
        document = json.loads(body)
        return document if code == 200 else {"_status": code, **document}

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``signum`` and wait for the exit code (the process is killed if it outlives
        ``timeout``, and the test fails on the code)."""
        try:
            if self.proc.proc.poll() is None:
                self.proc.send_signal(signum)
            return self.proc.wait(timeout)
        finally:
            self.proc.stop()


async def checkpoint(
    config: Config, stream: str, shard_id: str, sequence_number: str, *, owner: str
) -> None:
    """A checkpoint written as a member writes it (claimed, then the position under the
    claim); the shard is left owned by ``owner``."""
    async with state_store(config) as store:
        claimed = await store.claim(stream, shard_id, owner, None)
        assert claimed is not None
        assert await store.write_checkpoint(claimed, Position(sequence_number))


async def heartbeat_ahead(config: Config, client_id: str, streams: frozenset[str]) -> None:
    """A client item stamped an hour ahead: live for the whole test on any machine."""
    async with state_store(config) as store:
        stamp = int(time.time() * 1000) + 3_600_000
        info = ClientInfo(client_id, stamp, streams, host="test-host", pid=4242)
        await store.heartbeat(info, ttl_seconds=7200)
