"""The ``kinesumer`` command: consume a stream as a group member, look at a group, move its
checkpoints, create the state table, and run a self-contained demo.

Design choices:

- argparse only, plain text output: the command must work wherever the library installs, and its
  output must survive pipes, ``grep`` and CI logs (the demo alone redraws in place, and only on a
  terminal).
- Every failure the user can fix prints one line saying what to do, with a documented exit code
  (:data:`EXIT_CODES`); tracebacks only with ``--debug``.
- Reads and writes of the state table go through the library's own state store, its item codecs
  and conditions, so the command line sees items exactly as the consumers write them; checkpoint
  moves are conditional writes on the lease that was read, like every write the consumers make.

Modules: :mod:`.parser` (the arguments), :mod:`.options` (their values), :mod:`.errors` (exit
codes, messages), one per command (:mod:`.consume`, :mod:`.status` with :mod:`.view` and
:mod:`.render`, :mod:`.checkpoints`, :mod:`.create_table`) and :mod:`.demo`. This module only
dispatches.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from ..signals import interrupt_on_sigterm
from .errors import (
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    describe_error,
)
from .parser import build_parser

__all__ = [
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "CliError",
    "build_parser",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="kinesumer: %(levelname)s %(name)s: %(message)s",
    )
    if not args.debug:
        # The CLI's reads retry like the library's; one warning per retry is noise here.
        logging.getLogger("kinesumer.aws").setLevel(logging.ERROR)
    # SIGTERM interrupts as Ctrl-C does (commands that stop gracefully install their own). A
    # SIGINT ignored from the start stays ignored: the shell ignores it in a background job (a
    # script's `cmd &`, nohup) so that a Ctrl-C in the terminal does not stop it; `kill` does.
    with interrupt_on_sigterm():
        try:
            handler: Callable[[argparse.Namespace], int] = args.handler
            return handler(args)
        except CliError as exc:
            _fail(args, str(exc))
            return exc.code
        except KeyboardInterrupt:
            _fail(args, "interrupted")
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_OK
        except Exception as exc:
            message, code = describe_error(exc, args)
            if message is None:
                raise
            _fail(args, message)
            return code


def _fail(args: argparse.Namespace, message: str) -> None:
    if args.debug:
        traceback.print_exc()
    print(f"kinesumer: {message}", file=sys.stderr)


def _silence_stdout() -> None:
    """The reader of our output went away: drop what is left instead of a second error at exit."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
