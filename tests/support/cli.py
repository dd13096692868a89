"""A ``kinesumer`` command run as a child process, as a user runs it (the CLI, outbox and
example tests)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

from support.signals import as_a_background_job, as_from_a_terminal


class Running:
    """A subprocess whose stdout lines are collected by a thread, so a test can wait for a line
    with a deadline instead of blocking on a pipe. :meth:`stop` kills it by its own pid."""

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, *, sigint_ignored: bool = False
    ) -> None:
        # The SIGINT disposition the test relies on, whatever the suite inherited: a terminal's
        # foreground command, or a script's background job (SIGINT and SIGQUIT ignored).
        launch = as_a_background_job if sigint_ignored else as_from_a_terminal
        self.proc = subprocess.Popen(
            launch(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches pytest only
        )
        self.lines: list[str] = []
        self._errors: list[bytes] = []
        self._threads = [
            threading.Thread(target=self._read_lines, daemon=True),
            threading.Thread(target=self._read_errors, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_lines(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        self._errors.append(self.proc.stderr.read())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    @property
    def errors(self) -> str:
        return b"".join(self._errors).decode(errors="replace")

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the readers drain the pipes
                if predicate():
                    return
                raise AssertionError(
                    f"exited ({self.proc.returncode}) before {what}:\n{self.output}\n{self.errors}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout}s:\n{self.output}\n{self.errors}")
            time.sleep(0.05)

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        for thread in self._threads:
            thread.join(10)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for thread in self._threads:
            thread.join(10)
