"""``kinesumer local-aws``, as the getting-started page has a user run it: in one shell the
command, in another ``. local-aws.env`` and then their own code (here the CLI's produce and
consume, each a process of its own with only that environment)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from support.signals import as_from_a_terminal
from support.wait import wait_until

from kinesumer import cli


def _shell_env(env_file: Path) -> dict[str, str]:
    """What ``. env_file`` sets, read by a real shell."""
    shown = subprocess.run(
        ["bash", "-c", f". {env_file} && env -0"], capture_output=True, check=True, timeout=30
    ).stdout.decode()
    return dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)


def test_local_aws_serves_a_users_own_commands_until_interrupted(tmp_path: Path) -> None:
    env_file = tmp_path / "local-aws.env"
    server = subprocess.Popen(
        # Stopped by SIGINT below, as a terminal's Ctrl-C: started as from a terminal.
        as_from_a_terminal(
            [sys.executable, "-m", "kinesumer.cli", "local-aws", "--region", "eu-west-1",
             "--stream", "orders:2", "--table", "kinesumer-state", "--env-file", str(env_file)]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: env_file.exists() or server.poll() is not None, 120, "the env file")
        assert server.poll() is None, server.communicate()
        assert env_file.stat().st_mode & 0o077 == 0  # it holds the server's keys
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= _shell_env(env_file)
        assert env["AWS_ENDPOINT_URL_KINESIS"].startswith("http://127.0.0.1:")
        lines = b"".join(b'{"n": %d}\n' % n for n in range(20))
        produced = subprocess.run(
            [sys.executable, "-m", "kinesumer.cli", "produce", "orders"],
            input=lines, env=env, capture_output=True, timeout=120,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        consumed = subprocess.run(
            [sys.executable, "-m", "kinesumer.cli", "consume", "orders", "--app", "my-app",
             "--table", "kinesumer-state", "--initial-position", "TRIM_HORIZON", "--count", "20"],
            env=env, capture_output=True, timeout=180,
        )  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr
        datas = sorted(json.loads(line)["data"] for line in consumed.stdout.splitlines())
        assert datas == sorted(f'{{"n": {n}}}' for n in range(20))
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGINT)
        out, err = server.communicate(timeout=60)
    assert server.returncode == cli.EXIT_OK, err
    assert b"export AWS_ENDPOINT_URL_KINESIS=" in out
    assert not env_file.exists()  # its keys are gone with the server


def test_the_exported_keys_are_the_only_ones_answered(tmp_path: Path) -> None:
    """The printed keys are this server's: the usual fake ones are refused."""
    env_file = tmp_path / "local-aws.env"
    server = subprocess.Popen(
        [sys.executable, "-m", "kinesumer.cli", "local-aws", "--stream", "orders",
         "--env-file", str(env_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: env_file.exists() or server.poll() is not None, 120, "the env file")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= _shell_env(env_file) | {"AWS_ACCESS_KEY_ID": "testing"}
        refused = subprocess.run(
            [sys.executable, "-m", "kinesumer.cli", "produce", "orders"],
            input=b"x\n", env=env, capture_output=True, timeout=120,
        )  # fmt: skip
        assert refused.returncode != 0
        assert b"refused" in refused.stderr or b"UnrecognizedClient" in refused.stderr
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
        server.communicate(timeout=60)
    assert server.returncode == cli.EXIT_OK
