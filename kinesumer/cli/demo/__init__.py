"""``kinesumer demo``: the README's quick start, shown live on one machine with no AWS account.

It starts moto on 127.0.0.1, a stream and the state table, a producer of numbered records (data
``b"<n>"``) and N member processes: each one is ``kinesumer consume`` itself, so what the demo
shows is exactly what the command does. Each member's JSON lines come back over a pipe, which is
how the demo counts what every member consumed. Then it SIGKILLs one member (no handoff, no final
checkpoint), shows the others take its shards over once it stops heartbeating, starts another
member, shows the graceful rebalance, stops everyone gracefully and checks: nothing lost, and
duplicates only among what the killed member delivered but had not checkpointed yet.

Children run in their own session (Ctrl-C in the terminal reaches only the demo) and are stopped
by their own pid whatever happens; they also stop when their stdin closes, so even a demo that
is itself SIGKILLed leaves no member behind. The server answers only requests signed with its own
random keys (:mod:`kinesumer.aws.local_server`): other users of the machine cannot reach it.
"""

from __future__ import annotations

import logging
import os

from ...aws.local_server import LocalAWS, LocalAWSError
from ..errors import CliError
from .script import Demo

__all__ = ["run_demo"]


def run_demo(*, members: int, shards: int, records: int, rate: float) -> int:
    _local_only_environment()
    # moto answers 500 to the rare request racing another in its threads (the library retries);
    # its werkzeug logger would print every request otherwise.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    server = LocalAWS()
    try:
        server.start()
    except LocalAWSError as exc:
        raise CliError(f"{exc} (the demo needs it: pip install 'kinesumer[testing]')") from None
    try:
        # The members inherit these: the server answers only requests signed with its keys.
        os.environ.update(
            AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key
        )
        return Demo(server.url, members, shards, records, rate).run()
    finally:
        server.stop()


def _local_only_environment() -> None:
    """No credentials of the shell's for this process and its members: the demo must never
    reach a real account, whatever profile, role or endpoint the shell has configured (the
    local server's own keys are set once it has started)."""
    for name in list(os.environ):
        if name.startswith(("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ROLE")):
            del os.environ[name]
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_WEB_IDENTITY_TOKEN_FILE", None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="demo",
        AWS_SECRET_ACCESS_KEY="demo",
        AWS_EC2_METADATA_DISABLED="true",
    )
