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
is itself SIGKILLed leaves no member behind.
"""

from __future__ import annotations

import logging
import os

from ..errors import CliError
from .script import Demo

__all__ = ["run_demo"]


def run_demo(*, members: int, shards: int, records: int, rate: float) -> int:
    _local_only_environment()
    # moto answers 500 to the rare request racing another in its threads (the library retries);
    # its werkzeug logger would print every request otherwise.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    try:
        from moto.server import ThreadedMotoServer  # not a dependency of the library itself
    except ImportError:
        raise CliError(
            "the demo needs moto's server: pip install 'moto[server]>=5.1' "
            "(it comes with kinesumer[test])"
        ) from None

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        return Demo(f"http://{host}:{port}", members, shards, records, rate).run()
    finally:
        server.stop()


def _local_only_environment() -> None:
    """Fake credentials for this process and its members: the demo must never reach a real
    account, whatever profile, role or endpoint the shell has configured."""
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
