"""Signal handling for programs built on kinesumer: one place that installs and restores handlers.

A consumer stopped by Ctrl-C or SIGTERM should close gracefully (finish the record in hand,
write its checkpoints, hand its shards over), and a second signal should still get the user out
at once. :func:`stop_on_signals` does exactly that and nothing more::

    stop = threading.Event()
    with stop_on_signals(lambda name: stop.set()):
        while not stop.is_set():
            ...  # poll, process
    # the previous handlers are back here

Rules shared by every helper here:

- Handlers are installed only in the main thread (Python allows nothing else); elsewhere the
  helpers do nothing, so library code may call them from any thread.
- On exit the handlers that were installed before are put back, exactly (the same objects).
- A SIGINT ignored when a helper is entered stays ignored: a background job of a
  non-interactive shell (``cmd &`` in a script, ``nohup``, some CI runners) starts with SIGINT
  ignored so that the terminal's Ctrl-C is not for it (Python installs no KeyboardInterrupt
  handler then, and neither do these helpers); SIGTERM (``kill``) stops such a process.
- A signal handler runs between two bytecodes of the main thread: the stop callback must be
  short and must not block (setting an ``Event`` or a flag is the intended use).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

__all__ = ["interrupt_on_sigterm", "signals_ignored", "stop_on_signals"]

#: The signals that ask a program to stop: Ctrl-C and the polite kill.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any]


@contextlib.contextmanager
def stop_on_signals(on_stop: Callable[[str], None]) -> Iterator[None]:
    """While inside, the first SIGINT or SIGTERM calls ``on_stop(name)`` (``name``:
    ``"SIGINT"`` or ``"SIGTERM"``) and nothing else: the program stops when it is ready to. A
    second one (of either kind) raises ``KeyboardInterrupt``: stop now, without the graceful
    part. The previous handlers are restored on exit. A SIGINT ignored on entry (a background
    job) stays ignored. Outside the main thread: does nothing.
    """
    stopping = False

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            raise KeyboardInterrupt
        stopping = True
        on_stop(signal.Signals(signum).name)

    with _installed(dict.fromkeys(_not_ignored_by_convention(STOP_SIGNALS), handle)):
        yield


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does, so one ``except
    KeyboardInterrupt`` (and every ``finally``) serves both. Outside the main thread: nothing."""

    def handle(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    with _installed({signal.SIGTERM: handle}):
        yield


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM are ignored: for cleanup that must not be cut short
    (stopping child processes). Outside the main thread: nothing."""
    with _installed(dict.fromkeys(STOP_SIGNALS, signal.SIG_IGN)):
        yield


def _not_ignored_by_convention(signums: tuple[signal.Signals, ...]) -> list[signal.Signals]:
    """``signums`` less a SIGINT that is ignored now. The ignored SIGINT of a background job is
    the shell's decision (the terminal's Ctrl-C is for the foreground job), as Python and the JVM
    respect it; an ignored SIGTERM is nobody's convention and is replaced."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    return [signum for signum in signums if not (signum == signal.SIGINT and ignored)]


@contextlib.contextmanager
def _installed(handlers: Mapping[signal.Signals, Handler | signal.Handlers]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum, handler in handlers.items():
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler not installed from Python; the default is the closest we can do.
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
