"""The SIGINT and SIGQUIT dispositions a test's processes start with, set by the test.

A process inherits them: run as a background job of a non-interactive shell (``cmd &`` in a
script, ``nohup``, some CI runners), the suite starts with both ignored, and so does every child
it spawns; Python then installs no KeyboardInterrupt handler, and kinesumer's own commands keep
ignoring SIGINT there (the Unix convention: a terminal's Ctrl-C is not for background jobs). A
test that interrupts a child as a user's Ctrl-C would must therefore start it as a terminal
starts a foreground command, whatever the suite inherited: :func:`as_from_a_terminal`; a test
of the background case starts it as a script's ``&`` does: :func:`as_a_background_job`. Both
wrap an argv in a tiny launcher that sets the dispositions and execs the command (an exec keeps
ignored signals ignored and resets handled ones to the default), instead of a ``preexec_fn``,
which is not safe in a parent running threads (the suite's servers and readers are threads).
In-process, :func:`sigint_raises` does the same for the test's own main thread.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator, Sequence

#: The signals a non-interactive shell ignores in its background jobs.
INTERRUPTS = (signal.SIGINT, signal.SIGQUIT)

_LAUNCHER = """\
import os, signal, sys
disposition = signal.SIG_IGN if sys.argv[1] == "ignored" else signal.SIG_DFL
for signum in (signal.SIGINT, signal.SIGQUIT):
    signal.signal(signum, disposition)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def as_from_a_terminal(argv: Sequence[str]) -> list[str]:
    """``argv`` run with SIGINT and SIGQUIT at their defaults, as a terminal's foreground
    command starts (a Python child then raises KeyboardInterrupt on SIGINT)."""
    return [sys.executable, "-c", _LAUNCHER, "default", *argv]


def as_a_background_job(argv: Sequence[str]) -> list[str]:
    """``argv`` run with SIGINT and SIGQUIT ignored, as a script's ``cmd &`` starts it."""
    return [sys.executable, "-c", _LAUNCHER, "ignored", *argv]


@contextlib.contextmanager
def sigint_raises() -> Iterator[None]:
    """While inside, SIGINT raises KeyboardInterrupt in this (main) thread, also where the suite
    started with SIGINT ignored; the previous handler is back on exit."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """While inside, SIGINT is ignored in this process, as in a background job's."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
