"""The defaults a security review expects: the metrics endpoint on loopback, plain-HTTP
endpoints refused off this machine (Config, the command line, the Spark source), role sessions
named after the member for CloudTrail, state-table strings escaped before they reach a terminal,
and partition keys kept out of log lines unless asked for."""

from __future__ import annotations

import ast
import json
import logging
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from support.group import create_stream, kinesis_in_account_of, make_config, put, setup_table

from kinesumer import Config, ConfigError, Kinesumer, cli
from kinesumer.aws.clients import ClientFactory, role_session_name
from kinesumer.cli.options import group_config
from kinesumer.cli.parser import build_parser
from kinesumer.handlers.policies import PARTITION_KEYS_LOGGER, HandlerFailedError, describe
from kinesumer.models import ClientInfo, Record
from kinesumer.observability.metrics import metrics_for
from kinesumer.spark.source.options import parse_options
from kinesumer.statestore.dynamodb import client_item

BASE = {"app": "orders-etl", "dynamodb_table": "kinesumer-state"}
ROLE = "arn:aws:iam::210987654321:role/stream-reader"


# --- the metrics endpoint ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as in /proc/net/tcp) of the IPv4 sockets listening on ``port``:
    read off the kernel's own table, so nothing is sent to any address but loopback."""
    found = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            local, _remote, state = line.split()[1:4]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def test_metrics_endpoint_listens_on_loopback_only_by_default() -> None:
    pytest.importorskip("prometheus_client")
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp here to read the listening address from")
    port = free_port()
    metrics_for(Config(**BASE, metrics_port=port), "m1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0 (00000000)


# --- plain-HTTP endpoints ---------------------------------------------------------------------


def test_command_line_refuses_plain_http_to_another_machine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = ["--app", "a", "--table", "tbl", "--region", "us-east-1"]
    code = cli.main(["status", *where, "--dynamodb-endpoint", "http://10.0.0.7:8000"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--dynamodb-endpoint" in err and "allow_insecure_endpoints" in err
    insecure = ["--dynamodb-endpoint", "http://10.0.0.7:8000", "--allow-insecure-endpoints"]
    args = build_parser().parse_args(["status", *where, *insecure])
    config = group_config(args)
    assert config.allow_insecure_endpoints and config.dynamodb_endpoint == "http://10.0.0.7:8000"


@pytest.mark.parametrize("field", ["kinesis_endpoint", "dynamodb_endpoint", "sts_endpoint"])
def test_spark_source_options_refuse_plain_http_to_another_machine(field: str) -> None:
    options = {**BASE, "streams": "orders", field: "http://stand-in:4566"}
    with pytest.raises(ConfigError) as info:
        parse_options(options)
    assert info.value.field == field
    allowed = parse_options({**options, "allow_insecure_endpoints": "true"})
    assert getattr(allowed.config, field) == "http://stand-in:4566"
    assert getattr(parse_options({**options, field: "http://127.0.0.1:4566"}).config, field)


# --- role sessions named after the member -----------------------------------------------------


def assumed_sessions(url: str) -> list[str]:
    """Session names of every AssumeRole moto answered (its /moto-api/data.json)."""
    with urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=10) as response:
        data = json.load(response)
    return [r["session_name"] for r in data.get("sts", {}).get("AssumedRole", [])]


def test_role_session_name_is_the_client_id_within_sts_limits() -> None:
    config = Config(**BASE, role_arn=ROLE)
    assert role_session_name(config, "ip-10-0-0-7-4242-a1b2c3") == "ip-10-0-0-7-4242-a1b2c3"
    assert role_session_name(config.replace(client_id="fixed-id")) == "fixed-id"
    generated = role_session_name(config)  # no member: app, host and pid
    assert generated.startswith("orders-etl-") and generated.endswith(f"-{os.getpid()}")
    long_a, long_b = "m" * 70 + "-a", "m" * 70 + "-b"
    names = {role_session_name(config, long_a), role_session_name(config, long_b)}
    assert len(names) == 2 and all(len(n) == 64 for n in names)
    assert role_session_name(config, "host with spaces/é") == "host-with-spaces--"
    assert len(role_session_name(config, "x")) >= 2


def test_assumed_role_sessions_name_the_member(moto_url: str, unique_name: Any) -> None:
    """CloudTrail shows ``assumed-role/<role>/<session>``: each member's Kinesis calls, and the
    dead letters its handlers write, carry its client id."""
    table, stream = unique_name("state"), unique_name("s")
    config = make_config(moto_url, moto_url, unique_name("app"), table)
    setup_table(config)
    other = kinesis_in_account_of(moto_url, ROLE)
    other.create_stream(StreamName=stream, ShardCount=1)
    config = config.replace(role_arn=ROLE, external_id="ext-1234", sts_endpoint=moto_url)
    for client_id in ("member-7", None):
        other.put_record(StreamName=stream, Data=b"x", PartitionKey="k")  # one for each run
        with Kinesumer(config.replace(client_id=client_id)) as consumer:
            for _record in consumer.consume([stream]):
                break
            member = consumer.stats().client_id
        assert member in assumed_sessions(moto_url), (member, assumed_sessions(moto_url))
    assert member != "member-7" and member.count("-") >= 2  # the generated <host>-<pid>-<random>
    ClientFactory(config, client_id="writer-3").sync_kinesis(attempts=1).put_record(
        StreamName=stream, Data=b"dead", PartitionKey="k"
    )
    assert "writer-3" in assumed_sessions(moto_url)


# --- kinesumer status: strings from the table never drive the terminal ------------------------

HOSTILE_HOST = "evil\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202etxt\rX"


@pytest.fixture
def hostile_member(moto_url: str, unique_name: Any) -> Iterator[dict[str, Any]]:
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("s")
    config = make_config(moto_url, moto_url, app, table)
    setup_table(config)
    create_stream(moto_url, stream, 1)
    put(moto_url, stream, 0, 1)
    client = ClientInfo(
        "m-\x1b[8mhidden",
        int(time.time() * 1000),
        frozenset([stream, "s\x1b[1A"]),
        host=HOSTILE_HOST,
        pid=7,
    )
    boto3.client("dynamodb", endpoint_url=moto_url, region_name="us-east-1").put_item(
        TableName=table, Item=client_item(app, client, 3600)
    )
    where = ["--app", app, "--table", table, "--region", "us-east-1"]
    yield {"where": [*where, "--dynamodb-endpoint", moto_url]}


def test_status_escapes_terminal_controls_from_state_items(
    hostile_member: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["status", *hostile_member["where"]])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not any(ch in out for ch in "\x1b\x07\r\u202e"), repr(out)
    assert "evil\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\u202etxt\\x0dX/7" in out
    assert "m-\\x1b[8mhidden" in out and "s\\x1b[1A" in out
    code = cli.main(["status", "--json", *hostile_member["where"]])
    document = json.loads(capsys.readouterr().out)
    assert document["members"][0]["host"] == HOSTILE_HOST  # JSON escapes it by itself


# --- partition keys in logs -------------------------------------------------------------------


@pytest.fixture
def keys_logger_level() -> Iterator[None]:
    saved = PARTITION_KEYS_LOGGER.level
    yield
    PARTITION_KEYS_LOGGER.setLevel(saved)


def test_partition_keys_stay_out_of_messages_unless_asked(keys_logger_level: None) -> None:
    record = Record("orders", "shardId-000000000001", "4959", 3, "alice@example.com", b"{}", None)
    logging.getLogger().setLevel(logging.DEBUG)  # a DEBUG root alone is not the switch
    try:
        assert describe(record) == "orders/shardId-000000000001/4959#3"
        error = HandlerFailedError(ValueError("bad"), record, "h")
        assert "alice" not in str(error) and "4959#3" in str(error)
    finally:
        logging.getLogger().setLevel(logging.WARNING)
    PARTITION_KEYS_LOGGER.setLevel(logging.DEBUG)
    assert describe(record).endswith("(key 'alice@example.com')")


# --- nothing in the library evaluates, unpickles or shells out -----------------------------------

FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "yaml", "cloudpickle"}
FORBIDDEN_ATTRIBUTES = {("os", "system"), ("os", "popen"), ("os", "execv"), ("os", "execvp")}
#: Where a subprocess is started, and why it is safe: the demo runs its own members
#: (``sys.executable -m kinesumer ...``, an argument list, never a shell).
SUBPROCESS_ALLOWED = ("kinesumer/cli/demo/",)


def risky(source: str, where: str) -> list[str]:
    """Calls of eval/exec, unpickling or YAML imports, shells and subprocesses in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            found.append(f"{where}:{node.lineno} {node.func.id}()")
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg == "shell" and not (
                    isinstance(value, ast.Constant) and value.value is False
                ):
                    found.append(f"{where}:{node.lineno} shell=")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names.append(getattr(node, "module", None) or "")
            for name in names:
                top = name.split(".")[0]
                if top in FORBIDDEN_MODULES:
                    found.append(f"{where}:{node.lineno} import {name}")
                if top == "subprocess" and not where.startswith(SUBPROCESS_ALLOWED):
                    found.append(f"{where}:{node.lineno} import subprocess")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in FORBIDDEN_ATTRIBUTES
        ):
            found.append(f"{where}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_the_scan_sees_what_it_looks_for() -> None:
    bad = (
        "import pickle\nfrom yaml import load\nimport subprocess\n"
        "eval('1')\nos.system('ls')\nrun(['x'], shell=True)\n"
    )
    assert len(risky(bad, "kinesumer/x.py")) == 6
    assert risky("import subprocess\nPopen(['a'], shell=False)\n", "kinesumer/cli/demo/x.py") == []


def test_no_eval_pickle_or_shell_in_the_library() -> None:
    root = Path(__file__).resolve().parent.parent
    found = [
        problem
        for path in sorted((root / "kinesumer").rglob("*.py"))
        for problem in risky(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix())
    ]
    assert not found, found
