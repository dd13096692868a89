"""``kinesumer produce STREAM``: stdin lines to records, a summary, exit 1 when a line was not
written (the CLI test style of ``test_cli.py``: ``cli.main`` in process, stdin replaced)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream
from support.produced import by_key, read_all
from support.standins import NodeStandIn

from kinesumer import cli


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: bytes, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_produce_puts_json_lines_keyed_by_a_field_in_order(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = unique_name("cli")
    create_stream(kinesalite.url, stream, 2)
    lines = [json.dumps({"user": f"u{i % 7}", "n": i}) for i in range(300)]
    stdin = ("\n".join(lines) + "\n").encode()
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesalite.url]
    code, _, err = run(monkeypatch, capsys, stdin, "produce", stream, *where, "--key-field", "user")
    assert code == 0, err
    assert "300 line(s) written" in err
    records = read_all(kinesalite.url, stream)
    assert sorted(r.data for r in records) == sorted(line.encode() for line in lines)
    for key, datas in by_key(records).items():
        numbers = [json.loads(d)["n"] for d in datas]
        assert numbers == sorted(numbers) and all(n % 7 == int(key[1:]) for n in numbers)


def test_produce_exits_1_and_counts_what_was_not_written(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = unique_name("cli")
    create_stream(kinesalite.url, stream, 1)
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesalite.url]
    stdin = b'{"id": 1}\nnot json\n{"other": 2}\n{"id": "x"}\n'
    code, _, err = run(monkeypatch, capsys, stdin, "produce", stream, *where, "--key-field", "id")
    assert code == 1
    assert "line 2 not written: not a JSON line" in err
    assert "line 3 not written: no field 'id'" in err
    assert "2 line(s) written" in err and "2 NOT written (KinesumerError: 2)" in err
    assert sorted(r.partition_key for r in read_all(kinesalite.url, stream)) == ["1", "x"]

    missing = unique_name("missing")
    code, _, err = run(monkeypatch, capsys, b"a\nb\n", "produce", missing, *where)
    assert code == 1
    assert "does not exist" in err and "2 NOT written (StreamNotFoundError: 2)" in err


def test_produce_puts_plain_lines_each_once_and_a_keys_lines_in_order(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Lines that are not JSON, no ``--key-field``: keyed by line number (spread over the
    shards), or all by ``--key`` (one key: its lines land in stdin order, though a fifth of the
    entries of each call are refused and sent again)."""
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesalite.url]
    lines = [f"line {i}: plain text, {{not json".encode() for i in range(1, 251)]
    # CRLF and LF endings; a blank line is skipped but still numbered.
    stdin = b"\r\n".join(lines[:100]) + b"\r\n\n" + b"\n".join(lines[100:])

    spread = unique_name("cli")
    create_stream(kinesalite.url, spread, 3)
    code, _, err = run(monkeypatch, capsys, stdin, "produce", spread, *where)
    assert code == 0, err
    assert "250 line(s) written" in err
    records = read_all(kinesalite.url, spread)
    assert sorted(r.data for r in records) == sorted(lines)  # every line once, endings cut
    numbers = [n if n <= 100 else n + 1 for n in range(1, 251)]  # the blank line is 101
    assert {r.data: r.partition_key for r in records} == dict(
        zip(lines, map(str, numbers), strict=True)
    )
    assert len({r.shard_id for r in records}) == 3

    keyed = unique_name("cli")
    create_stream(kinesalite.url, keyed, 2)
    proxy = fault_proxy(kinesalite.url)
    proxy.add_rule(Fault.refuse_entries(0.2), service="kinesis", operation="PutRecords", seed=5)
    refused = ["--region", "us-east-1", "--kinesis-endpoint", proxy.url, "--key", "one"]
    code, _, err = run(monkeypatch, capsys, stdin, "produce", keyed, *refused)
    assert code == 0, err
    assert "250 line(s) written" in err
    assert by_key(read_all(kinesalite.url, keyed)) == {"one": lines}


def test_produce_a_line_nested_too_deeply_fails_that_line_only(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hostile line (nested past the JSON parser's recursion limit) is one failed line, and
    the lines around it are written."""
    stream = unique_name("cli")
    create_stream(kinesalite.url, stream, 1)
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesalite.url]
    deep = b"[" * 200_000 + b"]" * 200_000
    deep_key = b'{"id": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    stdin = b'{"id": 1}\n' + deep + b"\n" + deep_key + b'\n{"id": 2}\n'
    code, _, err = run(monkeypatch, capsys, stdin, "produce", stream, *where, "--key-field", "id")
    assert code == 1
    assert "line 2 not written: a JSON line nested too deeply to parse" in err
    assert "line 3 not written: a JSON line nested too deeply to parse" in err
    assert "2 line(s) written" in err and "2 NOT written (KinesumerError: 2)" in err
    assert sorted(r.partition_key for r in read_all(kinesalite.url, stream)) == ["1", "2"]
